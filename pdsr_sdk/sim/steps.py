"""Multi-step simulation: partial rollout across training steps (``pdsr simulate --steps K``).

A stream of the trace's groups (in order) runs through one policy on simulated engines, with the
step accounting of :mod:`pdsr_sdk.dispatch.steps` (over-provision, step ends, staleness restarts,
due groups). A step's end does what a session's does: it aborts the running samples, keeping their
tokens (they resume under the new version and prefill their context again: the update resets the
engines' caches), and the policy version goes up; by default the trainer and the load take no time,
and ``trainer_s``, ``weight_update_s`` and ``pipeline`` give them time, synchronous or overlapping
the next step (:mod:`pdsr_sdk.sim.trainer`). Every consumed sample is checked to hold exactly its
length: the trace's, or after a restart a fresh draw (``restart_lengths``). Drops: the groups still in
flight after the last step (the next step's carry) are reported. With F = 0 and no S every step
launches B groups and waits for all of them: the on-policy run. The runs' record and report (table
rows, ``steps.json``, the curve's PNG) are in :mod:`pdsr_sdk.sim.steps_report`.

``update: auto`` runs the curve or the search with every engine loading at each update and again with a staggered
update (:class:`~pdsr_sdk.sim.trainer.SimTrainer`), each run as it would run alone.

Dynamic sampling (``filter_groups``): each group's rewards are the trace's (``rewards``; a restarted sample
keeps its recorded reward), a complete group is judged at once, and the baseline is verl's DAPO recipe
(:func:`~pdsr_sdk.sim.steps_baseline.dapo_recipe_steps`) instead of the plain on-policy batch.
"""

from __future__ import annotations

import time
from contextlib import closing
from typing import Callable

import numpy as np

from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig
from pdsr_sdk.dispatch.run import STAT_KEYS
from pdsr_sdk.dispatch.steps import GROUP_FILTERS, StepStream, check_agent_streaming, in_flight
from pdsr_sdk.dispatch.types import Group, Sample
from pdsr_sdk.errors import ConfigError, DataError, PdsrError
from pdsr_sdk.policies.resolve import check_streaming, resolve_policy
from pdsr_sdk.progress import ProgressFactory, silent_progress
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.batches import build_batch, trace_batches
from pdsr_sdk.sim.bounds import bound_coefficients, sample_bounds
from pdsr_sdk.sim.driver import build_engines, check_pools, gc_paused, raise_fatal, sim_dispatch_run
from pdsr_sdk.sim.partial_floor import partial_floor
from pdsr_sdk.sim.redraw import cap_chance, cap_prior, redraw_length
from pdsr_sdk.sim.step_floor import step_floor
from pdsr_sdk.sim.steps_baseline import dapo_recipe_steps, on_policy_steps, trace_rewards
from pdsr_sdk.sim.steps_report import StepsReport, StepsRun
from pdsr_sdk.sim.trainer import SimTrainer
from pdsr_sdk.sim.usage import engine_use

#: over-provision values of the curve (``steps`` set, ``over_provision`` not)
CURVE = (0.0, 0.25, 0.5, 1.0)
#: over-provision values of the search for the fastest within a partial-share budget (``max_partial_share``)
SEARCH = tuple(round(0.05 * i, 2) for i in range(11))
#: ... and beyond with a staggered update, whose responses cross no update, so a larger F fits the budget
SEARCH_STAGGERED = SEARCH + (0.75, 1.0, 1.25, 1.5)
#: the updates one run can have (``update: auto`` runs each)
UPDATES = ("all", "staggered")


