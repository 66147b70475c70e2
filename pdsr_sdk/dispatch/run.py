"""One dispatch run: a policy instance on a set of engines through one scheduler, batch after batch.

The rollout session (wall clock: it awaits each batch) and the simulator (virtual clock: it runs the
clock until the batch is done) both start their runs here, so the scheduler is wired the same way
and every batch is reported with the same numbers and the same stat keys::

    run = DispatchRun(engines, policy_cls, settings, clock, sampling, segments)
    run.start_batch(groups, on_done)        # returns at once; on_done() when its last sample finishes
    ...                                     # let the clock run: await, or clock.run(until=...)
    report = run.finish_batch()             # a BatchReport

or, streaming (``pdsr simulate --steps``), ``run.add_groups(groups, step)`` whenever more groups should
run, with ``on_group_done`` reporting each group as it completes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from pdsr_sdk.dispatch.protocols import Clock, Dispatcher, Engine
from pdsr_sdk.dispatch.scheduler import Scheduler
from pdsr_sdk.dispatch.scheduler.watch import hook_error, policy_label
from pdsr_sdk.dispatch.types import Group, Sample, StreamSpec
from pdsr_sdk.errors import ConfigError, PdsrError, RunError

if TYPE_CHECKING:
    from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig

#: counters every batch report has (0 when nothing happened); scheduler and policy counters
#: (``ctx.count``) that are not listed here appear in a report only when they moved
STAT_KEYS = ("probes", "offloaded_prompts", "breaks", "moves", "steals", "restarts", "wasted_tokens",
             "retries", "truncations", "probe_timeouts", "steal_timeouts", "engines_lost")
#: the shortest span a batch's tokens/s is given for (the summary's makespan_s has 4 decimals); shorter: 0.0
MIN_RATE_SPAN_S = 1e-4


@dataclass
class BatchReport:
    """One finished batch: its groups and what it cost."""

    batch_index: int
    groups: list[Group]
    #: clock time (seconds since the run started) when the batch started and when its last sample finished
    start_s: float
    end_s: float
    makespan_s: float
    #: response tokens of the batch's samples (tokens thrown away by restarts not counted)
    tokens: int
    #: per engine, the seconds it was busy during the batch (see DispatchRun's ``busy_s``)
    engine_busy_s: dict[str, float]
    #: counters of the batch: every key of STAT_KEYS, and any other counter that moved
    stats: dict[str, int]
    #: the policy's facts about the batch (``Policy.batch_report()``, e.g. v2.5's l_cut and fast_cap)
    policy: dict[str, Any] = field(default_factory=dict)
    #: the errors of the engines lost during the batch (``stats["engines_lost"]`` counts them), as text
    engine_errors: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        # a step that ended at once (its groups complete when it began) spans microseconds: its tokens came in the
        # step before, and tokens / span would be hundreds of millions. Such a span shows as 0 s in the summary
        # (4 decimals), which a resume recomputes the rate from: 0.0 both ways
        return self.tokens / self.makespan_s if self.makespan_s >= MIN_RATE_SPAN_S else 0.0


class DispatchRun:
    """A scheduler with one policy instance (``policy_cls(settings, scheduler)``) over ``engines``,
    the engines bound to it, and per-batch counters.

    ``busy_s(engine, now)``: the engine's busy seconds up to ``now`` (cumulative); default: the
    seconds the scheduler had at least one request running on it. The simulator passes
    :meth:`SimEngine.busy_s_at <pdsr_sdk.sim.engine.SimEngine.busy_s_at>` (seconds a step was running).
    ``on_fatal`` receives a policy's exception or the loss of a pool's last engine (default: raise).
    ``on_restart`` receives each sample whose restart takes effect (its tokens just thrown away, before it
    is generated again from its prompt). ``on_turn_end`` and ``hold_turn_slots``: multi-turn samples
    (:class:`~pdsr_sdk.dispatch.scheduler.Scheduler`). ``on_tokens(sample, n)``: a sample's ``n`` new tokens, once
    added to it (a server streams them).
    """

    def __init__(self, engines: Sequence[Engine], policy_cls: Callable[[Any, Any], Dispatcher], settings: Any,
                 clock: Clock, sampling: SamplingConfig, segments: SegmentConfig, *, policy_version: int = 0,
                 on_sample_done: Callable[[Sample], None] | None = None,
                 on_group_done: Callable[[Group], None] | None = None,
                 on_fatal: Callable[[BaseException], None] | None = None,
                 on_restart: Callable[[Sample], None] | None = None,
                 on_turn_end: Callable[[Sample, str], None] | None = None,
                 hold_turn_slots: bool = False,
                 on_tokens: Callable[[Sample, int], None] | None = None,
                 busy_s: Callable[[Engine, float], float] | None = None,
                 first_batch_index: int = 0):
        self.scheduler = Scheduler(
            engines, lambda ctx: policy_cls(settings, ctx), clock, sampling, segments,
            policy_version=policy_version, on_sample_done=on_sample_done, on_group_done=on_group_done,
            on_fatal=on_fatal, on_restart=on_restart, on_turn_end=on_turn_end, hold_turn_slots=hold_turn_slots,
            on_tokens=on_tokens)
        for engine in self.scheduler.engines:
            engine.bind(self.scheduler)
        self._busy_s = busy_s or self._slot_busy_s
        #: index the next batch gets
        self.batch_index = first_batch_index
        self._groups: list[Group] | None = None
        self._start = 0.0
        self._end: float | None = None
        self._stats0: dict[str, int] = {}
        self._errors0 = 0   # engine errors the scheduler had when the batch (or span) began
        self._busy0: dict[str, float] = {}

    @property
    def policy(self) -> Dispatcher:
        return self.scheduler.policy

    @property
    def clock(self) -> Clock:
        return self.scheduler.clock

    @property
    def engines(self) -> list[Engine]:
        return self.scheduler.engines

    def start_batch(self, groups: list[Group], on_done: Callable[[], None] | None = None) -> None:
        """Stamp the groups with the batch index, take the counters, hand the batch to the policy.
        ``on_done()`` runs when its last sample finishes (at once if every group is already done)."""
        for g in groups:
            g.batch_index = self.batch_index
        clock = self.scheduler.clock
        self._groups = groups
        self._start = now = clock.now()
        self._end = None
        self._stats0 = dict(self.scheduler.stats)
        self._errors0 = len(self.scheduler.engine_errors)
        self._busy0 = self._engine_busy(now)

        def done() -> None:
            self._end = clock.now()
            if on_done is not None:
                on_done()

        self.scheduler.start_batch(groups, done)

    def add_groups(self, groups: list[Group], batch_index: int, stream: StreamSpec | None = None) -> None:
        """Streaming: stamp the groups with ``batch_index`` (e.g. the step they were launched in) and hand
        them to the policy while earlier groups may still run; each group's end reaches ``on_group_done``.
        Only for a policy whose ``streaming`` is True (its ``on_batch`` may be called mid-run); batch
        reports (``finish_batch``) do not apply. ``stream`` describes the stream to the policy
        (``DispatchContext.stream``: its staleness bound, ...)."""
        if not getattr(self.policy, "streaming", False):
            raise ConfigError(f"policy {getattr(self.policy, 'name', '') or type(self.policy).__name__!r} cannot take "
                              f"groups while others run (its on_batch keeps per-batch state; streaming is False)")
        for g in groups:
            g.batch_index = batch_index
        self.scheduler.add_groups(groups, stream)

    @property
    def batch_done(self) -> bool:
        """True once the batch started last has finished."""
        return self._end is not None

    def finish_batch(self) -> BatchReport:
        """The report of the finished batch; the next batch gets the next index."""
        if self._groups is None or self._end is None:
            raise RunError("finish_batch: no finished batch (start one with start_batch and wait until batch_done)")
        report = self._report(self._groups, self._start, self._end)
        self._groups = None
        return report

    def begin_span(self) -> None:
        """Streaming: take the counters that the next :meth:`report_span` measures from (a step's start)."""
        self._stats0 = dict(self.scheduler.stats)
        self._errors0 = len(self.scheduler.engine_errors)
        self._busy0 = self._engine_busy(self.scheduler.clock.now())

    def report_span(self, groups: list[Group], start_s: float, end_s: float) -> BatchReport:
        """Streaming: the report of one step, from ``start_s`` to ``end_s`` with the ``groups`` it
        consumed, counters since :meth:`begin_span`; the next report gets the next index."""
        return self._report(groups, start_s, end_s)

    def _report(self, groups: list[Group], start: float, end: float) -> BatchReport:
        sched = self.scheduler
        busy = self._engine_busy(end)
        stats = dict.fromkeys(STAT_KEYS, 0)
        stats0 = self._stats0
        for key, value in sched.stats.items():
            delta = value - stats0.get(key, 0)
            if delta:
                stats[key] = delta
        report = BatchReport(
            batch_index=self.batch_index, groups=groups, start_s=start, end_s=end, makespan_s=end - start,
            tokens=sum(s.sampled_tokens for g in groups for s in g.samples),
            engine_busy_s={name: b - self._busy0.get(name, 0.0) for name, b in busy.items()},
            stats=stats, policy=self._policy_facts(),
            engine_errors=[str(e) for e in sched.engine_errors[self._errors0:]])
        self.batch_index += 1
        return report

    def _policy_facts(self) -> dict[str, Any]:
        """The policy's ``batch_report()``; what it raises or a value that is not a mapping is a RunError naming
        the policy and the hook."""
        facts = getattr(self.policy, "batch_report", None)
        if facts is None:
            return {}
        try:
            got = facts()
        except PdsrError:
            raise
        except Exception as exc:
            raise hook_error(self.policy, "batch_report", exc) from exc
        if not isinstance(got, Mapping):
            raise RunError(f"policy {policy_label(self.policy)}: batch_report returned {type(got).__name__} "
                           f"{got!r:.80}; it returns a dict of the batch's facts (name -> value), {{}} for none")
        return dict(got)

    def _engine_busy(self, now: float) -> dict[str, float]:
        return {e.name: self._busy_s(e, now) for e in self.scheduler.engines}

    def _slot_busy_s(self, engine: Engine, now: float) -> float:
        usage = self.scheduler.usage[engine.name]
        return usage.busy_s + (now - usage.busy_since if usage.busy_since is not None else 0.0)
