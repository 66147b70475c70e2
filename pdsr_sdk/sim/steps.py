"""Multi-step simulation: partial rollout across training steps (``pdsr simulate --steps K``).

A stream of the trace's groups (in order) runs through one policy on simulated engines; nothing
waits for a batch's longest sample:

- Step t keeps ``ceil(B x (1 + F))`` groups in flight (carried + newly launched; F = over-provision).
- The step ends at the moment B groups are complete and not yet consumed (counted in completion
  order: a group completing after the B-th, even in the same instant, is the next step's) and no
  *due* group (below) is incomplete. It consumes B complete groups (more only if more are due):
  due ones first, then the earliest launched. Its end is the trainer's weight update: the
  scheduler's ``policy_version`` becomes t + 1 (recorded on every segment launched from then on),
  new groups refill the in-flight count, and unfinished samples continue on their engines with
  their tokens.
- A segment's tokens carry the version its segment started under (segments are short when engines
  are busy), so a token's age at consumption is at least its true age. Off-policy tokens are both
  the older part of responses carried across a weight update and whole responses that finished
  under an older version while their group waited for its other samples.
- Staleness (``max_staleness`` S): at each step end, every sample of an unconsumed group whose oldest
  kept token is more than S versions old is restarted (``Scheduler.restart``; finished samples too),
  so no consumed token is older than S versions. Thrown-away tokens are counted as wasted.
- No starvation: a sample is restarted for staleness at most once. A group holding a restarted
  sample that would be too stale after the next version change is due: the step does not end
  before it completes and consumes it (no version changes while a step waits). So with S set every
  sample is generated at most twice, and a group is consumed at most S steps after the version
  under which its first restarted sample generated its first new token. Without S nothing is
  restarted: every launched sample runs to its end on FIFO queues. ``group_deadline`` D adds a hard
  bound: a group launched at step t is due at step t + D. Groups are complete when consumed (GRPO
  needs all N of a group).
- Drops: the groups still in flight after the last step (the next step's carry) are reported.

With F = 0 and no S every step launches B groups and waits for all of them: the on-policy run.
"""

from __future__ import annotations

import gc
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig
from pdsr_sdk.dispatch.run import STAT_KEYS, DispatchRun
from pdsr_sdk.dispatch.types import TRUNCATED, Group, Sample, SegmentRecord
from pdsr_sdk.errors import ConfigError, DataError, PdsrError
from pdsr_sdk.policies.resolve import resolve_policy
from pdsr_sdk.progress import ProgressFactory, silent_progress
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import build_batch, build_engines, check_pools, raise_fatal, trace_batches
from pdsr_sdk.sim.engine import SimEngine

#: over-provision values of the curve (``steps`` set, ``over_provision`` not)
CURVE = (0.0, 0.25, 0.5, 1.0)


@dataclass
class StepRecord:
    """One training step of a multi-step run."""

    index: int
    start_s: float
    end_s: float
    #: groups consumed at its end, and launched at its start (the refill after the previous step)
    groups: int
    launched: int
    #: response tokens of the consumed groups; those generated under an older version than the step's
    tokens: int
    off_policy_tokens: int
    #: the off-policy tokens of responses that crossed a weight update while being generated (their
    #: older part: the partial responses a step carried); the rest are whole responses finished under
    #: an older version while their group waited for its other samples
    partial_tokens: int
    #: tokens of the consumed groups by age in versions (step index - segment's policy_version)
    ages: dict[int, int]
    #: most steps a consumed group spent in flight (consumed step - launch step)
    max_group_lag: int
    #: restarts and wasted tokens during the step (all causes), and staleness restarts at its start
    restarts: int
    wasted_tokens: int
    stale_restarts: int
    #: seconds the step's end was held for an overdue group (group_deadline)
    held_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def max_age(self) -> int:
        return max((a for a, n in self.ages.items() if n), default=0)


