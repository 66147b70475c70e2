"""The record and report of a multi-step simulation (``pdsr simulate --steps``): one run's steps and their
steady state (:class:`StepsRun`), the on-policy baseline beside the runs, their table rows, ``steps.json`` and
the curve's PNG (:class:`StepsReport`; drawn by :mod:`pdsr_sdk.sim.steps_plot`). :mod:`pdsr_sdk.sim.steps` runs
them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pdsr_sdk.dispatch.steps import StepRecord
from pdsr_sdk.dispatch.types import Group
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.usage import EngineUse


@dataclass
class StepsRun:
    """One policy and over-provision over K steps."""

    policy: str
    #: None: dynamic sampling with the groups in flight adapted to the pass rate
    over_provision: float | None
    #: how each weight update reached the engines: all or staggered (``update: auto`` runs both)
    update: str
    step_groups: int
    in_flight: int
    max_staleness: int | None
    group_deadline: int | None
    steps: list[StepRecord]
    #: groups in flight after the last step (launched, not consumed; with those a group deadline dropped), their
    #: finished samples, and the tokens all their samples had made
    dropped_groups: int
    dropped_samples: int
    dropped_tokens: int
    stats: dict[str, int]
    events: int
    wall_s: float
    #: per step, the engine time its consumed groups' tokens need at least / engines (see work_bound_s)
    work_bounds_s: list[float] = field(default_factory=list)
    #: per step, its consumed groups' response tokens as the trace records them (see token_ratio)
    recorded_tokens: list[int] = field(default_factory=list)
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
    def token_ratio(self) -> float | None:
        """Response tokens the steady steps consumed over what the trace records for the same groups: below 1
        where staleness restarts swapped long responses for fresh draws, which are shorter on average (None
        without the record)."""
        recorded = steady_mean([float(t) for t in self.recorded_tokens])
        return steady_mean([float(s.tokens) for s in self.steps]) / recorded if recorded > 0 else None

    @property
    def off_policy_share(self) -> float:
        return sum(s.off_policy_tokens for s in self.steps) / self.tokens if self.tokens else 0.0

    @property
    def partial_share(self) -> float:
        return sum(s.partial_tokens for s in self.steps) / self.tokens if self.tokens else 0.0

    @property
    def carried_responses(self) -> int:
        """Consumed responses that crossed a weight update, over every step (``StepRecord.carried``)."""
        return sum(s.carried for s in self.steps)

    @property
    def carried_made_before(self) -> float | None:
        """Of the consumed responses that crossed a weight update, the share of their tokens made under an older
        version than their step's (their partial tokens); None where none crossed one. Near 1: the partial budget
        goes to responses carried nearly done, which the step's end cut off just before they finished."""
        total = sum(s.carried_tokens for s in self.steps)
        return sum(s.partial_tokens for s in self.steps) / total if total else None

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


