"""The scheduler: queues, engine slots, segments, and the policy's command surface.

Single-threaded and IO-free: engines report progress through the
:class:`~pdsr_sdk.dispatch.protocols.EngineListener` methods, the policy is
called on events and answers with :class:`DispatchContext` commands, and time
comes from a clock. The same object runs real vLLM engines (on an asyncio
loop) and simulated ones (on a virtual clock).

A sample's life: queued (on a pool's or an engine's queue) -> running (one
segment on one engine) -> at the segment's end it finishes, continues on the
same engine, or goes back to a queue (moved, stolen back, or its engine died).

``pause(mode)`` stops launches until ``resume()`` (a trainer updating weights mid-step): ``abort``
aborts every running segment and holds its sample, tokens kept, to continue at resume; ``wait`` lets
running samples go on; ``keep`` leaves running requests where they are (the engine freezes them).

A multi-turn sample (``sample.turns`` set; an agent runs it) does not finish when a turn ends: it is
parked, holding no slot, and ``on_turn_end(sample, reason)`` tells its owner, who later either calls
:meth:`Scheduler.continue_turn` with what the environment added (the next turn queues first on the engine
that holds its prefix, unless the policy moved it meanwhile) or :meth:`Scheduler.finish` to end it. The policy
hears both (``on_turn_parked``, ``on_next_turn``: there it may still move the next turn). With
``hold_turn_slots`` (a reference for the simulator: what a framework that keeps the request through its
environment's wait takes) the parked sample keeps its slot until its next turn runs there.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

from pdsr_sdk.dispatch.policy import Policy
from pdsr_sdk.dispatch.protocols import Clock, Dispatcher, Engine
from pdsr_sdk.dispatch.segments import next_segment_len
from pdsr_sdk.dispatch.types import (
    ABORT, DROPPED, LENGTH, STOP, TRUNCATED, Group, Sample, SegmentRecord, SegmentRequest, StreamSpec, TurnRecord,
    oldest_version,
)
from pdsr_sdk.errors import EngineError, PdsrError

if TYPE_CHECKING:
    from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig


#: how :meth:`Scheduler.pause` treats running samples
PAUSE_MODES = ("abort", "wait", "keep")


@dataclass(eq=False, slots=True)
class _Run:
    """One submitted segment of one sample."""

    request_id: str
    sample: Sample
    engine: Engine
    #: what to do when an abort we issued comes back: ("queue", pool, engine, cap, restart), ("finish", reason)
    #: or ("pause",) (hold it until the scheduler resumes)
    intent: tuple[Any, ...] | None = None
    stolen_from: str | None = None


@dataclass
class EngineUsage:
    """Per-engine counters for the run summary."""

    busy_s: float = 0.0
    busy_since: float | None = None
    segments: int = 0
    tokens: int = 0
    dead: bool = False


@dataclass(slots=True)
class _Queued:
    sample: Sample
    cap: int | None
    #: a multi-turn sample's next turn (continue_turn): launched as a continuation, the policy already placed it
    turn: bool = False


class Scheduler:
    """Runs groups through a policy on a set of engines: one batch at a time (``start_batch``) or
    as a stream (``add_groups``)."""

    def __init__(
        self,
        engines: Sequence[Engine],
        policy_factory: Callable[["Scheduler"], Dispatcher],
        clock: Clock,
        sampling: SamplingConfig,
        segments: SegmentConfig,
        *,
        policy_version: int = 0,
        on_sample_done: Callable[[Sample], None] | None = None,
        on_group_done: Callable[[Group], None] | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
        on_restart: Callable[[Sample], None] | None = None,
        on_turn_end: Callable[[Sample, str], None] | None = None,
        hold_turn_slots: bool = False,
    ):
        names = [e.name for e in engines]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise PdsrError(f"engine names must be unique; repeated: {', '.join(dupes)}")
        self.clock = clock
        self.sampling = sampling
        self.segment_cfg = segments
        self.policy_version = policy_version
        self.engines: list[Engine] = list(engines)
        self.usage: dict[str, EngineUsage] = {e.name: EngineUsage() for e in engines}
        self.stats: Counter[str] = Counter()
        self.engine_errors: list[EngineError] = []
        self._on_sample_done = on_sample_done or (lambda s: None)
        self._on_group_done = on_group_done or (lambda g: None)
        self._on_fatal = on_fatal or _raise
        # a restart taking effect (tokens thrown away, the sample starts over from its prompt): the
        # simulator may give a forced sample a fresh length here (``restart_lengths``)
        self._on_restart = on_restart or (lambda s: None)
        # a multi-turn sample's turn ended (None: multi-turn samples finish at their first turn's end)
        self._on_turn_end = on_turn_end
        # multi-turn samples between turns (waiting on their environment; no slot held) -> where their next
        # turn goes: (pool, engine), the engine that ran the last turn unless the policy moved the sample
        self._parked: dict[Sample, tuple[str | None, Engine | None]] = {}
        # hold_turn_slots: parked samples keep their engine's slot (a pseudo request id in _running_on) while they
        # wait; ``held_turn_slot_s`` adds up the slot-seconds so held (0 without it)
        self.hold_turn_slots = hold_turn_slots
        self._holding: dict[Sample, tuple[Engine, str, float]] = {}
        self.held_turn_slot_s = 0.0
        self._pool_queues: dict[str, deque[_Queued]] = {}
        self._engine_queues: dict[str, deque[_Queued]] = {e.name: deque() for e in engines}
        for e in engines:
            self._pool_queues.setdefault(e.pool, deque())
        self._runs: dict[str, _Run] = {}               # request_id -> run
        self._run_of: dict[Sample, _Run] = {}           # running sample -> run
        self._where: dict[Sample, tuple[str, str]] = {}  # queued sample -> ("pool"|"engine", key)
        self._running_on: dict[str, set[str]] = {e.name: set() for e in engines}
        self._by_name: dict[str, Engine] = {e.name: e for e in engines}
        self._order: dict[str, int] = {e.name: i for i, e in enumerate(engines)}
        # live engines per pool (O(1) "is the pool alive" checks; pools() is O(engines))
        self._live: dict[str, int] = {p: 0 for p in self._pool_queues}
        for e in engines:
            self._live[e.pool] += 1
        # per pool, a lazy heap of (load fraction, order, name): the least loaded engine first. Loads that
        # changed since the last pop wait in _load_changed and are pushed just before the next pop.
        self._free_heap: dict[str, list[tuple[float, int, str]]] = {p: [] for p in self._pool_queues}
        self._load_changed: dict[str, set[str]] = {p: set() for p in self._pool_queues}
        for e in engines:
            self._push_free(e)
        self._dirty_engines: set[str] = set()
        self._dirty_pools: set[str] = set()
        self._grown_pools: set[str] = set()   # pools whose queue got work since the last pump
        self._rid = itertools.count()
        self._pumping = False
        self._pump_again = False
        self._groups_left = 0
        self._batch_done: Callable[[], None] | None = None
        #: the pause mode while paused (``abort``, ``wait``, ``keep``), else None; see :meth:`pause`
        self.paused: str | None = None
        self._held: dict[Sample, _Run] = {}             # samples a pause stopped, by the run that was stopped
        self._drained: list[Callable[[], None]] = []    # called once nothing runs any more while paused
        self.streaming = False   # set by add_groups (DispatchContext.streaming)
        self.stream: StreamSpec | None = None   # the stream's description, from add_groups (DispatchContext.stream)
        #: salt each request's prefix-cache key with the policy version of its sample's oldest kept token, so that
        #: KV kept across weight updates (``kv_on_update: keep``) is shared only by requests started under the same
        #: weights (set by the session)
        self.salt_by_version = False
        self.policy: Dispatcher = policy_factory(self)
        # skip hooks the policy does not override (the simulator calls these millions of times)
        self._wants_launch = _overrides(self.policy, "on_launch")
        self._wants_idle = _overrides(self.policy, "on_worker_idle")
        self._wants_floor = _overrides(self.policy, "segment_floor")
        self._wants_parked = _overrides(self.policy, "on_turn_parked")
        self._wants_next_turn = _overrides(self.policy, "on_next_turn")
        # optional: which pools' idle engines the policy may act on now (see Policy.idle_interest)
        self._idle_interest = getattr(self.policy, "idle_interest", None)
        self._pool_engines: dict[str, list[Engine]] = {p: [e for e in engines if e.pool == p]
                                                       for p in self._pool_queues}

    @property
    def max_staleness(self) -> int | None:
        """The stream's staleness bound (``DispatchContext.max_staleness``): told with its groups, not set."""
        return None if self.stream is None else self.stream.max_staleness

    # ------------------------------------------------------------------ batch
    def start_batch(self, groups: list[Group], on_done: Callable[[], None]) -> None:
        """Hand a batch to the policy; ``on_done`` runs when its last sample finishes."""
        self._groups_left = sum(1 for g in groups if not g.done)
        self._batch_done = on_done
        if self._groups_left == 0:
            on_done()
            return
        self._dirty_engines.update(e.name for e in self.live_engines())
        self.guarded(self.policy.on_batch, groups)
        self._pump()

    def add_groups(self, groups: list[Group], stream: StreamSpec | None = None) -> None:
        """Streaming: hand more groups to the policy (``on_batch``) while earlier ones may still run.

        No batch-done callback: each group's end is reported through ``on_group_done``. For policies
        whose ``on_batch`` may be called again before earlier groups finish (``Policy.streaming``);
        not while a ``start_batch`` batch is running. ``stream``: what the stream tells the policy (its
        staleness bound, ...: ``DispatchContext.stream``), in force before the policy sees these groups.
        """
        if self._batch_done is not None:
            raise PdsrError("add_groups: a start_batch batch is still running; stream groups or run batches, not both")
        self.streaming = True
        if stream is not None:
            self.stream = stream
        if not groups:
            return
        self._dirty_engines.update(e.name for e in self.live_engines())
        self.guarded(self.policy.on_batch, groups)
        self._pump()

    @property
    def idle(self) -> bool:
        return not self._runs and not self._where and not self._held and not self._parked

    # ------------------------------------------------------------ multi-turn
    def parked(self) -> list[Sample]:
        """Multi-turn samples between turns (waiting on their environment)."""
        return list(self._parked)

    def continue_turn(self, sample: Sample, env_ids: Sequence[int] | int, max_tokens: int | None = None, *,
                      tool_name: str | None = None) -> None:
        """Run a parked multi-turn sample's next turn: ``env_ids`` (what its environment added since the model's
        last token; mask 0; a count for engines that count only) go into its response, then the model samples up
        to ``max_tokens`` more (None: up to the sample's ``max_tokens``). Queued first on the engine that ran its
        last turn (its prefix is cached there), or where the policy moved it while it waited or moves it now
        (``on_next_turn``)."""
        if sample not in self._parked:
            raise PdsrError(f"continue_turn: sample {sample.key} is not waiting between turns")
        self._release_held(sample)
        if self._wants_next_turn:
            home = self._parked[sample][1]
            if home is not None:
                self.guarded(self.policy.on_next_turn, sample, home)
        target = self._parked.pop(sample)
        now = self.clock.now()
        turns = sample.turns if sample.turns is not None else []
        n_env = env_ids if isinstance(env_ids, int) else len(env_ids)
        if n_env:
            last_end = turns[-1].end_s if turns else now
            turns.append(TurnRecord("environment", sample.num_generated, n_env, tool_name=tool_name,
                                    start_s=now if last_end is None else last_end, end_s=now))
            sample.add_env_tokens(env_ids)
        room = sample.max_tokens - sample.num_generated
        if room <= 0:
            raise PdsrError(f"continue_turn: sample {sample.key} has no tokens left ({sample.num_generated} of "
                            f"{sample.max_tokens}); finish it")
        sample.turn_end = sample.num_generated + (room if max_tokens is None else max(1, min(max_tokens, room)))
        pool, engine = target
        self._enqueue(sample, pool if pool is not None else (engine.pool if engine is not None else None), engine,
                      sample.cap, True, turn=True)
        self._pump()

    # ----------------------------------------------------------------- pause
    def pause(self, mode: str, on_drained: Callable[[], None] | None = None) -> None:
        """Stop launching work until :meth:`resume`; samples keep every token.

        - ``abort``: every running segment is aborted; its sample keeps its tokens and log-probs and
          waits, held, to continue on the same engine at :meth:`resume` (a new segment, stamped with
          the policy version current then).
        - ``wait``: running samples go on (segment after segment) until they finish or a policy sends
          them back to a queue; nothing new starts.
        - ``keep``: running requests stay on their engines (the caller freezes them there); nothing
          new starts; at :meth:`resume` each running sample's segment is split where the policy version
          changed.

        ``on_drained()`` runs once no request runs (at once if none does); with ``keep`` the requests
        stay, so it is not called.
        """
        if mode not in PAUSE_MODES:
            raise PdsrError(f"pause mode must be one of {', '.join(PAUSE_MODES)}; got {mode!r}")
        if self.paused is not None:
            raise PdsrError(f"already paused (mode {self.paused!r}); resume first")
        self.paused = mode
        if mode == "abort":
            for run in list(self._runs.values()):
                if run.intent is None:
                    run.intent = ("pause",)
                    run.engine.abort(run.request_id)
        if on_drained is not None:
            self.when_drained(on_drained)

    def when_drained(self, on_drained: Callable[[], None]) -> None:
        """While paused: ``on_drained()`` once no request runs (at once if none does); never under ``keep``,
        whose requests stay."""
        if self.paused is None:
            raise PdsrError("when_drained: not paused")
        if not self._runs:
            on_drained()
        elif self.paused != "keep":
            self._drained.append(on_drained)

    def resume(self) -> None:
        """End a pause: held samples continue where they stopped (as at a segment's end: the policy
        hears ``on_segment_end``), running ones (``keep``) get a new segment if the policy version
        changed, and queued work launches."""
        if self.paused is None:
            return
        self.paused = None
        self._drained.clear()
        now = self.clock.now()
        for run in list(self._runs.values()):
            self._split_segment(run.sample, now)
        held, self._held = self._held, {}
        for run in held.values():
            self.guarded(self._continue_held, run)
        self._dirty_engines.update(e.name for e in self.live_engines())
        self._dirty_pools.update(self._pool_queues)
        self._grown_pools.update(p for p, q in self._pool_queues.items() if q)
        self._pump()

    def held(self) -> list[Sample]:
        """Samples a pause stopped (``abort``), waiting for :meth:`resume`."""
        return list(self._held)

    @property
    def in_flight(self) -> int:
        """Requests submitted to engines that have not ended."""
        return len(self._runs)

    def _split_segment(self, sample: Sample, now: float) -> None:
        seg = sample.segments[-1]
        if seg.policy_version == self.policy_version:
            return
        if seg.num_tokens == 0:
            seg.policy_version = self.policy_version
            return
        seg.end_time_s = now
        seg.end_reason = "pause"
        sample.segments.append(SegmentRecord(pool=seg.pool, engine=seg.engine, start_token=sample.num_generated,
                                             policy_version=self.policy_version, submit_time_s=now))

    def _continue_held(self, run: _Run) -> None:
        sample, engine = run.sample, run.engine
        if sample.finished or sample in self._where or sample in self._run_of:
            return
        if self.usage[engine.name].dead:
            self._enqueue(sample, run.stolen_from or engine.pool, None, sample.cap, True)
            return
        self._next_segment(run, mark=False)

    def _check_drained(self) -> None:
        if self._drained and not self._runs:
            callbacks, self._drained = self._drained, []
            for fn in callbacks:
                fn()

    # ------------------------------------------------------- DispatchContext
    def pools(self) -> dict[str, list[Engine]]:
        out: dict[str, list[Engine]] = {pool: [] for pool in self._pool_queues}
        for e in self.live_engines():
            out.setdefault(e.pool, []).append(e)
        return out

    def live_engines(self) -> list[Engine]:
        return [e for e in self.engines if not self.usage[e.name].dead]

    def submit(self, sample: Sample, pool: str | None = None, *, engine: Engine | None = None,
               cap: int | None = None, front: bool = False) -> None:
        if sample.finish_reason == DROPPED:
            return   # its group was dropped by the step stream while the sample waited in the policy's own queue
        if sample.finished:
            raise PdsrError(f"policy submitted finished sample {sample.key}")
        if sample in self._run_of or sample in self._where:
            raise PdsrError(f"policy submitted sample {sample.key} twice (it is already queued or running)")
        if sample.submit_time_s is None:
            sample.submit_time_s = self.clock.now()
        self._enqueue(sample, pool, engine, cap, front)
        self._pump()

    def move(self, sample: Sample, pool: str | None = None, *, restart: bool = False, cap: int | None = None,
             engine: Engine | None = None) -> None:
        if sample.finished:
            return
        if pool is None:
            if engine is None:
                raise PdsrError(f"policy moved sample {sample.key} without a pool or an engine")
            pool = engine.pool
        if sample.turns is not None:
            restart = False   # a multi-turn sample's agent holds its conversation: its tokens are never thrown away
            if sample in self._parked:   # its next turn goes there
                self._release_held(sample)
                self._parked[sample] = (pool, engine)
                sample.moves += 1
                self.stats["moves"] += 1
                return
        run = self._run_of.get(sample)
        if run is not None:
            if run.intent is None or run.intent[0] == "pause":
                if run.intent is None:
                    run.engine.abort(run.request_id)
                run.intent = ("queue", pool, engine, cap, restart)
                sample.moves += 1
                self.stats["moves"] += 1
            return
        if sample in self._where:
            self._dequeue(sample)
        self._held.pop(sample, None)
        sample.moves += 1
        self.stats["moves"] += 1
        if restart:
            self._restart(sample)
        self._enqueue(sample, pool, engine, cap, False)
        self._pump()

    def finish(self, sample: Sample, reason: str) -> None:
        if sample.finished:
            return
        run = self._run_of.get(sample)
        if run is not None:
            if run.intent is None or run.intent[0] != "finish":
                run.intent = ("finish", reason)
                run.engine.abort(run.request_id)
            return
        if sample in self._where:
            self._dequeue(sample)
        self._held.pop(sample, None)
        self._release_held(sample)
        parked = self._parked.pop(sample, None)
        self._finish(sample, reason)
        if parked is not None:
            # no slot is released, but the policy may have kept room for it (v3's ledger): let idle engines ask
            self._dirty_engines.update(e.name for e in self.live_engines())
            self._dirty_pools.update(self._pool_queues)
        self._pump()

    def restart(self, sample: Sample) -> None:
        """Throw the sample's tokens away and generate it again from its prompt (``restarts``,
        ``wasted_tokens``). Running: aborted, then queued on the engine it ran on (unless the abort
        finds its last token already generated: then it finishes as usual). Queued: stays
        where it is. Finished (e.g. its tokens grew too stale before its group was used): queued
        again on the engine it last ran on; its group is reported done again when it finishes. Not
        queued yet but holding tokens (restored from disk): its tokens are thrown away. A multi-turn sample is
        never restarted (its agent holds the conversation): counted as ``turn_restarts_refused``."""
        if sample.turns is not None:
            self.stats["turn_restarts_refused"] += 1
            return
        run = self._run_of.get(sample)
        if run is not None:
            if run.intent is None:
                run.intent = ("queue", None, run.engine, sample.cap, True)
                run.engine.abort(run.request_id)
            elif run.intent[0] == "queue":
                run.intent = (*run.intent[:4], True)
            else:   # an abort to finish it is on its way: restart instead
                run.intent = ("queue", None, run.engine, sample.cap, True)
            return
        if sample in self._where or sample in self._held:
            self._restart(sample)   # a held one continues from its prompt at resume
            return
        if not sample.finished:
            if sample.num_generated:   # restored with tokens (a resumed run), not queued yet
                self._restart(sample)
            return   # never submitted: nothing to throw away
        engine = self._by_name.get(sample.segments[-1].engine) if sample.segments else None
        pool = engine.pool if engine is not None else sample.routed_to
        if pool is None:
            raise PdsrError(f"restart: finished sample {sample.key} never ran; no engine or pool to run it on")
        self.stats["samples_finished"] -= 1
        self.stats["tokens_generated"] -= sample.sampled_tokens
        sample.finish_reason = None
        sample.finish_time_s = None
        self._restart(sample)
        self._enqueue(sample, pool, engine, sample.cap, False)
        self._pump()

    def queued(self, pool: str) -> list[Sample]:
        return [q.sample for q in self._pool_queues.get(pool, ())]

    def queue_length(self, pool: str) -> int:
        return len(self._pool_queues.get(pool, ()))

    def running(self, engine: Engine | None = None) -> list[Sample]:
        if engine is None:
            return list(self._run_of)
        runs = self._runs
        return [runs[r].sample for r in self._running_on[engine.name] if r in runs]   # (not slots held by turns)

    def free_slots(self, engine: Engine) -> int:
        return self._free_slots(engine)

    def least_loaded(self, pool: str) -> Engine | None:
        return self._pop_least_loaded(pool) if pool in self._free_heap else None

    def engine_of(self, sample: Sample) -> Engine | None:
        run = self._run_of.get(sample)
        return run.engine if run is not None else None

    def steal(self, engine: Engine, from_pool: str, max_items: int, *,
              time_limit_s: float | None = None, cap: int | None | Literal["keep"] = "keep") -> int:
        if self.paused is not None:
            return 0
        queue = self._pool_queues.get(from_pool)
        taken = 0
        while queue and taken < max_items and self._free_slots(engine) > 0:
            item = queue.popleft()
            del self._where[item.sample]
            item.sample.steals += 1
            self.stats["steals"] += 1
            run = self._launch(item.sample, engine, item.cap if cap == "keep" else cap, stolen_from=from_pool)
            if time_limit_s is not None:
                self.clock.call_later(time_limit_s, partial(self._steal_expired, run))
            taken += 1
        return taken

    def reroute(self, sample: Sample, engine: Engine) -> bool:
        where = self._where.get(sample)
        if where is None or where[0] != "engine" or where[1] == engine.name or sample.segments:
            return False
        self._dequeue(sample)
        sample.steals += 1
        self.stats["steals"] += 1
        self._enqueue(sample, engine.pool, engine, sample.cap, False)
        self._pump()
        return True

    def count(self, key: str, n: int = 1) -> None:
        self.stats[key] += n

    # ------------------------------------------------------ EngineListener
    def on_tokens(self, engine: Engine, request_id: str, n: int,
                  token_ids: Sequence[int] | None, logprobs: Sequence[float] | None, *,
                  first_token_time_s: float | None = None) -> None:
        run = self._runs.get(request_id)
        if run is None or n <= 0:
            return
        sample = run.sample
        seg = sample.segments[-1]
        if seg.first_token_time_s is None:
            # the span's decode steps run from here on (`pdsr simulate calibrate` times them; v3 prices a
            # move's prefill by the wait); an engine that reports counts only at the end says when it was
            if first_token_time_s is not None:
                seg.first_token_time_s = first_token_time_s
            elif not getattr(engine, "counts_only", False):
                seg.first_token_time_s = self.clock.now()
        if sample.first_token_time_s is None:
            sample.first_token_time_s = seg.first_token_time_s if seg.first_token_time_s is not None else self.clock.now()
        sample.add_tokens(n, token_ids, logprobs)
        usage = self.usage[engine.name]
        usage.tokens += n

    def on_segment_end(self, engine: Engine, request_id: str, finish_reason: str, *,
                       speculation: tuple[int, int] | None = None) -> None:
        run = self._runs.pop(request_id, None)
        if run is None:
            return
        sample = run.sample
        del self._run_of[sample]
        self._release_slot(engine, request_id)
        seg = sample.segments[-1]
        seg.end_time_s = self.clock.now()
        if speculation is not None:
            seg.drafted_tokens, seg.accepted_tokens = speculation
        self.guarded(self._after_segment, run, finish_reason)
        self._pump()
        if self.paused is not None:
            self._check_drained()

    def on_engine_dead(self, engine: Engine, error: Exception) -> None:
        usage = self.usage[engine.name]
        if usage.dead:
            return
        usage.dead = True
        self._live[engine.pool] -= 1
        self._mark_idle(engine)
        err = error if isinstance(error, EngineError) else EngineError(engine.name, str(error))
        self.engine_errors.append(err)
        self.stats["engines_lost"] += 1
        requeued: list[Sample] = []
        for rid in list(self._running_on[engine.name]):
            run = self._runs.pop(rid, None)
            if run is None:
                continue   # a slot a parked sample held (hold_turn_slots): its next turn goes to the pool
            sample = run.sample
            del self._run_of[sample]
            sample.segments[-1].end_time_s = self.clock.now()
            sample.segments[-1].end_reason = "engine_dead"
            sample.retries += 1
            self.stats["retries"] += 1
            intent = run.intent if run.intent and run.intent[0] != "pause" else None
            if intent and intent[0] == "finish":
                self._finish(sample, intent[1])
                continue
            target = intent[1] if intent else (run.stolen_from or engine.pool)
            requeued.append(sample)
            self._enqueue(sample, target, None, intent[3] if intent else sample.cap, True,
                          check_live=False)
        self._running_on[engine.name].clear()
        for item in self._engine_queues.pop(engine.name, deque()):
            del self._where[item.sample]
            requeued.append(item.sample)
            self._enqueue(item.sample, engine.pool, None, item.cap, False, check_live=False)
        if not self._live[engine.pool]:
            self._on_fatal(EngineError(
                engine.name,
                f"died and no live engine is left in pool {engine.pool!r} to take its "
                f"{len(requeued)} unfinished request(s); original error: {err}",
                exit_status=err.exit_status, remote_traceback=None))
            return
        self.guarded(self.policy.on_engine_lost, engine, requeued)
        self._pump()
        if self.paused is not None:
            self._check_drained()

    # -------------------------------------------------------------- internals
    def _after_segment(self, run: _Run, reason: str) -> None:
        sample, engine = run.sample, run.engine
        seg = sample.segments[-1]
        if sample.turns is not None and self._on_turn_end is not None and (
                reason == STOP or sample.num_generated >= min(sample.max_tokens, sample.turn_end or sample.max_tokens)):
            # a forced sample (a replayed trace of turns) ends each turn as recorded: the model's end of turn
            self._end_turn(run, STOP if reason == STOP or sample.forced else LENGTH)
            return
        if reason == STOP:
            seg.end_reason = STOP
            self._finish(sample, STOP)
            return
        if sample.num_generated >= sample.max_tokens:
            seg.end_reason = LENGTH
            self._finish(sample, self._final_length_reason(sample))
            return
        if run.intent is not None and run.intent[0] == "pause":
            seg.end_reason = "pause"
            self._held[sample] = run
            return
        if run.intent is not None:
            seg.end_reason = "moved" if run.intent[0] == "queue" else run.intent[1]
            if run.intent[0] == "finish":
                self._finish(sample, run.intent[1])
            else:
                _, pool, target_engine, cap, restart = run.intent
                if restart:
                    self._restart(sample)
                self._enqueue(sample, pool, target_engine, cap, False)
            return
        if reason == ABORT:
            # An abort nobody asked for (engine-side); run it again where it was.
            seg.end_reason = ABORT
            self._enqueue(sample, run.stolen_from or engine.pool, None, sample.cap, True)
            return
        self._next_segment(run, mark=True)

    def _end_turn(self, run: _Run, reason: str) -> None:
        """A multi-turn sample's turn ended (``stop``, or ``length``: the turn's or the sample's token limit): park
        it, holding no slot, until its owner continues or finishes it."""
        sample = run.sample
        sample.segments[-1].end_reason = reason
        if sample.turns:
            turn = sample.turns[-1]
            turn.end_s = self.clock.now()
            turn.finish_reason = reason
        sample.turn_end = None
        if run.intent is not None and run.intent[0] == "finish":
            self._finish(sample, run.intent[1])
            return
        if run.intent is not None and run.intent[0] == "queue":
            target: tuple[str | None, Engine | None] = (run.intent[1], run.intent[2])
        else:
            target = (run.stolen_from or run.engine.pool, run.engine)
        self._parked[sample] = target
        self.stats["turns"] += 1
        if self.hold_turn_slots and target[1] is run.engine and not self.usage[run.engine.name].dead:
            held = f"{sample.key}#held"
            self._take_slot(run.engine, held)
            self._holding[sample] = (run.engine, held, self.clock.now())
        if self._wants_parked:
            self.guarded(self.policy.on_turn_parked, sample, run.engine)
        assert self._on_turn_end is not None
        self._on_turn_end(sample, reason)

    def _release_held(self, sample: Sample) -> None:
        """``hold_turn_slots``: give back the slot a parked sample kept (counting the seconds it was held)."""
        held = self._holding.pop(sample, None)
        if held is not None:
            engine, rid, since = held
            self.held_turn_slot_s += self.clock.now() - since
            if rid in self._running_on.get(engine.name, ()):
                self._release_slot(engine, rid)

    def _next_segment(self, run: _Run, *, mark: bool) -> None:
        """A segment ended short of the sample's end: the policy may act, else it continues on the same
        engine. ``mark``: record why the segment ended (a held sample's says ``pause`` already)."""
        sample, engine = run.sample, run.engine
        seg = sample.segments[-1]
        if sample.cap is not None and sample.num_generated >= sample.cap:
            if mark:
                seg.end_reason = "cap"
            self.policy.on_over_cap(sample, engine)
            if self._untouched(sample):
                self._finish(sample, TRUNCATED)
            return
        if mark:
            seg.end_reason = "segment"
        self.policy.on_segment_end(sample, engine)
        if self._untouched(sample):
            self._launch(sample, engine, sample.cap, stolen_from=run.stolen_from, continuing=True)

    def _untouched(self, sample: Sample) -> bool:
        """True if the policy neither finished, queued nor relaunched the sample."""
        return not sample.finished and sample not in self._where and sample not in self._run_of

    def _final_length_reason(self, sample: Sample) -> str:
        if not sample.forced:
            return LENGTH
        reasons = sample.group.target_finish_reasons
        return reasons[sample.index] if reasons else STOP

    def _restart(self, sample: Sample) -> None:
        wasted = sample.discard_tokens()
        sample.restarts += 1
        self.stats["restarts"] += 1
        self.stats["wasted_tokens"] += wasted
        self._on_restart(sample)

    def _enqueue(self, sample: Sample, pool: str | None, engine: Engine | None, cap: int | None,
                 front: bool, *, check_live: bool = True, turn: bool = False) -> None:
        item = _Queued(sample, cap, turn)
        if engine is not None:
            if self.usage[engine.name].dead:
                pool, engine = engine.pool, None
            else:
                q = self._engine_queues[engine.name]
                q.appendleft(item) if front else q.append(item)
                self._where[sample] = ("engine", engine.name)
                self._dirty_engines.add(engine.name)
                return
        if pool is None:
            raise PdsrError(f"policy submitted sample {sample.key} without a pool or an engine")
        if pool not in self._pool_queues:
            raise PdsrError(f"policy submitted sample {sample.key} to pool {pool!r}; pools: "
                            f"{', '.join(sorted(self._pool_queues))}")
        if check_live and not self._live[pool]:
            raise EngineError(pool, f"no live engine left in pool {pool!r}")
        if sample.routed_to is None and not sample.is_probe:
            sample.routed_to = pool
        q = self._pool_queues[pool]
        q.appendleft(item) if front else q.append(item)
        self._where[sample] = ("pool", pool)
        self._dirty_pools.add(pool)
        self._grown_pools.add(pool)

    def _dequeue(self, sample: Sample) -> None:
        kind, key = self._where.pop(sample)
        q = self._pool_queues[key] if kind == "pool" else self._engine_queues[key]
        for i, item in enumerate(q):
            if item.sample is sample:
                del q[i]
                return

    def _free_slots(self, engine: Engine) -> int:
        if self.usage[engine.name].dead:
            return 0
        return engine.max_concurrency - len(self._running_on[engine.name])

    def _launch(self, sample: Sample, engine: Engine, cap: int | None, *, stolen_from: str | None = None,
                continuing: bool = False) -> _Run:
        """Submit the sample's next segment to ``engine`` (its slot is taken now)."""
        sample.cap = cap
        now = self.clock.now()
        if not continuing:
            sample.run_start_s = now
        n_active = len(self._running_on[engine.name]) + 1
        seg_cfg = self.segment_cfg
        if seg_cfg.enabled:
            seg_len = next_segment_len(engine.segment_capacity_tokens, n_active, seg_cfg.min_tokens,
                                       seg_cfg.max_tokens)
            if self._wants_floor:
                seg_len = max(seg_len, min(self.policy.segment_floor(sample, engine), seg_cfg.max_tokens))
        else:
            seg_len = sample.max_tokens
        limit = sample.max_tokens if cap is None else min(cap, sample.max_tokens)
        if sample.turn_end is not None:
            limit = min(limit, sample.turn_end)
        max_tokens = max(1, min(seg_len, limit - sample.num_generated))
        request_id = f"{sample.key}#{next(self._rid)}"
        run = _Run(request_id, sample, engine, stolen_from=stolen_from)
        self._runs[request_id] = run
        self._run_of[sample] = run
        self._take_slot(engine, request_id)
        sample.segments.append(SegmentRecord(
            pool=engine.pool if stolen_from is None else f"{engine.pool}<-{stolen_from}",
            engine=engine.name, start_token=sample.num_generated,
            policy_version=self.policy_version, submit_time_s=now))
        usage = self.usage[engine.name]
        usage.segments += 1
        turns = sample.turns
        if turns is not None and (not turns or turns[-1].role != "assistant" or turns[-1].end_s is not None):
            turns.append(TurnRecord("assistant", sample.num_generated, start_s=now))
        if not continuing and self._wants_launch:
            self.guarded(self.policy.on_launch, sample, engine)
        keep_ids = not getattr(engine, "counts_only", False)
        engine.submit(SegmentRequest(
            request_id=request_id,
            context_ids=sample.context_ids() if keep_ids else None,
            context_len=sample.prompt_len + sample.num_generated,
            max_tokens=max_tokens,
            ignore_eos=sample.forced or self.sampling.ignore_eos,
            sampling=self.sampling,
            sample=sample,
            cache_salt=f"pdsr-v{oldest_version(sample)}" if self.salt_by_version else None,
        ))
        return run

    def _steal_expired(self, run: _Run) -> None:
        if self._runs.get(run.request_id) is run and run.intent is None and not run.sample.finished:
            self.stats["steal_timeouts"] += 1
            self.move(run.sample, run.stolen_from)

    def _take_slot(self, engine: Engine, request_id: str) -> None:
        slots = self._running_on[engine.name]
        if not slots:
            self.usage[engine.name].busy_since = self.clock.now()
        slots.add(request_id)
        self._load_changed[engine.pool].add(engine.name)

    def _release_slot(self, engine: Engine, request_id: str) -> None:
        slots = self._running_on[engine.name]
        slots.discard(request_id)
        if not slots:
            self._mark_idle(engine)
        self._load_changed[engine.pool].add(engine.name)
        self._dirty_engines.add(engine.name)
        self._dirty_pools.add(engine.pool)

    def _push_free(self, engine: Engine) -> None:
        """Record the engine's current load in its pool's heap (stale entries are skipped on pop)."""
        if self._free_slots(engine) > 0:
            load = len(self._running_on[engine.name]) / engine.max_concurrency
            heapq.heappush(self._free_heap[engine.pool], (load, self._order[engine.name], engine.name))

    def _pop_least_loaded(self, pool: str) -> Engine | None:
        changed = self._load_changed[pool]
        if changed:
            for name in changed:
                self._push_free(self._by_name[name])
            changed.clear()
            heap = self._free_heap[pool]
            if len(heap) > 4 * self._live[pool] + 64:
                # drop stale entries (each live engine with room keeps exactly its current entry)
                heap[:] = [(len(self._running_on[n]) / e.max_concurrency, self._order[n], n)
                           for n, e in self._by_name.items()
                           if e.pool == pool and self._free_slots(e) > 0]
                heapq.heapify(heap)
        heap = self._free_heap[pool]
        while heap:
            load, _, name = heap[0]
            engine = self._by_name[name]
            if (not self.usage[name].dead and self._free_slots(engine) > 0
                    and load == len(self._running_on[name]) / engine.max_concurrency):
                return engine
            heapq.heappop(heap)
        return None

    def _mark_idle(self, engine: Engine) -> None:
        usage = self.usage[engine.name]
        if usage.busy_since is not None:
            usage.busy_s += self.clock.now() - usage.busy_since
            usage.busy_since = None

    def _finish(self, sample: Sample, reason: str) -> None:
        sample.finish_reason = reason
        sample.finish_time_s = self.clock.now()
        self.stats["samples_finished"] += 1
        self.stats["tokens_generated"] += sample.sampled_tokens
        self._on_sample_done(sample)
        self.guarded(self.policy.on_sample_finished, sample)
        if sample.group.done:
            self._on_group_done(sample.group)
            self._groups_left -= 1
            if self._groups_left == 0 and self._batch_done is not None:
                done, self._batch_done = self._batch_done, None
                done()

    def _pump(self) -> None:
        """Fill free slots from engine queues, then pool queues; tell idle engines once."""
        if self._pumping:
            self._pump_again = True
            return
        self._pumping = True
        told: set[str] = set()  # each engine hears "idle" at most once per pump
        try:
            while True:
                self._pump_again = False
                for engine in self._fill():
                    if (self._wants_idle and engine.name not in told and self._free_slots(engine) > 0
                            and not self._engine_queues.get(engine.name)
                            and not self._pool_queues[engine.pool]):
                        told.add(engine.name)
                        self.guarded(self.policy.on_worker_idle, engine)
                if not self._pump_again and not self._dirty_engines and not self._dirty_pools:
                    break
        finally:
            self._pumping = False

    def _fill(self) -> list[Engine]:
        """Launch queued samples into free slots; returns engines that may now be idle."""
        if self.paused is not None:
            self._dirty_engines.clear()   # resume marks every engine and pool dirty again
            self._dirty_pools.clear()
            self._grown_pools.clear()
            return []
        dirty_engines, self._dirty_engines = self._dirty_engines, set()
        dirty_pools, self._dirty_pools = self._dirty_pools, set()
        candidates: dict[str, Engine] = {}
        for name in dirty_engines:
            engine = self._by_name[name]
            if self.usage[name].dead:
                continue
            q = self._engine_queues[name]
            while q and self._free_slots(engine) > 0:
                item = q.popleft()
                del self._where[item.sample]
                self._launch(item.sample, engine, item.cap, continuing=item.turn)
            candidates[name] = engine
            dirty_pools.add(engine.pool)
        drained = []
        for pool in dirty_pools:
            q = self._pool_queues[pool]
            had_work = bool(q)
            while q:
                least = self._pop_least_loaded(pool)
                if least is None:
                    break
                item = q.popleft()
                del self._where[item.sample]
                self._launch(item.sample, least, item.cap, continuing=item.turn)
            if had_work and not q:
                drained.append(pool)
        grown, self._grown_pools = self._grown_pools, set()
        waiting = any(self._pool_queues[p] for p in grown)
        if not self._wants_idle:
            # nobody listens for "idle": skip the O(engines) candidate lists, but leave the dirty set
            # exactly as below (engines that would have been candidates are dropped from it)
            if self._dirty_engines:
                self._dirty_engines = {n for n in self._dirty_engines
                                       if not (n in candidates or self._idle_candidate(n, drained, waiting))}
            return []
        interest: dict[str, bool] = {}

        def interested(pool: str) -> bool:
            if pool not in interest:
                interest[pool] = self._idle_interest is None or bool(self._idle_interest(pool))
            return interest[pool]

        for pool in drained:
            # the queue just drained: every engine of the pool with room is now idle
            if interested(pool):
                for engine in self._pool_engines[pool]:
                    if not self.usage[engine.name].dead:
                        candidates[engine.name] = engine
        if waiting:
            # work is waiting that its own pool cannot take now: engines elsewhere may steal it
            pools = [p for p, q in self._pool_queues.items() if not q and interested(p)]
            found = [e for p in pools for e in self._pool_engines[p] if not self.usage[e.name].dead]
            if len(pools) > 1:
                found.sort(key=lambda e: self._order[e.name])   # engine order, as live_engines() gives
            for engine in found:
                candidates.setdefault(engine.name, engine)
        # launches above may have dirtied engines again; those were handled in this pass (engines of
        # pools skipped as uninterested count as handled too)
        if len(interest) == sum(interest.values()):
            self._dirty_engines.difference_update(candidates)
        elif self._dirty_engines:
            self._dirty_engines = {n for n in self._dirty_engines
                                   if not (n in candidates or self._idle_candidate(n, drained, waiting))}
        return list(candidates.values())

    def _idle_candidate(self, name: str, drained: list[str], waiting: bool) -> bool:
        """Whether _fill's idle-candidate lists would hold engine ``name`` (see _fill)."""
        engine = self._by_name[name]
        if self.usage[name].dead:
            return False
        return engine.pool in drained or (waiting and not self._pool_queues[engine.pool])

    def guarded(self, fn: Callable[..., object], *args: Any) -> None:
        """``fn(*args)``; an exception ends the run through ``on_fatal`` (a policy's hooks run this way), rather
        than escaping into the event loop that called it (where nobody would see it and the step would wait)."""
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - a policy bug must end the run, loudly
            self._on_fatal(exc)


def _raise(exc: BaseException) -> None:
    raise exc


def _overrides(policy: object, hook: str) -> bool:
    """True if ``policy`` defines ``hook`` itself rather than inheriting the base no-op."""
    impl = getattr(type(policy), hook, None)
    return impl is not None and impl is not getattr(Policy, hook, None)