def curve_values(cfg: SimulateConfig) -> tuple[float, ...]:
    """The over-provision values a multi-step run simulates: the one asked for, the curve's, or the search's
    (of those that keep the same number of groups in flight, only the smallest: a small B rounds several alike)."""
    if cfg.over_provision is not None:
        return (cfg.over_provision,)
    if cfg.filter_groups is not None:
        return (None,)   # dynamic sampling: the groups in flight follow the measured pass rate
    if cfg.max_partial_share is None:
        return CURVE
    b = cfg.step_groups or cfg.batch_size
    first: dict[int, float] = {}
    for f in SEARCH if cfg.update == "all" else SEARCH_STAGGERED:   # auto: its staggered runs' (the most)
        first.setdefault(in_flight(b, f), f)
    return tuple(first.values())


def policy_for_steps(cfg: SimulateConfig, name: str):
    """(class, settings) of a policy that can stream, or a ConfigError naming it and those that can."""
    if "," in name or name == "all":
        raise ConfigError(f"policy: --steps runs one policy; got {name!r}")
    cls, settings = resolve_policy(name, cfg.policy_settings.get(name, {}), simulation=True)
    check_streaming(cls, name)
    check_pools(cls, cfg, name)
    return cls, settings


def stream_rows(trace, cfg: SimulateConfig, needed: int, what: str = "") -> list:
    """The trace's groups as rows (see ``trace_batches``), in order, or a DataError if it has fewer than
    ``needed`` (``what``: the run that needs them, for the message). All of them: steps that take due groups
    beyond B consume more than ``needed``."""
    tb = trace_batches(trace, cfg.model_copy(update={"num_batches": None}))
    rows = [g for b in tb.batches for g in b]
    if len(rows) < needed:
        raise DataError(f"{tb.source}: {cfg.steps} steps of {cfg.step_groups or cfg.batch_size} groups"
                        f"{what or ''} need {needed} groups; the trace has {len(rows)}")
    return rows


def over_provision_label(values) -> str:
    """How the over-provision values a run needs groups for read in a message: one value, or the largest."""
    if list(values) == [None]:   # dynamic sampling
        return " before any is filtered out"
    values = [f or 0.0 for f in values]
    if len(values) == 1:
        return f" with over-provision {values[0]:g}"
    return f" at the largest over-provision simulated ({max(values):g}, of {', '.join(f'{f:g}' for f in values)})"


def groups_needed(cfg: SimulateConfig, over_provision: float | None) -> int:
    """Groups K steps take at least (with dynamic sampling, before any is filtered out)."""
    b = cfg.step_groups or cfg.batch_size
    return in_flight(b, over_provision or 0.0) + (cfg.steps - 1) * b


def group_filter(trace, cfg: SimulateConfig) -> Callable[[Group], bool] | None:
    """The step stream's filter for ``cfg.filter_groups`` (None when off): the kind's test of the trace's rewards."""
    if cfg.filter_groups is None:
        return None
    rewards = trace_rewards(trace, cfg)
    kind = GROUP_FILTERS[cfg.filter_groups.kind]
    return lambda g: kind([rewards[g.prompt_id][s.index] for s in g.samples])


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


def response_cap(rows) -> int:
    """The trace's response cap: its longest response that finished for length where the trace has finish reasons
    and any did, else its longest response. A long response that stopped on its own is not the cap: the trace's
    capped responses redraw to the cap they ran to."""
    capped = [n for r in rows if r[3] for n, why in zip(r[2], r[3]) if why == "length"]
    return max(capped) if capped else max(max(r[2]) for r in rows)


def fresh_lengths(rows, cap: int) -> Callable[[Sample], None]:
    """The restart hook of ``restart_lengths: redraw``: a restarted sample gets a fresh length
    (:func:`pdsr_sdk.sim.redraw.redraw_length`), drawn once per sample and restart; ``cap``: the
    response cap (:func:`response_cap`)."""
    share, strength = cap_prior([_capped(r[2], r[3], cap) for r in rows])

    def on_restart(s: Sample) -> None:
        g = s.group
        capped = _capped(g.target_lengths, g.target_finish_reasons, cap)
        s.max_tokens = redraw_length(g.target_lengths, capped, cap, cap_chance(capped, share, strength),
                                     f"{g.prompt_id}/{s.index}/{s.restarts}")
    return on_restart