@dataclass
class StepsRun:
    """One policy and over-provision over K steps."""

    policy: str
    over_provision: float
    step_groups: int
    in_flight: int
    max_staleness: int | None
    group_deadline: int | None
    steps: list[StepRecord]
    #: groups in flight after the last step (launched, not consumed) and their finished samples' tokens
    dropped_groups: int
    dropped_samples: int
    dropped_tokens: int
    stats: dict[str, int]
    events: int
    wall_s: float
    groups: list[Group] = field(default_factory=list)       # consumed groups (keep_groups)
    consumed_at: dict[str, int] = field(default_factory=dict)  # prompt id -> step it was consumed in
    launched_at: dict[str, int] = field(default_factory=dict)  # prompt id -> step it was launched in

    @property
    def step_times(self) -> list[float]:
        return [s.duration_s for s in self.steps]

    @property
    def steady_step_s(self) -> float:
        return steady_mean(self.step_times)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.steps)

    @property
    def off_policy_share(self) -> float:
        return sum(s.off_policy_tokens for s in self.steps) / self.tokens if self.tokens else 0.0

    @property
    def partial_share(self) -> float:
        return sum(s.partial_tokens for s in self.steps) / self.tokens if self.tokens else 0.0

    @property
    def ages(self) -> dict[int, int]:
        out: Counter[int] = Counter()
        for s in self.steps:
            out.update(s.ages)
        return dict(sorted(out.items()))

    @property
    def max_age(self) -> int:
        return max((s.max_age for s in self.steps), default=0)


def steady_window(k: int) -> slice:
    """Steps 3 to K-1 (1-based; the first two fill the pipeline, the last is cut short by nothing but
    is left out for symmetry with the issue's definition); all steps when K < 4."""
    return slice(2, k - 1) if k >= 4 else slice(0, k)


def steady_mean(values: list[float]) -> float:
    window = values[steady_window(len(values))]
    return sum(window) / len(window) if window else 0.0


def kept_segments(sample: Sample) -> list[SegmentRecord]:
    """The segments whose tokens the sample still holds (those after its last restart), including
    one running now (the simulator reports a segment's tokens when it ends)."""
    segs = sample.segments
    if not segs or (sample.num_generated == 0 and segs[-1].end_time_s is not None):
        return []
    i = len(segs) - 1
    while i > 0 and segs[i].start_token != 0:
        i -= 1
    return segs[i:]


def oldest_version(sample: Sample) -> int | None:
    """Policy version of the sample's oldest kept token (a running segment counts), None if none."""
    for seg in kept_segments(sample):
        if seg.num_tokens > 0 or seg.end_time_s is None:
            return seg.policy_version
    return None


def streaming_policies() -> list[str]:
    """Registered policies whose ``on_batch`` may be called while earlier groups run."""
    from pdsr_sdk.policies import POLICIES

    return [n for n in POLICIES.names() if getattr(POLICIES.get(n), "streaming", False)]


def policy_for_steps(cfg: SimulateConfig, name: str):
    """(class, settings) of a policy that can stream, or a ConfigError naming it and those that can."""
    if "," in name or name == "all":
        raise ConfigError(f"policy: --steps runs one policy; got {name!r}")
    cls, settings = resolve_policy(name, cfg.policy_settings.get(name, {}))
    if not getattr(cls, "streaming", False):
        raise ConfigError(f"policy {name!r} cannot run --steps: its on_batch keeps per-batch state (it waits for "
                          f"the whole batch's probes) and cannot take new groups while others run; policies that "
                          f"can: {', '.join(streaming_policies())}")
    check_pools(cls, cfg, name)
    return cls, settings


