"""Multi-step simulation: partial rollout across training steps (``pdsr simulate --steps K``).

A stream of the trace's groups (in order) runs through one policy on simulated engines, with the
step accounting of :mod:`pdsr_sdk.dispatch.steps` (over-provision, step ends, staleness restarts,
due groups). A step's end does what a session's does: it aborts the running samples, keeping their
tokens (they resume under the new version and prefill their context again: the update resets the
engines' caches), and the policy version goes up; by default the trainer and the load take no time,
and ``trainer_s``, ``weight_update_s`` and ``pipeline`` give them time, synchronous or overlapping
the next step (:mod:`pdsr_sdk.sim.trainer`). Every consumed sample is checked to hold exactly its
trace length. Drops: the groups still in flight after the last step (the next step's carry) are
reported. With F = 0 and no S every step launches B groups and waits for all of them: the
on-policy run.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig
from pdsr_sdk.dispatch.run import STAT_KEYS, DispatchRun
from pdsr_sdk.dispatch.steps import StepRecord, StepStream, in_flight
from pdsr_sdk.dispatch.types import Group, Sample
from pdsr_sdk.errors import ConfigError, DataError, PdsrError
from pdsr_sdk.policies.resolve import check_streaming, resolve_policy
from pdsr_sdk.progress import ProgressFactory, silent_progress
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import (bound_coefficients, build_batch, build_engines, check_pools, raise_fatal,
                                 sample_bounds, trace_batches)
from pdsr_sdk.sim.engine import SimEngine
from pdsr_sdk.sim.redraw import cap_chance, cap_prior, redraw_length
from pdsr_sdk.sim.trainer import SimTrainer
from pdsr_sdk.sim.usage import EngineUse, engine_use

#: over-provision values of the curve (``steps`` set, ``over_provision`` not)
CURVE = (0.0, 0.25, 0.5, 1.0)
#: ... and of the search for the fastest within a partial-share budget (``max_partial_share``)
SEARCH = tuple(round(0.05 * i, 2) for i in range(11))


def curve_values(cfg: SimulateConfig) -> tuple[float, ...]:
    """The over-provision values a multi-step run simulates: the one asked for, the curve's, or the search's
    (of those that keep the same number of groups in flight, only the smallest: a small B rounds several alike)."""
    if cfg.over_provision is not None:
        return (cfg.over_provision,)
    if cfg.max_partial_share is None:
        return CURVE
    b = cfg.step_groups or cfg.batch_size
    first: dict[int, float] = {}
    for f in SEARCH:
        first.setdefault(in_flight(b, f), f)
    return tuple(first.values())


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
    #: per step, the engine time its consumed groups' tokens need at least / engines (see work_bound_s)
    work_bounds_s: list[float] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)       # consumed groups (keep_groups)
    consumed_at: dict[str, int] = field(default_factory=dict)  # prompt id -> step it was consumed in
    launched_at: dict[str, int] = field(default_factory=dict)  # prompt id -> step it was launched in
    #: each engine's counters over the run (:mod:`pdsr_sdk.sim.usage`), and the virtual time the run took
    engines: list[EngineUse] = field(default_factory=list)
    horizon_s: float = 0.0
    #: the policy's facts at the run's end (``Policy.batch_report()``, e.g. v3's tail lane)
    policy_facts: dict[str, Any] = field(default_factory=dict)

    @property
    def step_times(self) -> list[float]:
        """Each step's time from the previous step's end (the first: from the run's start) to its own; with a
        synchronous trainer (``trainer_s``) it includes the training and the weight load."""
        ends = [s.end_s for s in self.steps]
        return [e - p for e, p in zip(ends, [self.steps[0].start_s] + ends[:-1])] if ends else []

    @property
    def steady_step_s(self) -> float:
        return steady_mean(self.step_times)

    @property
    def work_bound_s(self) -> float:
        """Steady-state mean of the steps' work bounds: a step if every token it consumes were generated at
        full occupancy and nothing were wasted."""
        return steady_mean(self.work_bounds_s)

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


def policy_for_steps(cfg: SimulateConfig, name: str):
    """(class, settings) of a policy that can stream, or a ConfigError naming it and those that can."""
    if "," in name or name == "all":
        raise ConfigError(f"policy: --steps runs one policy; got {name!r}")
    cls, settings = resolve_policy(name, cfg.policy_settings.get(name, {}))
    check_streaming(cls, name)
    check_pools(cls, cfg, name)
    return cls, settings


def stream_rows(trace, cfg: SimulateConfig, needed: int) -> list:
    """The trace's groups as rows (see ``trace_batches``), in order, or a DataError if it has fewer than
    ``needed``. All of them: steps that take due groups beyond B consume more than ``needed``."""
    tb = trace_batches(trace, cfg.model_copy(update={"num_batches": None}))
    rows = [g for b in tb.batches for g in b]
    if len(rows) < needed:
        raise DataError(f"{tb.source}: {cfg.steps} steps of {cfg.step_groups or cfg.batch_size} groups with "
                        f"over-provision {cfg.over_provision or 0} need {needed} groups; the trace has {len(rows)}")
    return rows


def groups_needed(cfg: SimulateConfig, over_provision: float) -> int:
    b = cfg.step_groups or cfg.batch_size
    return in_flight(b, over_provision) + (cfg.steps - 1) * b


def builtin_trace_groups(cfg: SimulateConfig) -> int:
    """Groups the built-in trace (``traces.default_trace_path``) needs for ``cfg``, as a multiple of 512 and at
    least 1,024 (so that runs share a few cached files): every step at the curve's largest over-provision, or
    ``num_batches`` batches."""
    if cfg.steps is not None:
        need = max(groups_needed(cfg, f) for f in curve_values(cfg))
    else:
        need = cfg.batch_size * (cfg.num_batches or 1)
    return max(1024, -(-need // 512) * 512)


def _capped(lengths, reasons, cap: int) -> list[bool]:
    """Which of a group's responses reached the cap: by their finish reasons where the trace has them."""
    return [r == "length" for r in reasons] if reasons else [n >= cap for n in lengths]


def fresh_lengths(rows, cap: int) -> Callable[[Sample], None]:
    """The restart hook of ``restart_lengths: redraw``: a restarted sample gets a fresh length
    (:func:`pdsr_sdk.sim.redraw.redraw_length`), drawn once per sample and restart; ``cap``: the
    response cap (the trace's longest response)."""
    share, strength = cap_prior([_capped(r[2], r[3], cap) for r in rows])

    def on_restart(s: Sample) -> None:
        g = s.group
        capped = _capped(g.target_lengths, g.target_finish_reasons, cap)
        s.max_tokens = redraw_length(g.target_lengths, capped, cap, cap_chance(capped, share, strength),
                                     f"{g.prompt_id}/{s.index}/{s.restarts}")
    return on_restart


def run_steps(trace, cfg: SimulateConfig, name: str, over_provision: float, *, keep_groups: bool = False,
              progress: ProgressFactory = silent_progress) -> StepsRun:
    """Simulate ``cfg.steps`` training steps of policy ``name`` with ``over_provision`` (see the module); the
    engines record their occupancy over time where a timeline will be drawn (``cfg.timeline`` and ``cfg.out_dir``)."""
    if cfg.steps is None:
        raise ConfigError("steps: a multi-step run needs steps (K)")
    cls, settings = policy_for_steps(cfg, name)
    rows = stream_rows(trace, cfg, groups_needed(cfg, over_provision))
    clock = VirtualClock()
    record = cfg.timeline and cfg.out_dir is not None
    engines = build_engines(cfg, clock, record=record)
    fatal: list[BaseException] = []
    handlers: list[StepStream] = []
    longest = max(max(r[2]) for r in rows)
    run = DispatchRun(engines, cls, settings, clock,
                      SamplingConfig(n=max(len(r[2]) for r in rows), max_tokens=longest, ignore_eos=True),
                      cfg.segments, on_fatal=fatal.append, busy_s=SimEngine.busy_s_at,
                      on_group_done=lambda g: handlers[0].group_done(g),
                      on_restart=fresh_lengths(rows, longest) if cfg.restart_lengths == "redraw" else None)
    bar = progress(desc=f"steps {name} F={over_provision:g}", total=cfg.steps, unit="step")
    b = cfg.step_groups or cfg.batch_size
    next_row = 0
    coeffs = bound_coefficients(cfg)
    bounds: list[float] = []

    def new_groups(count: int) -> list[Group]:
        nonlocal next_row
        taken = rows[next_row:next_row + count]
        next_row += len(taken)
        return build_batch(taken)

    # after the first step the engines also stop for each update, and without pipelining for the trainer too
    stopped_s = cfg.weight_update_s + (0.0 if cfg.pipeline else cfg.trainer_s)

    def step_end() -> None:
        bounds.append(step_work_bound(stream.pending, len(engines), cfg, coeffs) + (stopped_s if bounds else 0.0))
        trainer.step_end()

    stream = StepStream(run, step_groups=b, in_flight=in_flight(b, over_provision), steps=cfg.steps,
                        max_staleness=cfg.max_staleness, group_deadline=cfg.group_deadline,
                        new_groups=new_groups, on_step_end=step_end, keep_groups=keep_groups, check=True,
                        on_advance=lambda: bar.update(1))
    handlers.append(stream)
    trainer = SimTrainer(stream, trainer_s=cfg.trainer_s, weight_update_s=cfg.weight_update_s, pipeline=cfg.pipeline)
    wall0 = time.perf_counter()
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()   # as in run_policy: many small objects, no cycles
    events = 0
    try:
        try:
            stream.start()
        except PdsrError as exc:
            fatal.append(exc)
        if not fatal:
            events = clock.run(until=lambda: stream.done or bool(fatal))
        if fatal:
            raise_fatal(fatal[0], name, f"step {stream.t}")
        if not stream.done and stream.exhausted and not stream.flying:
            raise DataError(f"{cfg.trace}: the trace ran out of groups at step {stream.t + 1} of {cfg.steps} (steps "
                            f"that must take due groups consume more than {b} each); give a longer trace")
        if not stream.done:
            raise PdsrError(f"policy {name!r}: step {stream.t} stalled with {len(stream.flying)} groups in "
                            f"flight, {len(stream.complete)} complete (nothing left to run)")
    finally:
        if gc_was_enabled:
            gc.enable()
        bar.close()
    left = [g for g, _ in stream.flying.values()]
    totals = {k: run.scheduler.stats.get(k, 0) for k in STAT_KEYS}
    report = getattr(run.policy, "batch_report", None)
    facts = dict(report()) if report is not None else {}
    end = clock.now()
    return StepsRun(
        policy=name, over_provision=over_provision, step_groups=stream.b, in_flight=stream.target,
        max_staleness=cfg.max_staleness, group_deadline=stream.d, steps=stream.records,
        dropped_groups=len(left), dropped_samples=sum(1 for g in left for s in g.samples if s.finished),
        dropped_tokens=sum(s.num_generated for g in left for s in g.samples),
        stats=totals, events=events, wall_s=time.perf_counter() - wall0, work_bounds_s=bounds[:len(stream.records)],
        groups=stream.consumed,
        consumed_at=stream.consumed_at, launched_at=stream.launched_at,
        engines=engine_use(engines, end, set(facts.get("lane_engines", ())), occupancy=record),
        horizon_s=end, policy_facts=facts)


def step_work_bound(groups: list[Group], engines: int, cfg: SimulateConfig, coeffs: dict[str, float]) -> float:
    """The least engine time the kept tokens of a step's consumed groups cost (``driver.sample_bounds``'s work,
    each prompt prefilled whole once), over ``engines``. Not a bound on one step (its carried tokens were
    generated earlier), but the steps up to any step together take at least the sum of theirs: every consumed
    token was generated after the run started."""
    samples = [s for g in groups for s in g.samples]
    return sample_bounds(samples, engines, cfg, coeffs)[0] if samples else 0.0


def on_policy_steps(trace, cfg: SimulateConfig, *, progress: ProgressFactory = silent_progress) -> list[float]:
    """Makespans of the ordinary batch simulation with ``baseline`` at the same B over K batches, each after the
    first with the trainer's time and the weight load added (a synchronous loop, whatever ``pipeline`` says)."""
    from pdsr_sdk.sim.driver import run_policy

    b = cfg.step_groups or cfg.batch_size
    base_cfg = cfg.model_copy(update={"batch_size": b, "num_batches": cfg.steps})
    batches = trace_batches(trace, base_cfg)
    if len(batches.batches) < cfg.steps:
        raise DataError(f"{batches.source}: the on-policy baseline needs {cfg.steps} batches of {b} groups; the "
                        f"trace has {batches.num_groups} groups")
    run = run_policy(batches, base_cfg, "baseline", record=False, progress=progress)
    # a synchronous trainer between batches: the engines idle while it trains and while they load
    between = cfg.trainer_s + cfg.weight_update_s
    return [o.makespan_s + (between if i else 0.0) for i, o in enumerate(run.batches)]


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
            "work_bound_s": r.work_bound_s,
            "vs_work_bound": r.steady_step_s / r.work_bound_s if r.work_bound_s > 0 else None,
            "off_policy_share": r.off_policy_share, "partial_share": r.partial_share, "max_age": r.max_age,
            "ages": {str(a): n for a, n in r.ages.items()},
            "restarts": r.stats.get("restarts", 0), "stale_restarts": sum(s.stale_restarts for s in r.steps),
            "wasted_tokens": r.stats.get("wasted_tokens", 0), "tokens": r.tokens,
            "dropped_groups": r.dropped_groups, "dropped_samples": r.dropped_samples,
            "dropped_tokens": r.dropped_tokens, "held_s": sum(s.held_s for s in r.steps),
            "max_group_lag": max((s.max_group_lag for s in r.steps), default=0),
            "events": r.events, "sim_wall_s": r.wall_s, "horizon_s": r.horizon_s, "policy_facts": r.policy_facts,
            "engines": self.engine_rows(r),
            "steps": [{"step": s.index + 1, "start_s": s.start_s, "time_s": r.step_times[s.index],
                       "work_bound_s": r.work_bounds_s[s.index] if s.index < len(r.work_bounds_s) else None,
                       "version": s.version, "groups": s.groups,
                       "launched": s.launched, "tokens": s.tokens, "off_policy_tokens": s.off_policy_tokens,
                       "partial_tokens": s.partial_tokens,
                       "ages": {str(a): n for a, n in s.ages.items()}, "max_group_lag": s.max_group_lag,
                       "restarts": s.restarts, "stale_restarts": s.stale_restarts, "wasted_tokens": s.wasted_tokens,
                       "held_s": s.held_s} for s in r.steps],
        }

    def fastest_within(self) -> StepsRun | None:
        """The run with the shortest steady step among those whose partial share is at most
        ``cfg.max_partial_share`` (None without a budget, or when none is within it)."""
        budget = self.cfg.max_partial_share
        if budget is None:
            return None
        within = [r for r in self.runs if r.partial_share <= budget]
        return min(within, key=lambda r: r.steady_step_s, default=None)

    def rows(self) -> list[dict[str, Any]]:
        """One row per over-provision value: the curve of step time against off-policy share (with a partial-share
        budget, the fastest run within it is marked in ``pick``)."""
        out = []
        pick = self.fastest_within()
        for r in self.runs:
            s = self.summary(r)
            row = {"F": r.over_provision, "in_flight": r.in_flight, "step_s": s["steady_step_s"],
                   "on_policy_s": s["baseline_step_s"], "ratio": s["ratio"], "vs_bound": s["vs_work_bound"],
                   "off_policy": s["off_policy_share"], "partial": s["partial_share"], "max_age": s["max_age"],
                   "restarts": s["restarts"], "wasted": s["wasted_tokens"], "held_s": s["held_s"],
                   "max_lag": s["max_group_lag"], "dropped": s["dropped_groups"]}
            if self.cfg.max_partial_share is not None:
                row["pick"] = "fastest within" if r is pick else ""
            out.append(row)
        return out

    def step_rows(self, r: StepsRun) -> list[dict[str, Any]]:
        """Per-step rows of one run, next to the on-policy step of the same index."""
        return [{"step": s.index + 1, "time_s": r.step_times[s.index],
                 "on_policy_s": self.baseline_steps_s[s.index] if s.index < len(self.baseline_steps_s) else None,
                 "bound_s": r.work_bounds_s[s.index] if s.index < len(r.work_bounds_s) else None,
                 "version": s.version, "groups": s.groups,
                 "off_policy": s.off_policy_tokens / s.tokens if s.tokens else 0.0,
                 "partial": s.partial_tokens / s.tokens if s.tokens else 0.0,
                 "max_age": s.max_age, "restarts": s.restarts, "wasted": s.wasted_tokens, "held_s": s.held_s}
                for s in r.steps]

    def engine_rows(self, r: StepsRun) -> list[dict[str, Any]]:
        """One row per engine of a run: where its time went (:meth:`EngineUse.row`)."""
        total = sum(e.tokens for e in r.engines)
        return [e.row(r.horizon_s, total) for e in r.engines]

    def to_dict(self) -> dict[str, Any]:
        cfg = self.cfg
        pick = self.fastest_within()
        return {
            "trace": str(cfg.trace) if cfg.trace is not None else None, "steps": cfg.steps,
            "step_groups": cfg.step_groups or cfg.batch_size, "max_staleness": cfg.max_staleness,
            "group_deadline": cfg.group_deadline, "trainer_s": cfg.trainer_s,
            "weight_update_s": cfg.weight_update_s, "pipeline": cfg.pipeline,
            "restart_lengths": cfg.restart_lengths, "max_partial_share": cfg.max_partial_share,
            "fastest_within": pick.over_provision if pick is not None else None,
            "engines": {"fast": {"count": cfg.fast, **cfg.profiles.fast.model_dump()},
                        "heavy": {"count": cfg.heavy, **cfg.profiles.heavy.model_dump()}},
            "segments": cfg.segments.model_dump(),
            "definitions": DEFINITIONS,
            "on_policy": {"policy": "baseline", "steps_s": self.baseline_steps_s, "step_s": self.baseline_step_s},
            "runs": [self.summary(r) for r in self.runs],
            "plots": self.plots,
        }