def run_steps(trace, cfg: SimulateConfig, name: str, over_provision: float | None, *, keep_groups: bool = False,
              progress: ProgressFactory = silent_progress) -> StepsRun:
    """Simulate ``cfg.steps`` training steps of policy ``name`` with ``over_provision`` (see the module); the
    engines record their occupancy over time where a timeline will be drawn (``cfg.timeline`` and ``cfg.out_dir``).
    With ``cfg.filter_groups``, ``over_provision`` None adapts the groups in flight to the pass rate."""
    if cfg.steps is None:
        raise ConfigError("steps: a multi-step run needs steps (K)")
    if cfg.update not in UPDATES:
        raise ConfigError(f"update: a run has one update, {' or '.join(UPDATES)}; got {cfg.update!r} (simulate_steps "
                          f"runs auto as both)")
    cls, settings = policy_for_steps(cfg, name)
    keep = group_filter(trace, cfg)
    rows = stream_rows(trace, cfg, groups_needed(cfg, over_provision), over_provision_label([over_provision]))
    clock = VirtualClock()
    record = cfg.timeline and cfg.out_dir is not None
    engines = build_engines(cfg, clock, record=record)
    fatal: list[BaseException] = []
    handlers: list[StepStream] = []
    longest = max(max(r[2]) for r in rows)
    run = sim_dispatch_run(engines, cls, settings, clock,
                           SamplingConfig(n=max(len(r[2]) for r in rows), max_tokens=longest, ignore_eos=True),
                           cfg.segments, multi_turn=any(r[4] is not None for r in rows),   # a trace of turns
                           hold_turn_slots=cfg.hold_turn_slots, on_fatal=fatal.append,
                           on_group_done=lambda g: handlers[0].group_done(g),
                           on_restart=fresh_lengths(rows, response_cap(rows)) if cfg.restart_lengths == "redraw"
                           else None)
    label = "adaptive" if over_provision is None else f"{over_provision:g}"
    bar = progress(desc=f"steps {name} F={label}", total=cfg.steps, unit="step")
    b = cfg.step_groups or cfg.batch_size
    next_row = 0
    coeffs = bound_coefficients(cfg)
    bounds: list[float] = []
    recorded: list[int] = []

    ran_out: list[int] = []   # the step whose launch the trace could not fill (a refill of the in-flight count)

    def new_groups(count: int) -> list[Group]:
        nonlocal next_row
        taken = rows[next_row:next_row + count]
        next_row += len(taken)
        if len(taken) < count and not ran_out:
            ran_out.append(stream.t)
        return build_batch(taken)

    # after the first step the engines also stop for each update, and without pipelining for the trainer too
    stopped_s = cfg.weight_update_s + (0.0 if cfg.pipeline else cfg.trainer_s)

    def step_end() -> None:
        bounds.append(step_work_bound(stream.pending, len(engines), cfg, coeffs) + (stopped_s if bounds else 0.0))
        recorded.append(sum(recorded_sampled_tokens(g) for g in stream.pending))
        trainer.step_end()

    stream = StepStream(run, step_groups=b, in_flight=in_flight(b, over_provision or 0.0), steps=cfg.steps,
                        max_staleness=cfg.max_staleness, group_deadline=cfg.group_deadline,
                        new_groups=new_groups, on_step_end=step_end, keep_groups=keep_groups, check=True,
                        on_advance=lambda: bar.update(1), group_filter=keep, adapt=over_provision is None,
                        filter_config=cfg.filter_groups)
    handlers.append(stream)
    trainer = SimTrainer(stream, trainer_s=cfg.trainer_s, weight_update_s=cfg.weight_update_s, pipeline=cfg.pipeline,
                         keep_kv=cfg.kv_on_update == "keep", staggered=cfg.update == "staggered")
    wall0 = time.perf_counter()
    events = 0
    with gc_paused(), closing(bar):   # as in run_policy: many small objects, no cycles
        try:
            stream.start()
        except PdsrError as exc:
            fatal.append(exc)
        if not fatal:
            events = clock.run(until=lambda: stream.done or bool(fatal))
        if fatal:
            raise_fatal(fatal[0], name, f"step {stream.t}")
        if ran_out:
            # from there on fewer groups were in flight than the run reports (a last step could take fewer than B)
            what = "take due groups" + (" or replace those the filter takes out" if keep is not None else "")
            raise DataError(f"{cfg.trace or trace.source}: the trace ran out of groups at step {ran_out[0] + 1} of "
                            f"{cfg.steps}: its {len(rows)} groups could not keep {stream.target} in flight (steps that "
                            f"{what} consume more than {b} each); give a longer trace")
        if not stream.done:
            raise PdsrError(f"policy {name!r}: step {stream.t} stalled with {len(stream.flying)} groups in "
                            f"flight, {len(stream.complete)} complete (nothing left to run)")
    left = [g for g, _ in stream.flying.values()]
    totals = {k: run.scheduler.stats.get(k, 0) for k in STAT_KEYS}
    report = getattr(run.policy, "batch_report", None)
    facts = dict(report()) if report is not None else {}
    end = clock.now()
    return StepsRun(
        policy=name, over_provision=over_provision, update=cfg.update, step_groups=stream.b, in_flight=stream.target,
        max_staleness=cfg.max_staleness, group_deadline=stream.d, steps=stream.records,
        dropped_groups=len(left) + sum(r.dropped for r in stream.records),
        dropped_samples=sum(1 for g in left for s in g.samples if s.finished),
        dropped_tokens=sum(s.num_generated for g in left for s in g.samples)
        + sum(r.dropped_tokens for r in stream.records),
        stats=totals, events=events, wall_s=time.perf_counter() - wall0, work_bounds_s=bounds[:len(stream.records)],
        recorded_tokens=recorded[:len(stream.records)],
        groups=stream.consumed,
        consumed_at=stream.consumed_at, launched_at=stream.launched_at,
        engines=engine_use(engines, end, set(facts.get("lane_engines", ())), occupancy=record),
        horizon_s=end, policy_facts=facts)