def stream_rows(trace, cfg: SimulateConfig, needed: int) -> list:
    """The trace's first ``needed`` groups as rows (see ``trace_batches``), or a DataError."""
    tb = trace_batches(trace, cfg.model_copy(update={"num_batches": None}))
    rows = [g for b in tb.batches for g in b]
    if len(rows) < needed:
        raise DataError(f"{tb.source}: {cfg.steps} steps of {cfg.step_groups or cfg.batch_size} groups with "
                        f"over-provision {cfg.over_provision or 0} need {needed} groups; the trace has {len(rows)}")
    return rows[:needed]


def groups_needed(cfg: SimulateConfig, over_provision: float) -> int:
    b = cfg.step_groups or cfg.batch_size
    return in_flight(b, over_provision) + (cfg.steps - 1) * b


def in_flight(b: int, over_provision: float) -> int:
    return max(b, math.ceil(b * (1.0 + over_provision) - 1e-9))


class _Stream:
    """The event handlers of one multi-step run (called by the scheduler and the clock)."""

    def __init__(self, run: DispatchRun, rows: list, cfg: SimulateConfig, over_provision: float,
                 keep_groups: bool, bar):
        self.run = run
        self.sched = run.scheduler
        self.clock = run.clock
        self.rows = rows
        self.next_row = 0
        self.b = cfg.step_groups or cfg.batch_size
        self.k = cfg.steps
        self.target = in_flight(self.b, over_provision)
        self.s = cfg.max_staleness
        self.d = cfg.group_deadline
        self.keep = keep_groups
        self.bar = bar
        self.t = 0
        # keyed by id(group) (groups are unhashable dataclasses)
        self.flying: dict[int, tuple[Group, int]] = {}   # in flight (launched, not consumed): (group, launch step)
        self.complete: dict[int, Group] = {}             # complete, not consumed, in completion order
        self.closing = False
        self.done = False
        self.start_s = 0.0
        self.held_since: float | None = None
        self.held_s = 0.0
        self.stale_restarts = 0
        self.stats0 = dict(self.sched.stats)
        self.records: list[StepRecord] = []
        self.consumed: list[Group] = []
        self.consumed_at: dict[str, int] = {}
        self.launched_at: dict[str, int] = {}
        self._pending: list[Group] = []
        self.restarted: dict[int, int] = {}    # id(sample) -> its restarts count once the staleness restart is done
        self.watch: dict[int, Group] = {}      # groups with such a sample (checked by _due)
        self._launched_now = 0

    # ------------------------------------------------------------ launching
    def launch(self, count: int) -> None:
        rows = self.rows[self.next_row:self.next_row + count]
        self.next_row += len(rows)
        groups = build_batch(rows)
        for g in groups:
            self.flying[id(g)] = (g, self.t)
            self.launched_at[g.prompt_id] = self.t
        self._launched_now = len(groups)
        self.run.add_groups(groups, self.t)

    # --------------------------------------------------------------- events
    def group_done(self, group: Group) -> None:
        if id(group) not in self.flying or id(group) in self.complete:
            return
        if self.s is not None and self._stale(group, self.sched.policy_version):
            # finished with tokens too old for this step (an abort found its last token generated):
            # regenerate them, after the scheduler's current callback
            self.clock.call_later(0.0, lambda: self._restart_stale(group, self.sched.policy_version))
            return
        self.complete[id(group)] = group
        self.maybe_end()

    def maybe_end(self) -> None:
        if self.closing or self.done or len(self.complete) < self.b:
            return
        now = self.clock.now()
        if any(key not in self.complete for key in self._due()):
            if self.held_since is None:
                self.held_since = now
            return
        if self.held_since is not None:
            self.held_s = now - self.held_since
        self.closing = True
        # due groups first, then the earliest launched (a stable sort keeps completion order within a
        # launch step); every due group is taken even if that makes more than B
        due = self._due()
        order = sorted(self.complete.values(), key=lambda g: (id(g) not in due, self.flying[id(g)][1]))
        self._pending = order[:max(self.b, len(due))]
        self.end_s = now
        # the weight update: segments launched from now on are generated by the next version
        self.sched.policy_version = self.t + 1
        self.clock.call_later(0.0, self.after_step)

    def _due(self) -> set[int]:
        """Groups that must be consumed at this step: at their deadline, or holding a sample that was
        restarted for staleness once and would be too stale after the next version change."""
        due = set()
        if self.d is not None:
            due.update(key for key, (_, step) in self.flying.items() if step + self.d <= self.t)
        if self.s is not None:
            for key in list(self.watch):
                if key not in self.flying:
                    del self.watch[key]
                elif self._stale(self.watch[key], self.t + 1, restarted_only=True):
                    due.add(key)
        return due

    def after_step(self) -> None:
        t = self.t
        consumed = self._pending
        lags = []
        for g in consumed:
            lags.append(t - self.flying.pop(id(g))[1])
            del self.complete[id(g)]
            self.consumed_at[g.prompt_id] = t
        ages: Counter[int] = Counter()
        partial = 0
        for g in consumed:
            for s in g.samples:
                _check_sample(s, t)
                segs = [seg for seg in kept_segments(s) if seg.num_tokens]
                mixed = len(segs) > 1 and segs[0].policy_version != segs[-1].policy_version
                for seg in segs:
                    ages[t - seg.policy_version] += seg.num_tokens
                    if mixed and seg.policy_version < t:
                        partial += seg.num_tokens
        stats = self.sched.stats
        tokens = sum(ages.values())
        self.records.append(StepRecord(
            index=t, start_s=self.start_s, end_s=self.end_s, groups=len(consumed), launched=self._launched_now,
            tokens=tokens, off_policy_tokens=tokens - ages.get(0, 0), partial_tokens=partial,
            ages=dict(sorted(ages.items())), max_group_lag=max(lags, default=0),
            restarts=stats["restarts"] - self.stats0.get("restarts", 0),
            wasted_tokens=stats["wasted_tokens"] - self.stats0.get("wasted_tokens", 0),
            stale_restarts=self.stale_restarts, held_s=self.held_s))
        self.stats0 = dict(stats)
        self.stale_restarts = 0
        if self.keep:
            self.consumed.extend(consumed)
        self.bar.update(1)
        self.t = t = t + 1
        self._pending = []
        if t == self.k:
            self.done = True
            return
        if self.s is not None:
            for g, _ in list(self.flying.values()):
                self._restart_stale(g, t)
        self.launch(self.target - len(self.flying))
        self.start_s = self.clock.now()
        self.held_since = None
        self.held_s = 0.0
        self.closing = False
        self.maybe_end()

    # ------------------------------------------------------------ staleness
    def _restarted(self, s: Sample) -> bool:
        """Whether a staleness restart of ``s`` took effect (one of a running sample is only asked for
        until its abort comes back; if that finds its last token generated, it never happened)."""
        want = self.restarted.get(id(s))
        return want is not None and s.restarts >= want

    def _stale(self, group: Group, version: int, *, restarted_only: bool = False) -> bool:
        return any((v := oldest_version(s)) is not None and version - v > self.s
                   and (not restarted_only or self._restarted(s)) for s in group.samples)

    def _restart_stale(self, group: Group, version: int) -> None:
        """Restart the group's samples whose oldest kept token is more than S versions older than
        ``version`` (each at most once: ``_due`` makes the step wait rather than restart one again)."""
        if id(group) not in self.flying:
            return
        for s in group.samples:
            v = oldest_version(s)
            if v is not None and version - v > self.s:
                if self._restarted(s):
                    raise PdsrError(f"step {self.t}: sample {s.key} would be restarted for staleness a second "
                                    f"time (the step should have waited for it; a bug)")
                self.restarted[id(s)] = s.restarts + 1
                self.watch[id(group)] = group
                self.sched.restart(s)
                self.stale_restarts += 1
                self.complete.pop(id(group), None)