DEFINITIONS = {
    "time_s": "Virtual seconds from the previous step's end to the moment B complete groups were there (with a "
              "synchronous trainer, its training and the weight load included).",
    "steady_step_s": "Mean step time over steps 3 to K-1 (all steps when K < 4).",
    "baseline_step_s": "Mean makespan of the ordinary on-policy batch simulation (baseline policy, B groups a "
                       "batch) over the same steps, plus trainer_s and weight_update_s (a synchronous trainer).",
    "trainer_s": "Seconds the trainer trains on a step; weight_update_s: seconds the engines stop to load each "
                 "update; pipeline: the trainer trains on step k while step k + 1 generates (its update lands "
                 "in the middle of the next step, which does not end before it).",
    "ratio": "steady_step_s / baseline_step_s.",
    "work_bound_s": "Per step, the least engine time its consumed groups' kept tokens cost at full occupancy "
                    "(the batch lower bound's work: p*Q + L*(c0/M + c1) + c2*(L*P + L(L-1)/2) a sample, each "
                    "group's prompt prefilled whole once) / engines, plus from the second step on the time the "
                    "engines stand stopped for the trainer (weight_update_s, and trainer_s unless pipelined); here "
                    "the mean over steps 3 to K-1. One step may take less (its carried tokens were generated "
                    "earlier); the steps up to any step never do.",
    "vs_work_bound": "steady_step_s / work_bound_s: what over-provision, waits, restarts and idle slots cost over "
                     "generating the consumed tokens at full occupancy.",
    "off_policy_share": "Tokens of consumed groups generated under an older policy version than their step's, "
                        "over all consumed tokens (a segment's tokens carry the version it started under).",
    "partial_share": "The part of off_policy_share from responses that crossed a weight update while being "
                     "generated (their older tokens: the partial responses steps carried); the rest is whole "
                     "responses finished under an older version while their group waited for its other samples.",
    "version": "The policy version at a step's end, which its token ages count from (the weights its groups "
               "are trained with).",
    "ages": "Consumed tokens by age in versions (the step's version - the version of their segment).",
    "restarts": "Samples restarted (all causes); stale_restarts: those for max_staleness. wasted_tokens: their "
                "thrown-away tokens.",
    "held_s": "Seconds step ends were held for due groups (a restarted sample about to be too stale again, or "
              "group_deadline).",
    "max_group_lag": "Most steps a consumed group was in flight (consumed step - launch step).",
    "engines": "Per engine over the whole run: tokens it generated (kept by consumed groups, carried at the end or "
               "thrown away: together the run's tokens + wasted_tokens + dropped_tokens) and its token_share; "
               "seqs_per_step, the mean batch it ran (tokens / decode steps); busy, its share of the run's time "
               "(horizon_s) with a step running; prefill, the share of that busy time spent prefilling (prompts, "
               "moves, and the contexts every weight update makes carried samples compute again); lane: the "
               "policy made it a tail lane (policy_facts).",
    "fastest_within": "With max_partial_share: the over-provision F whose run had the shortest steady step among "
                      "those with partial_share at most max_partial_share (null when none was within it).",
    "dropped_groups": "Groups still in flight after the last step (the next step's carry); dropped_tokens: "
                      "their samples' reported tokens.",
}