def recorded_sampled_tokens(g: Group) -> int:
    """The tokens the trace records for ``g``'s responses that the model samples: a multi-turn sample's turns
    without its environment's tokens, as a step's ``tokens`` count them (``token_ratio`` compares the two)."""
    turns = g.target_turns or [None] * len(g.target_lengths)
    return sum(n if t is None else sum(k for k, _, _ in t) for n, t in zip(g.target_lengths, turns))


def step_work_bound(groups: list[Group], engines: int, cfg: SimulateConfig, coeffs: dict[str, float]) -> float:
    """The least engine time the kept tokens of a step's consumed groups cost (``bounds.sample_bounds``'s work,
    each prompt prefilled whole once), over ``engines``. Not a bound on one step (its carried tokens were
    generated earlier), but the steps up to any step together take at least the sum of theirs: every consumed
    token was generated after the run started."""
    samples = [s for g in groups for s in g.samples]
    return sample_bounds(samples, engines, cfg, coeffs)[0] if samples else 0.0


def simulate_steps(trace, cfg: SimulateConfig, *, progress: ProgressFactory = silent_progress,
                   keep_groups: bool = False) -> StepsReport:
    """The on-policy baseline and a multi-step run for ``cfg.over_provision`` (or each value of the curve or the
    search: :func:`curve_values`); with ``update: auto`` those runs with each update, one after the other."""
    name = cfg.policy
    if getattr(trace, "multi_turn", False):   # as a session with an agent: its samples are never restarted
        check_agent_streaming(cfg.max_staleness, cfg.filter_groups is not None, "with a trace of turns")
    policy_for_steps(cfg, name)   # fail before the baseline runs
    values = curve_values(cfg)
    stream_rows(trace, cfg, max(groups_needed(cfg, f) for f in values), over_provision_label(values))
    if cfg.filter_groups is not None:
        base = dapo_recipe_steps(trace, cfg, progress=progress)
    else:
        base = on_policy_steps(trace, cfg, progress=progress)

    runs: list[StepsRun] = []
    for update in UPDATES if cfg.update == "auto" else (cfg.update,):
        one = cfg.model_copy(update={"update": update})

        def run_at(f: float | None, one=one) -> StepsRun:
            return run_steps(trace, one, name, f, keep_groups=keep_groups, progress=progress)

        these = [run_at(f) for f in curve_values(one)]
        if cfg.max_partial_share is not None:
            these = refine_within(these, cfg.max_partial_share, cfg.step_groups or cfg.batch_size, run_at)
        runs += these
    return StepsReport(cfg, base, runs, floor_s=budget_floor(trace, cfg, runs))