@dataclass
class StepsReport:
    """The on-policy baseline and one multi-step run per over-provision value."""

    cfg: SimulateConfig
    baseline_steps_s: list[float]
    runs: list[StepsRun]
    plots: list[str] = field(default_factory=list)
    #: with a partial-share budget: the least equal step any schedule of these engines takes within it
    floor_s: float | None = None

    @property
    def baseline_step_s(self) -> float:
        """Mean on-policy step over the same window as the steady state (steps 3 to K-1)."""
        return steady_mean(self.baseline_steps_s)

    @property
    def floor_ratio(self) -> float | None:
        """``floor_s`` over the on-policy step (None without a floor or an on-policy step)."""
        base = self.baseline_step_s
        return self.floor_s / base if self.floor_s and base > 0 else None

    def ratio(self, r: StepsRun) -> float | None:
        """A run's steady step over the on-policy step (None without an on-policy step)."""
        base = self.baseline_step_s
        return r.steady_step_s / base if base > 0 else None

    def ratio_per_token(self, r: StepsRun) -> float | None:
        """``ratio`` over ``token_ratio``: the steady step against the on-policy step, per consumed token."""
        ratio, tokens = self.ratio(r), r.token_ratio
        return ratio / tokens if ratio is not None and tokens else None

    def summary(self, r: StepsRun) -> dict[str, Any]:
        base = self.baseline_step_s
        return {
            "policy": r.policy, "over_provision": r.over_provision, "update": r.update, "step_groups": r.step_groups,
            "in_flight": r.in_flight, "max_staleness": r.max_staleness, "group_deadline": r.group_deadline,
            "steady_step_s": r.steady_step_s, "baseline_step_s": base,
            "ratio": self.ratio(r),
            "token_ratio": r.token_ratio, "ratio_per_token": self.ratio_per_token(r),
            "work_bound_s": r.work_bound_s,
            "vs_work_bound": r.steady_step_s / r.work_bound_s if r.work_bound_s > 0 else None,
            "off_policy_share": r.off_policy_share, "partial_share": r.partial_share, "max_age": r.max_age,
            "carried_responses": r.carried_responses, "carried_made_before": r.carried_made_before,
            "ages": {str(a): n for a, n in r.ages.items()},
            "restarts": r.stats.get("restarts", 0), "stale_restarts": sum(s.stale_restarts for s in r.steps),
            "early_restarts": sum(s.early_restarts for s in r.steps),
            "wasted_tokens": r.stats.get("wasted_tokens", 0), "tokens": r.tokens,
            "dropped_groups": r.dropped_groups, "dropped_samples": r.dropped_samples,
            "dropped_tokens": r.dropped_tokens, "held_s": sum(s.held_s for s in r.steps),
            "max_group_lag": max((s.max_group_lag for s in r.steps), default=0),
            "filtered_groups": sum(s.filtered for s in r.steps),
            "filtered_tokens": sum(s.filtered_tokens for s in r.steps),
            "pass_rate": r.steps[-1].pass_rate if r.steps else None,
            "events": r.events, "sim_wall_s": r.wall_s, "horizon_s": r.horizon_s, "policy_facts": r.policy_facts,
            "engines": self.engine_rows(r),
            "steps": [{"step": s.index + 1, "start_s": s.start_s, "time_s": r.step_times[s.index],
                       "work_bound_s": r.work_bounds_s[s.index] if s.index < len(r.work_bounds_s) else None,
                       "version": s.version, "groups": s.groups,
                       "launched": s.launched, "tokens": s.tokens, "off_policy_tokens": s.off_policy_tokens,
                       "partial_tokens": s.partial_tokens, "carried": s.carried, "carried_tokens": s.carried_tokens,
                       "ages": {str(a): n for a, n in s.ages.items()}, "max_group_lag": s.max_group_lag,
                       "restarts": s.restarts, "stale_restarts": s.stale_restarts,
                       "early_restarts": s.early_restarts, "wasted_tokens": s.wasted_tokens,
                       "held_s": s.held_s, "filtered": s.filtered, "filtered_tokens": s.filtered_tokens,
                       "pass_rate": s.pass_rate, "dropped": s.dropped, "dropped_tokens": s.dropped_tokens}
                      for s in r.steps],
        }

    def fastest_within(self, update: str | None = None) -> StepsRun | None:
        """The run with the shortest steady step among those whose partial share is at most
        ``cfg.max_partial_share`` (None without a budget, or when none is within it); ``update``: among that
        update's runs only (``update: auto`` runs both)."""
        budget = self.cfg.max_partial_share
        if budget is None:
            return None
        within = [r for r in self.runs if r.partial_share <= budget and update in (None, r.update)]
        return min(within, key=lambda r: r.steady_step_s, default=None)

    def timeline_runs(self) -> list[StepsRun]:
        """The runs the engines x time timeline draws: after a search (``max_partial_share``) only its pick (a
        panel for each of its many runs would say little), else every run."""
        pick = self.fastest_within()
        return [pick] if pick is not None else list(self.runs)

    def rows(self) -> list[dict[str, Any]]:
        """One row per over-provision value (with ``update: auto``, per value and update): the curve of step time
        against off-policy share (with a partial-share budget, the fastest run within it is marked in ``pick``)."""
        out = []
        pick = self.fastest_within()
        for r in self.runs:
            s = self.summary(r)
            row = {"F": r.over_provision, **({"update": r.update} if self.cfg.update == "auto" else {}),
                   "in_flight": r.in_flight, "step_s": s["steady_step_s"],
                   "on_policy_s": s["baseline_step_s"], "ratio": s["ratio"], "token_ratio": s["token_ratio"],
                   "per_token": s["ratio_per_token"], "vs_bound": s["vs_work_bound"],
                   "off_policy": s["off_policy_share"], "partial": s["partial_share"], "max_age": s["max_age"],
                   "restarts": s["restarts"], "wasted": s["wasted_tokens"], "held_s": s["held_s"],
                   "max_lag": s["max_group_lag"], "left_over": s["dropped_groups"]}
            if self.cfg.filter_groups is not None:
                row["F"] = "adaptive" if r.over_provision is None else r.over_provision
                row["filtered"] = s["filtered_groups"]
                row["pass_rate"] = s["pass_rate"]
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
            "restart_lengths": cfg.restart_lengths, "kv_on_update": cfg.kv_on_update, "update": cfg.update,
            "max_partial_share": cfg.max_partial_share,
            "fastest_within": pick.over_provision if pick is not None else None,
            "fastest_within_update": pick.update if pick is not None else None,
            "floor_s": self.floor_s,
            "floor_ratio": self.floor_ratio,
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
    "token_ratio": "Response tokens the steady steps consumed (steps 3 to K-1) / the trace's recorded lengths of "
                   "the same groups: below 1 where staleness restarts swapped long responses for fresh draws "
                   "(restart_lengths redraw), which are shorter on average: a bias toward short answers, which "
                   "also shortens the steps; 1 when restarts replay their lengths.",
    "ratio_per_token": "ratio / token_ratio: the steady step against the on-policy step per consumed token.",
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
                     "generated (their older tokens); the rest is whole responses finished under an older version "
                     "while their group waited for its other samples. With pipeline, a response carried over a "
                     "step's end that finishes before the next weight update is off-policy, not partial.",
    "carried_responses": "Consumed responses that crossed a weight update while being generated (per step: carried, "
                         "with carried_tokens, all their tokens); carried_made_before: the share of those tokens made "
                         "under an older version than their step's (partial tokens / carried tokens). Near 1, the "
                         "partial budget goes to responses the step's end cut off just before they finished.",
    "version": "The policy version at a step's end, which its token ages count from (the weights its groups "
               "are trained with).",
    "ages": "Consumed tokens by age in versions (the step's version - the version of their segment).",
    "restarts": "Samples restarted (all causes); stale_restarts: those for max_staleness; early_restarts: the part "
                "of those the policy gave a step early, at a step's start, to running samples it expected to outlive "
                "their group's last step (v3's early_restart). wasted_tokens: their thrown-away tokens.",
    "held_s": "Seconds step ends were held for due groups (a restarted sample about to be too stale again, or "
              "group_deadline).",
    "max_group_lag": "Most steps a consumed group was in flight (consumed step - launch step).",
    "engines": "Per engine over the whole run: tokens it generated (kept by consumed groups, carried at the end or "
               "thrown away: together the run's tokens + wasted_tokens + dropped_tokens) and its token_share; "
               "seqs_per_step, the mean batch it ran (tokens / decode steps); busy, its share of the run's time "
               "(horizon_s) with a step running; prefill, the share of that busy time spent prefilling (prompts, "
               "moves, and the contexts every weight update makes carried samples compute again); lane: the "
               "policy made it a tail lane (policy_facts).",
    "floor_s": "With max_partial_share: the least equal step in which any schedule of these engines makes the "
               "stream's first K x B groups within the budget (the higher of two lower bounds: the work with most of "
               "each long response made in its consuming step priced, and the steps a response makes one token at a "
               "time, each paying c0; bench/partial_bound.py). floor_ratio: over the on-policy step.",
    "fastest_within": "With max_partial_share: the over-provision F whose run had the shortest steady step among "
                      "those with partial_share at most max_partial_share (null when none was within it); "
                      "fastest_within_update: that run's update (with update auto, the runs of both are compared).",
    "dropped_groups": "Groups still in flight after the last step (the next step's carry), and those on-policy "
                      "dynamic sampling dropped at a step's end; dropped_tokens: their samples' reported tokens; "
                      "dropped_samples: the finished samples of the groups still in flight.",
}