def _check_sample(s: Sample, step: int) -> None:
    kept = sum(seg.num_tokens for seg in kept_segments(s))
    if (not s.finished or kept != s.num_generated
            or (s.num_generated != s.max_tokens and s.finish_reason != TRUNCATED)):
        raise PdsrError(f"step {step}: sample {s.key} consumed with {s.num_generated} of {s.max_tokens} tokens "
                        f"({kept} in kept segments, {s.finish_reason}); the simulation lost tokens (a bug)")


def run_steps(trace, cfg: SimulateConfig, name: str, over_provision: float, *, keep_groups: bool = False,
              progress: ProgressFactory = silent_progress) -> StepsRun:
    """Simulate ``cfg.steps`` training steps of policy ``name`` with ``over_provision`` (see the module)."""
    if cfg.steps is None:
        raise ConfigError("steps: a multi-step run needs steps (K)")
    cls, settings = policy_for_steps(cfg, name)
    rows = stream_rows(trace, cfg, groups_needed(cfg, over_provision))
    clock = VirtualClock()
    engines = build_engines(cfg, clock, record=False)
    fatal: list[BaseException] = []
    handlers: list[_Stream] = []
    run = DispatchRun(engines, cls, settings, clock,
                      SamplingConfig(n=max(len(r[2]) for r in rows), max_tokens=max(max(r[2]) for r in rows),
                                     ignore_eos=True),
                      cfg.segments, on_fatal=fatal.append, busy_s=SimEngine.busy_s_at,
                      on_group_done=lambda g: handlers[0].group_done(g))
    bar = progress(desc=f"steps {name} F={over_provision:g}", total=cfg.steps, unit="step")
    stream = _Stream(run, rows, cfg, over_provision, keep_groups, bar)
    handlers.append(stream)
    wall0 = time.perf_counter()
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()   # as in run_policy: many small objects, no cycles
    events = 0
    try:
        try:
            stream.launch(stream.target)
            stream.maybe_end()
        except PdsrError as exc:
            fatal.append(exc)
        if not fatal:
            events = clock.run(until=lambda: stream.done or bool(fatal))
        if fatal:
            raise_fatal(fatal[0], name, f"step {stream.t}")
        if not stream.done:
            raise PdsrError(f"policy {name!r}: step {stream.t} stalled with {len(stream.flying)} groups in "
                            f"flight, {len(stream.complete)} complete (nothing left to run)")
    finally:
        if gc_was_enabled:
            gc.enable()
        bar.close()
    left = [g for g, _ in stream.flying.values()]
    totals = {k: run.scheduler.stats.get(k, 0) for k in STAT_KEYS}
    return StepsRun(
        policy=name, over_provision=over_provision, step_groups=stream.b, in_flight=stream.target,
        max_staleness=cfg.max_staleness, group_deadline=stream.d, steps=stream.records,
        dropped_groups=len(left), dropped_samples=sum(1 for g in left for s in g.samples if s.finished),
        dropped_tokens=sum(s.num_generated for g in left for s in g.samples),
        stats=totals, events=events, wall_s=time.perf_counter() - wall0, groups=stream.consumed,
        consumed_at=stream.consumed_at, launched_at=stream.launched_at)