def budget_floor(trace, cfg: SimulateConfig, runs: list[StepsRun]) -> float | None:
    """With a partial-share budget: the least equal step any schedule of these engines takes within it, the higher
    of :func:`~pdsr_sdk.sim.partial_floor.partial_floor` and :func:`~pdsr_sdk.sim.step_floor.step_floor` for the
    stream's first K x B groups and the F = 0 run's work bound (None without a budget or that run, under dynamic
    sampling, whose consumed groups are not the stream's first, or with speculation: both bounds count a token a
    request a step)."""
    f0 = next((r for r in runs if r.over_provision == 0.0), None)
    speculative = cfg.profiles.fast.speculation is not None or cfg.profiles.heavy.speculation is not None
    if (cfg.max_partial_share is None or cfg.filter_groups is not None or speculative or f0 is None
            or f0.work_bound_s <= 0):
        return None
    lengths, prompts = stream_lengths(trace, cfg, cfg.steps * (cfg.step_groups or cfg.batch_size))
    return max(stream_floors(lengths, prompts, f0.work_bound_s, cfg, steps=cfg.steps, budget=cfg.max_partial_share))


def stream_lengths(trace, cfg: SimulateConfig, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """The response lengths of the stream's first ``groups`` groups and, one per response, its prompt's length (what
    :func:`stream_floors` takes); a DataError if the trace has fewer groups."""
    rows = stream_rows(trace, cfg, groups)[:groups]
    return (np.asarray([n for r in rows for n in r[2]], dtype=np.int64),
            np.asarray([r[1] for r in rows for _ in r[2]], dtype=np.int64))


def stream_floors(lengths, prompts, work_s: float, cfg: SimulateConfig, *, steps: int,
                  budget: float) -> tuple[float, float]:
    """(partial-budget floor, step-count floor) of responses of ``lengths`` tokens (prompts of ``prompts``)
    consumed over ``steps`` steps of ``work_s`` work bound each, on ``cfg``'s engines at their cheapest terms (the
    work bound's) and their largest KV cache."""
    co = bound_coefficients(cfg)
    kw = dict(steps=steps, engines=cfg.fast + cfg.heavy, budget=budget, c0=co["c0"], c1=co["c1"],
              max_seqs=int(co["max_seqs"]))
    kv = max(p.kv_cache_tokens for p, count in ((cfg.profiles.fast, cfg.fast), (cfg.profiles.heavy, cfg.heavy))
             if count)
    return (partial_floor(lengths, work_s, **kw),
            step_floor(lengths, prompts, work_s, c2=co["c2"], kv_tokens=kv, **kw))


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
    ran = {r.in_flight: r for r in runs}
    while hi.in_flight - lo.in_flight > 1:
        mid = (lo.in_flight + hi.in_flight) // 2
        r = ran.get(mid)   # a count the grid already ran (a slower run within the budget): not again
        if r is None:
            r = ran[mid] = run_at(mid / b - 1.0)
            out.append(r)
        if r.partial_share <= budget:
            lo = r
        else:
            hi = r
    return sorted(out, key=lambda r: r.in_flight)
