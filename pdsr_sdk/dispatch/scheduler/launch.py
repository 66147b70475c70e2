"""The scheduler's launches: a sample's next segment onto an engine, the pump that fills free slots from the
queues and tells idle engines, a segment's end short of its sample's end, and a sample's finish."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

from pdsr_sdk.dispatch.policy import Policy
from pdsr_sdk.dispatch.protocols import Dispatcher, Engine
from pdsr_sdk.dispatch.scheduler.slots import Run, SlotTable
from pdsr_sdk.dispatch.scheduler.watch import WatchedClock, hook_error, stalled_error
from pdsr_sdk.dispatch.segments import next_segment_len
from pdsr_sdk.dispatch.types import (
    LENGTH, STOP, TRUNCATED, Group, Sample, SegmentRecord, SegmentRequest, TurnRecord, oldest_version,
)
from pdsr_sdk.errors import PdsrError

if TYPE_CHECKING:
    from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig


class Launcher(SlotTable):
    """Launches and the pump over the slot table, and the policy hooks they call (:meth:`_init_launch`, then
    :meth:`_bind_policy` once the rest of the scheduler is set). Reads ``paused``, which the pause part sets:
    while it is set nothing launches."""

    #: the pause mode while paused, else None (set by :class:`~pdsr_sdk.dispatch.scheduler.pause.Pausing`)
    paused: str | None
    #: samples a pause stopped (Pausing) and multi-turn samples between turns (Turns): work that will go on
    _held: dict[Sample, Run]
    _parked: dict[Sample, Any]
    #: a sample that finished under older weights (Lagging): its engine may load once its last such sample has
    _lag_finished: Callable[[Sample], None]

    def _init_launch(self, sampling: SamplingConfig, segments: SegmentConfig, policy_version: int, *,
                     on_sample_done: Callable[[Sample], None] | None,
                     on_group_done: Callable[[Group], None] | None,
                     on_fatal: Callable[[BaseException], None] | None,
                     on_restart: Callable[[Sample], None] | None) -> None:
        self.sampling = sampling
        self.segment_cfg = segments
        self.policy_version = policy_version
        self.stats: Counter[str] = Counter()
        self._on_sample_done = on_sample_done or (lambda s: None)
        self._on_group_done = on_group_done or (lambda g: None)
        self._on_fatal = on_fatal or _raise
        # a restart taking effect (tokens thrown away, the sample starts over from its prompt): the
        # simulator may give a forced sample a fresh length here (``restart_lengths``)
        self._on_restart = on_restart or (lambda s: None)
        self._rid = itertools.count()
        self._pumping = False
        self._pump_again = False
        self._groups_left = 0
        self._batch_done: Callable[[], None] | None = None
        #: salt each request's prefix-cache key with the policy version of its sample's oldest kept token, so that
        #: KV kept across weight updates (``kv_on_update: keep``) is shared only by requests started under the same
        #: weights (set by the session)
        self.salt_by_version = False
        # a policy's mistakes end the run with an error naming it (watch.py): policy code running now (hooks,
        # timers), the policy's timers pending, the groups given to it and not done
        self._depth = 0
        self._timers = WatchedClock(self.clock, self._timer_fired)
        self.clock = self._timers
        self._open: dict[int, Group] = {}
        self._stall_reported = False

    def _bind_policy(self, policy: Dispatcher) -> None:
        """Take the policy, built last (its factory may ask the scheduler about its engines and pools)."""
        self.policy: Dispatcher = policy
        # skip hooks the policy does not override (the simulator calls these millions of times)
        self._wants_launch = _overrides(self.policy, "on_launch")
        self._wants_idle = _overrides(self.policy, "on_worker_idle")
        self._wants_floor = _overrides(self.policy, "segment_floor")
        self._wants_parked = _overrides(self.policy, "on_turn_parked")
        self._wants_next_turn = _overrides(self.policy, "on_next_turn")
        # optional: which pools' idle engines the policy may act on now (see Policy.idle_interest)
        self._idle_interest = getattr(self.policy, "idle_interest", None)

    def _launch(self, sample: Sample, engine: Engine, cap: int | None, *, stolen_from: str | None = None,
                continuing: bool = False) -> Run:
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
                floor = self._hook("segment_floor", sample, engine)
                seg_len = max(seg_len, min(floor, seg_cfg.max_tokens))
        else:
            seg_len = sample.max_tokens
        limit = sample.max_tokens if cap is None else min(cap, sample.max_tokens)
        if sample.turn_end is not None:
            limit = min(limit, sample.turn_end)
        max_tokens = max(1, min(seg_len, limit - sample.num_generated))
        request_id = f"{sample.key}#{next(self._rid)}"
        run = Run(request_id, sample, engine, stolen_from=stolen_from)
        self._runs[request_id] = run
        self._run_of[sample] = run
        self._take_slot(engine, request_id)
        lag_version = self.usage[engine.name].lag_version
        sample.segments.append(SegmentRecord(
            pool=engine.pool if stolen_from is None else f"{engine.pool}<-{stolen_from}",
            engine=engine.name, start_token=sample.num_generated,
            policy_version=self.policy_version if lag_version is None else lag_version, submit_time_s=now))
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
            continued_tokens=sample.num_generated - (turns[-1].start_token if turns else 0),
        ))
        return run

    def _next_segment(self, run: Run, *, mark: bool) -> None:
        """A segment ended short of the sample's end: the policy may act, else it continues on the same
        engine. ``mark``: record why the segment ended (a held sample's says ``pause`` already)."""
        sample, engine = run.sample, run.engine
        seg = sample.segments[-1]
        if sample.cap is not None and sample.num_generated >= sample.cap:
            if mark:
                seg.end_reason = "cap"
            self._hook("on_over_cap", sample, engine)
            if self._untouched(sample):
                self._finish(sample, TRUNCATED)
            return
        if mark:
            seg.end_reason = "segment"
        self._hook("on_segment_end", sample, engine)
        if self._untouched(sample):
            self._launch(sample, engine, sample.cap, stolen_from=run.stolen_from, continuing=True)

    def _hook(self, hook: str, sample: Sample, engine: Engine) -> Any:
        """The policy's ``hook(sample, engine)``, called in the scheduler's own flow; what it raises ends the run
        as :meth:`_hook_failed` says."""
        try:
            return getattr(self.policy, hook)(sample, engine)
        except Exception as exc:
            raise self._hook_failed(hook, exc)

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

    def _finish(self, sample: Sample, reason: str) -> None:
        sample.finish_reason = reason
        sample.finish_time_s = self.clock.now()
        self.stats["samples_finished"] += 1
        self.stats["tokens_generated"] += sample.sampled_tokens
        self._on_sample_done(sample)
        if sample in self._lag_of:
            self._lag_finished(sample)
        self.guarded(self.policy.on_sample_finished, sample)
        if sample.group.done:
            self._open.pop(id(sample.group), None)
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
        if not self._depth and not self._runs:
            self._check_stalled()

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
            while q and self._free_slots(engine, own_queue=True) > 0:
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
                try:
                    interest[pool] = self._idle_interest is None or bool(self._idle_interest(pool))
                except Exception as exc:
                    raise self._hook_failed("idle_interest", exc)
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
        than escaping into the event loop that called it (where nobody would see it and the step would wait).
        One a policy's hook raised (``fn`` is the hook) is a RunError naming the policy and the hook."""
        self._depth += 1
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - a policy bug must end the run, loudly
            if isinstance(exc, Exception) and getattr(fn, "__self__", None) is self.policy:
                exc = self._hook_failed(getattr(fn, "__name__", "a hook"), exc)
            self._on_fatal(exc)
        finally:
            self._depth -= 1

    def _hook_failed(self, hook: str, exc: Exception) -> Exception:
        """What a policy's ``hook`` raising ``exc`` ends the run with: a RunError naming the policy, the hook and
        the line; a scheduler's refusal of a command the hook gave (a plain PdsrError: "policy submitted sample ...
        twice") named with the policy and the hook; any other PdsrError (the policy's own) as it is."""
        if type(exc) is PdsrError:
            return hook_error(self.policy, hook, exc, refused=True)
        return exc if isinstance(exc, PdsrError) else hook_error(self.policy, hook, exc)

    def _timer_fired(self, callback: Callable[[], None]) -> None:
        """A timer set on ``ctx.clock`` fired: its callback runs guarded, then the run is checked for a stall."""
        self._depth += 1
        try:
            callback()
        except BaseException as exc:  # noqa: BLE001 - as guarded
            if isinstance(exc, Exception):
                exc = self._hook_failed("a callback it set with ctx.clock.call_later", exc)
            self._on_fatal(exc)
        finally:
            self._depth -= 1
        self._check_stalled()

    def _check_stalled(self) -> None:
        """End the run (``on_fatal``) if it can never finish: samples it was given are unfinished while nothing
        runs, waits on a queue, a pause, a turn or a timer (watch.py). Called when the policy's code has returned
        (after an outermost pump, after a timer)."""
        if (self._depth or self._runs or self._where or self._held or self._parked or self.paused is not None
                or self._timers.pending or not self._open or self._stall_reported):
            return
        left = []
        for key, group in list(self._open.items()):
            unfinished = [s for s in group.samples if not s.finished]
            if unfinished:
                left += unfinished
            else:
                del self._open[key]
        if left:
            self._stall_reported = True
            self._on_fatal(stalled_error(self.policy, left))


def _raise(exc: BaseException) -> None:
    raise exc


def _overrides(policy: object, hook: str) -> bool:
    """True if ``policy`` defines ``hook`` itself rather than inheriting the base no-op."""
    impl = getattr(type(policy), hook, None)
    return impl is not None and impl is not getattr(Policy, hook, None)