def on_policy_steps(trace, cfg: SimulateConfig, *, progress: ProgressFactory = silent_progress) -> list[float]:
    """Makespans of the ordinary batch simulation with ``baseline`` at the same B over K batches."""
    from pdsr_sdk.sim.driver import run_policy

    b = cfg.step_groups or cfg.batch_size
    base_cfg = cfg.model_copy(update={"batch_size": b, "num_batches": cfg.steps})
    batches = trace_batches(trace, base_cfg)
    if len(batches.batches) < cfg.steps:
        raise DataError(f"{batches.source}: the on-policy baseline needs {cfg.steps} batches of {b} groups; the "
                        f"trace has {batches.num_groups} groups")
    run = run_policy(batches, base_cfg, "baseline", record=False, progress=progress)
    return [o.makespan_s for o in run.batches]


@dataclass
class StepsReport:
    """The on-policy baseline and one multi-step run per over-provision value."""

    cfg: SimulateConfig
    baseline_steps_s: list[float]
    runs: list[StepsRun]
    plots: list[str] = field(default_factory=list)

    @property
    def baseline_step_s(self) -> float:
        """Mean on-policy step over the same window as the steady state (steps 3 to K-1)."""
        return steady_mean(self.baseline_steps_s)

    def summary(self, r: StepsRun) -> dict[str, Any]:
        base = self.baseline_step_s
        return {
            "policy": r.policy, "over_provision": r.over_provision, "step_groups": r.step_groups,
            "in_flight": r.in_flight, "max_staleness": r.max_staleness, "group_deadline": r.group_deadline,
            "steady_step_s": r.steady_step_s, "baseline_step_s": base,
            "ratio": r.steady_step_s / base if base > 0 else None,
            "off_policy_share": r.off_policy_share, "partial_share": r.partial_share, "max_age": r.max_age,
            "ages": {str(a): n for a, n in r.ages.items()},
            "restarts": r.stats.get("restarts", 0), "stale_restarts": sum(s.stale_restarts for s in r.steps),
            "wasted_tokens": r.stats.get("wasted_tokens", 0), "tokens": r.tokens,
            "dropped_groups": r.dropped_groups, "dropped_samples": r.dropped_samples,
            "dropped_tokens": r.dropped_tokens, "held_s": sum(s.held_s for s in r.steps),
            "max_group_lag": max((s.max_group_lag for s in r.steps), default=0),
            "events": r.events, "sim_wall_s": r.wall_s,
            "steps": [{"step": s.index + 1, "start_s": s.start_s, "time_s": s.duration_s, "groups": s.groups,
                       "launched": s.launched, "tokens": s.tokens, "off_policy_tokens": s.off_policy_tokens,
                       "partial_tokens": s.partial_tokens,
                       "ages": {str(a): n for a, n in s.ages.items()}, "max_group_lag": s.max_group_lag,
                       "restarts": s.restarts, "stale_restarts": s.stale_restarts, "wasted_tokens": s.wasted_tokens,
                       "held_s": s.held_s} for s in r.steps],
        }

    def rows(self) -> list[dict[str, Any]]:
        """One row per over-provision value: the curve of step time against off-policy share."""
        out = []
        for r in self.runs:
            s = self.summary(r)
            out.append({"F": r.over_provision, "in_flight": r.in_flight, "step_s": s["steady_step_s"],
                        "on_policy_s": s["baseline_step_s"], "ratio": s["ratio"],
                        "off_policy": s["off_policy_share"], "partial": s["partial_share"], "max_age": s["max_age"],
                        "restarts": s["restarts"], "wasted": s["wasted_tokens"], "held_s": s["held_s"],
                        "max_lag": s["max_group_lag"], "dropped": s["dropped_groups"]})
        return out

    def step_rows(self, r: StepsRun) -> list[dict[str, Any]]:
        """Per-step rows of one run, next to the on-policy step of the same index."""
        return [{"step": s.index + 1, "time_s": s.duration_s,
                 "on_policy_s": self.baseline_steps_s[s.index] if s.index < len(self.baseline_steps_s) else None,
                 "groups": s.groups, "off_policy": s.off_policy_tokens / s.tokens if s.tokens else 0.0,
                 "partial": s.partial_tokens / s.tokens if s.tokens else 0.0,
                 "max_age": s.max_age, "restarts": s.restarts, "wasted": s.wasted_tokens, "held_s": s.held_s}
                for s in r.steps]

    def to_dict(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "trace": str(cfg.trace) if cfg.trace is not None else None, "steps": cfg.steps,
            "step_groups": cfg.step_groups or cfg.batch_size, "max_staleness": cfg.max_staleness,
            "group_deadline": cfg.group_deadline,
            "engines": {"fast": {"count": cfg.fast, **cfg.profiles.fast.model_dump()},
                        "heavy": {"count": cfg.heavy, **cfg.profiles.heavy.model_dump()}},
            "segments": cfg.segments.model_dump(),
            "definitions": DEFINITIONS,
            "on_policy": {"policy": "baseline", "steps_s": self.baseline_steps_s, "step_s": self.baseline_step_s},
            "runs": [self.summary(r) for r in self.runs],
            "plots": self.plots,
        }