def simulate_steps(trace, cfg: SimulateConfig, *, progress: ProgressFactory = silent_progress,
                   keep_groups: bool = False) -> StepsReport:
    """The on-policy baseline and a multi-step run for ``cfg.over_provision`` (or each value of the curve or the
    search: :func:`curve_values`)."""
    name = cfg.policy
    policy_for_steps(cfg, name)   # fail before the baseline runs
    values = curve_values(cfg)
    for f in values:
        stream_rows(trace, cfg, groups_needed(cfg, f))
    base = on_policy_steps(trace, cfg, progress=progress)

    def run_at(f: float) -> StepsRun:
        return run_steps(trace, cfg, name, f, keep_groups=keep_groups, progress=progress)

    runs = [run_at(f) for f in values]
    if cfg.max_partial_share is not None:
        runs = refine_within(runs, cfg.max_partial_share, cfg.step_groups or cfg.batch_size, run_at)
    return StepsReport(cfg, base, runs)


def refine_within(runs: list[StepsRun], budget: float, b: int,
                  run_at: Callable[[float], StepsRun]) -> list[StepsRun]:
    """The search's runs, refined: between the fastest run within the partial-share ``budget`` and the next run with
    more groups in flight that is over it, bisect on the count of groups in flight (``run_at(count / b - 1)``) until
    the two counts are adjacent. Returns every run, by groups in flight."""
    within = [r for r in runs if r.partial_share <= budget]
    if not within:
        return runs
    lo = min(within, key=lambda r: r.steady_step_s)
    over = [r for r in runs if r.in_flight > lo.in_flight and r.partial_share > budget]
    if not over:
        return runs
    hi = min(over, key=lambda r: r.in_flight)
    out = list(runs)
    while hi.in_flight - lo.in_flight > 1:
        r = run_at((lo.in_flight + hi.in_flight) // 2 / b - 1.0)
        out.append(r)
        if r.partial_share <= budget:
            lo = r
        else:
            hi = r
    return sorted(out, key=lambda r: r.in_flight)


def write_steps_plot(report: StepsReport, path) -> str:
    """PNG: steady step time / on-policy step against the off-policy token share, one point per F, with
    each point's work bound below it."""
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
    base = report.baseline_step_s
    if base > 0:   # the floor under each point: its consumed tokens generated at full occupancy
        ax.plot(xs, [r.work_bound_s / base for r in report.runs], "_", color="grey", ms=14, mew=2,
                label="work bound (consumed tokens at full occupancy)")
    pick = report.fastest_within()
    if pick is not None:   # the over-provision to run within the partial-share budget
        ax.axvline(report.cfg.max_partial_share * 100, color="tab:orange", lw=0.8, ls=":",
                   label=f"partial-share budget {report.cfg.max_partial_share:.0%}")
        ax.plot([pick.partial_share * 100], [pick.steady_step_s / base if base > 0 else 0.0], "*",
                color="tab:red", ms=13, label=f"fastest within it: F={pick.over_provision:g}")
    ax.legend(fontsize=8, loc="lower right")
    every = 1 if len(rows) <= 6 else 2   # the search's 11 points: label every other one
    for i, (x, y, r) in enumerate(zip(xs, ys, rows)):
        if i % every:
            continue
        ax.annotate(f"F={r['F']:g}", (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("off-policy tokens (%)")
    ax.set_ylabel("steady step / on-policy step")
    cfg = report.cfg
    s = "none" if cfg.max_staleness is None else str(cfg.max_staleness)
    trainer = (f", {'pipelined' if cfg.pipeline else 'synchronous'} trainer {cfg.trainer_s:g} s + load "
               f"{cfg.weight_update_s:g} s" if cfg.trained else "")
    ax.set_title(f"{report.runs[0].policy}, B={cfg.step_groups or cfg.batch_size}, K={cfg.steps}, "
                 f"max staleness {s}{trainer}", fontsize=9)
    ax.set_ylim(bottom=0)
    write_png(fig, path)
    return str(path)
