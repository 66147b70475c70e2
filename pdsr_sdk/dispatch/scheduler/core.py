"""The :class:`Scheduler`: its state, a batch or a stream of groups, and the policy's commands
(:class:`~pdsr_sdk.dispatch.protocols.DispatchContext`)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Callable, Literal, Sequence

from pdsr_sdk.dispatch.protocols import Clock, Dispatcher, Engine
from pdsr_sdk.dispatch.scheduler.events import EngineEvents
from pdsr_sdk.dispatch.scheduler.slots import Run
from pdsr_sdk.dispatch.types import DROPPED, Group, Sample, StreamSpec
from pdsr_sdk.errors import PdsrError

if TYPE_CHECKING:
    from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig


class Scheduler(EngineEvents):
    """Runs groups through a policy on a set of engines: one batch at a time (``start_batch``) or
    as a stream (``add_groups``).

    Its parts, each a module of this package: the slots and queues (``slots``), launches and the pump
    (``launch``), pause and resume (``pause``), engines finishing samples under older weights after an update
    (``lag``), multi-turn samples between turns (``turns``), the engines' events (``events``); each sets its own
    state in its ``_init_*``, called here in that order, and the policy is built last."""

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
        on_tokens: Callable[[Sample, int], None] | None = None,
    ):
        names = [e.name for e in engines]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise PdsrError(f"engine names must be unique; repeated: {', '.join(dupes)}")
        self._init_slots(engines, clock)
        self._init_launch(sampling, segments, policy_version, on_sample_done=on_sample_done,
                          on_group_done=on_group_done, on_fatal=on_fatal, on_restart=on_restart)
        self._init_pause()
        self._init_lag()
        self._init_turns(on_turn_end, hold_turn_slots)
        self._init_events(on_tokens)
        self.streaming = False   # set by add_groups (DispatchContext.streaming)
        self.stream: StreamSpec | None = None   # the stream's description, from add_groups (DispatchContext.stream)
        self._bind_policy(policy_factory(self))

    @property
    def max_staleness(self) -> int | None:
        """The stream's staleness bound (``DispatchContext.max_staleness``): told with its groups, not set."""
        return None if self.stream is None else self.stream.max_staleness

    def start_batch(self, groups: list[Group], on_done: Callable[[], None]) -> None:
        """Hand a batch to the policy; ``on_done`` runs when its last sample finishes."""
        self._groups_left = sum(1 for g in groups if not g.done)
        self._open.update((id(g), g) for g in groups if not g.done)
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
        self._open.update((id(g), g) for g in groups if not g.done)
        self._dirty_engines.update(e.name for e in self.live_engines())
        self.guarded(self.policy.on_batch, groups)
        self._pump()

    @property
    def idle(self) -> bool:
        return not self._runs and not self._where and not self._held and not self._parked

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
        self._open[id(sample.group)] = sample.group
        sample.finish_reason = None
        sample.finish_time_s = None
        self._restart(sample)
        self._enqueue(sample, pool, engine, sample.cap, False)
        self._pump()

    def steal(self, engine: Engine, from_pool: str, max_items: int, *,
              time_limit_s: float | None = None, cap: int | None | Literal["keep"] = "keep") -> int:
        self._check_own(engine, "stole work for")
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
                # the scheduler's own timer, not the policy's (ctx.clock counts and guards those)
                self._timers.inner.call_later(time_limit_s, partial(self._steal_expired, run))
            taken += 1
        return taken

    def _steal_expired(self, run: Run) -> None:
        if self._runs.get(run.request_id) is run and run.intent is None and not run.sample.finished:
            self.stats["steal_timeouts"] += 1
            self.move(run.sample, run.stolen_from)

    def reroute(self, sample: Sample, engine: Engine) -> bool:
        self._check_own(engine, f"rerouted sample {sample.key} to")
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