DEFINITIONS = {
    "time_s": "Virtual seconds from the previous step's end to the moment B complete groups were there.",
    "steady_step_s": "Mean step time over steps 3 to K-1 (all steps when K < 4).",
    "baseline_step_s": "Mean makespan of the ordinary on-policy batch simulation (baseline policy, B groups a "
                       "batch) over the same steps.",
    "ratio": "steady_step_s / baseline_step_s.",
    "off_policy_share": "Tokens of consumed groups generated under an older policy version than their step's, "
                        "over all consumed tokens (a segment's tokens carry the version it started under).",
    "partial_share": "The part of off_policy_share from responses that crossed a weight update while being "
                     "generated (their older tokens: the partial responses steps carried); the rest is whole "
                     "responses finished under an older version while their group waited for its other samples.",
    "ages": "Consumed tokens by age in versions (step - version of their segment).",
    "restarts": "Samples restarted (all causes); stale_restarts: those for max_staleness. wasted_tokens: their "
                "thrown-away tokens.",
    "held_s": "Seconds step ends were held for due groups (a restarted sample about to be too stale again, or "
              "group_deadline).",
    "max_group_lag": "Most steps a consumed group was in flight (consumed step - launch step).",
    "dropped_groups": "Groups still in flight after the last step (the next step's carry); dropped_tokens: "
                      "their samples' reported tokens.",
}


def simulate_steps(trace, cfg: SimulateConfig, *, progress: ProgressFactory = silent_progress,
                   keep_groups: bool = False) -> StepsReport:
    """The on-policy baseline and a multi-step run for ``cfg.over_provision`` (or each value of CURVE)."""
    name = cfg.policy
    policy_for_steps(cfg, name)   # fail before the baseline runs
    values = CURVE if cfg.over_provision is None else (cfg.over_provision,)
    for f in values:
        stream_rows(trace, cfg, groups_needed(cfg, f))
    base = on_policy_steps(trace, cfg, progress=progress)
    runs = [run_steps(trace, cfg, name, f, keep_groups=keep_groups, progress=progress) for f in values]
    return StepsReport(cfg, base, runs)


def write_steps_plot(report: StepsReport, path) -> str:
    """PNG: steady step time / on-policy step against the off-policy token share, one point per F."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pdsr_sdk.io.tables import write_png

    rows = report.rows()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    xs = [r["off_policy"] * 100 for r in rows]
    ys = [r["ratio"] or 0.0 for r in rows]
    ax.plot(xs, ys, "o-", color="tab:blue", label="all off-policy tokens")
    ax.plot([r["partial"] * 100 for r in rows], ys, "o--", color="tab:orange", mfc="none",
            label="of them: carried partial responses")
    ax.legend(fontsize=8, loc="lower right")
    for x, y, r in zip(xs, ys, rows):
        ax.annotate(f"F={r['F']:g}", (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("off-policy tokens (%)")
    ax.set_ylabel("steady step / on-policy step")
    cfg = report.cfg
    s = "none" if cfg.max_staleness is None else str(cfg.max_staleness)
    ax.set_title(f"{report.runs[0].policy}, B={cfg.step_groups or cfg.batch_size}, K={cfg.steps}, "
                 f"max staleness {s}", fontsize=9)
    ax.set_ylim(bottom=0)
    write_png(fig, path)
    return str(path)
