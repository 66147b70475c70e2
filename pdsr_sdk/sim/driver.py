"""Run a length trace through a dispatch policy on simulated engines, in virtual time.

Batches are consecutive runs of ``batch_size`` prompt groups of the trace,
run one after another (like GRPO steps); the policy instance persists across
batches. Every sample is forced to its recorded length. A trace of turns replays each multi-turn sample
turn by turn through the same scheduler (:class:`TurnReplay`): each turn is a request; at its end the sample is
parked (no slot held) and, after the trace's environment delay on the virtual clock, continues with the
environment's tokens (prefilled by the engine that runs the next turn) or, after its last turn, finishes. A policy with
several :meth:`~pdsr_sdk.dispatch.policy.Policy.simulation_variants` (the ``oracle`` reference) runs once per
variant, and its run keeps each batch's best outcome (:func:`~pdsr_sdk.sim.outcomes.best_of`). The same run assembly
(:class:`~pdsr_sdk.dispatch.run.DispatchRun`: scheduler, policy classes, batch reports) as a real
``pdsr rollout`` run drives :class:`~pdsr_sdk.sim.engine.SimEngine` s on a
:class:`~pdsr_sdk.dispatch.clock.VirtualClock`.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig
from pdsr_sdk.dispatch.run import STAT_KEYS, DispatchRun
from pdsr_sdk.dispatch.types import FAST, HEAVY, STOP, TRUNCATED, Group, Sample, TurnRecord
from pdsr_sdk.errors import ConfigError, PdsrError
from pdsr_sdk.policies.resolve import policy_names, reference_policies, resolve_policy, with_policy_sets
from pdsr_sdk.progress import ProgressFactory, silent_progress
from pdsr_sdk.sim.batches import TraceBatches, build_batch, trace_batches
from pdsr_sdk.sim.bounds import bound_coefficients, sample_bounds
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.engine import SimEngine
from pdsr_sdk.sim.outcomes import BatchOutcome, PolicyRun, best_of
from pdsr_sdk.sim.report import tail_time

if TYPE_CHECKING:
    from pdsr_sdk.sim.report import SimulationReport


def run_names(cfg: SimulateConfig) -> list[str]:
    """The policies a simulation runs: those of ``cfg.policy`` (:func:`policy_names`) and, when
    ``cfg.references`` is on (default: when more than one policy is selected), baseline first if it is
    missing and the reference schedules (``oracle``, ``oracle-probe``) last: the report's comparison
    columns need them."""
    names = policy_names(cfg.policy)
    references = cfg.references if cfg.references is not None else len(names) > 1
    if references:
        if "baseline" not in names:
            names.insert(0, "baseline")
        names += [r for r in reference_policies() if r not in names]
    return names


class TurnReplay:
    """Replays a trace's turns through a scheduler (its ``on_turn_end``): after turn k of a sample ends, the
    environment's delay of turn k passes on the virtual clock, then the sample continues with the environment's
    token count and turn k + 1's sampled tokens (``continue_turn``), or, after its last turn, finishes with its
    recorded finish reason (any environment tokens after the last turn added first)."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.scheduler: Any = None
        self.done: dict[Sample, int] = {}   # turns each sample has finished

    def on_turn_end(self, sample: Sample, reason: str) -> None:
        k = self.done.get(sample, 0)
        self.done[sample] = k + 1
        turns = sample.group.target_turns[sample.index]   # type: ignore[index]
        _, env, delay = turns[k]
        if k + 1 < len(turns):
            nxt = turns[k + 1][0]
            self.clock.call_later(delay, lambda: self.scheduler.continue_turn(sample, env, nxt))
        elif env or delay:
            self.clock.call_later(delay, lambda: self._last(sample, env))
        else:
            self._last(sample, 0)

    def _last(self, sample: Sample, env: int) -> None:
        if env:
            now = self.clock.now()
            sample.turns.append(TurnRecord("environment", sample.num_generated, env,   # type: ignore[union-attr]
                                           start_s=sample.turns[-1].end_s or now, end_s=now))   # type: ignore[index]
            sample.add_env_tokens(env)
        reasons = sample.group.target_finish_reasons
        self.scheduler.finish(sample, reasons[sample.index] if reasons else STOP)


def sim_dispatch_run(engines, cls, settings, clock: VirtualClock, sampling: SamplingConfig, segments, *,
                     multi_turn: bool, hold_turn_slots: bool, on_fatal, **hooks) -> DispatchRun:
    """The simulator's :class:`DispatchRun` over ``engines``; with ``multi_turn`` (a trace of turns) a
    :class:`TurnReplay` replays each sample's turns through its scheduler (``hold_turn_slots``: a parked sample
    keeps its slot, the reference). ``hooks``: the run's other callbacks."""
    replay = TurnReplay(clock) if multi_turn else None
    run = DispatchRun(engines, cls, settings, clock, sampling, segments, on_fatal=on_fatal,
                      busy_s=SimEngine.busy_s_at, on_turn_end=None if replay is None else replay.on_turn_end,
                      hold_turn_slots=hold_turn_slots and multi_turn, **hooks)
    if replay is not None:
        replay.scheduler = run.scheduler
    return run


def build_engines(cfg: SimulateConfig, clock, *, record: bool = True) -> list[SimEngine]:
    engines = [SimEngine(f"fast-{i}", FAST, cfg.profiles.fast, clock, record=record) for i in range(cfg.fast)]
    engines += [SimEngine(f"heavy-{i}", HEAVY, cfg.profiles.heavy, clock, record=record) for i in range(cfg.heavy)]
    return engines


def raise_fatal(exc: BaseException, policy: str, where: str) -> None:
    """Re-raise what ended a simulated run: a PdsrError as it is, a policy's bug named with where it happened."""
    if isinstance(exc, PdsrError):
        raise exc
    raise PdsrError(f"policy {policy!r} failed in {where}: {type(exc).__name__}: {exc}") from exc


def check_pools(cls, cfg: SimulateConfig, name: str) -> None:
    """A ConfigError if the policy needs a pool that has no engines."""
    pools = {p for p, k in ((FAST, cfg.fast), (HEAVY, cfg.heavy)) if k}
    missing = [p for p in getattr(cls, "required_pools", ()) if p not in pools]
    if missing:
        raise ConfigError(f"policy {name!r} needs at least one engine in pool(s) {', '.join(missing)}; "
                          f"set --{missing[0]} (fast: {cfg.fast}, heavy: {cfg.heavy})")


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC off for a simulation: a run allocates millions of small objects and frees few, so the GC's
    full passes over them cost more than the simulation itself at 100k samples, with no cycles to collect.

    It first collects the young generations, where an earlier run's garbage sits (objects stay young while the
    GC is off); not a full pass, which over a trainer's (or a test session's) long-lived heap cost 0.6 s a run.
    """
    was_enabled = gc.isenabled()
    gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_policy(batches: TraceBatches, cfg: SimulateConfig, name: str, *, keep_groups: bool = False,
               record: bool = True, progress: ProgressFactory = silent_progress,
               hold_turn_slots: bool | None = None) -> PolicyRun:
    """Simulate every batch with policy ``name`` on fresh engines; returns the outcomes.

    A policy whose ``simulation_variants`` names several variants (the ``oracle``) runs once per
    variant and the run keeps each batch's best outcome (:func:`~pdsr_sdk.sim.outcomes.best_of`).
    ``hold_turn_slots`` (default: ``cfg.hold_turn_slots``): multi-turn samples keep their slot while their
    environment works.
    """
    hold = cfg.hold_turn_slots if hold_turn_slots is None else hold_turn_slots
    cls, settings = resolve_policy(name, cfg.policy_settings.get(name, {}), simulation=True)
    check_pools(cls, cfg, name)
    pools = {p for p, k in ((FAST, cfg.fast), (HEAVY, cfg.heavy)) if k}
    variants = getattr(cls, "simulation_variants", None)
    variants = variants(settings, pools) if variants is not None else [("", settings)]
    runs = []
    for label, variant in variants:
        run = _run_one(batches, cfg, name, cls, variant, keep_groups=keep_groups, record=record,
                       progress=progress, hold=hold,
                       desc=f"simulate {name}" + (f" ({label})" if len(variants) > 1 else ""))
        runs.append((label, run))
    if len(runs) == 1:
        return runs[0][1]
    return best_of(name, settings.model_dump(), runs)


def _run_one(batches: TraceBatches, cfg: SimulateConfig, name: str, cls, settings, *, keep_groups: bool,
             record: bool, progress: ProgressFactory, desc: str, hold: bool = False) -> PolicyRun:
    clock = VirtualClock()
    engines = build_engines(cfg, clock, record=record)
    longest = max((max(g[2]) for b in batches.batches for g in b), default=1)
    fatal: list[BaseException] = []
    run = sim_dispatch_run(engines, cls, settings, clock,
                           SamplingConfig(n=max(len(g[2]) for b in batches.batches for g in b), max_tokens=longest,
                                          ignore_eos=True),
                           cfg.segments, multi_turn=batches.multi_turn, hold_turn_slots=hold, on_fatal=fatal.append)
    coeffs = bound_coefficients(cfg)
    outcomes: list[BatchOutcome] = []
    events = 0
    wall0 = time.perf_counter()
    bar = progress(desc=desc, total=len(batches.batches), unit="batch")
    with gc_paused(), closing(bar):
        for bi, rows in enumerate(batches.batches):
            groups = build_batch(rows)
            pre0 = sum(e.preemptions for e in engines), sum(e.prefill_tokens for e in engines)
            held0 = run.scheduler.held_turn_slot_s
            done: list[bool] = []   # checked after every event: a list is cheaper than a property
            try:
                run.start_batch(groups, lambda: done.append(True))
            except PdsrError as exc:
                fatal.append(exc)
            if not done and not fatal:
                events += clock.run(until=lambda: bool(done) or bool(fatal))
            if fatal:
                raise_fatal(fatal[0], name, f"batch {bi}")
            if not run.batch_done:
                raise PdsrError(f"policy {name!r}: batch {bi} stalled with samples unfinished (nothing left to run)")
            report = run.finish_batch()
            pre1 = sum(e.preemptions for e in engines), sum(e.prefill_tokens for e in engines)
            t0, t1 = report.start_s, report.end_s
            samples = [s for g in groups for s in g.samples]
            _check_lengths(name, bi, samples)
            finish = np.fromiter((s.finish_time_s for s in samples), dtype=np.float64, count=len(samples))
            work, alone = sample_bounds(samples, len(engines), cfg, coeffs)
            outcomes.append(BatchOutcome(
                batch_index=report.batch_index, groups=len(groups), samples=len(samples), start_s=t0,
                makespan_s=report.makespan_s, tokens=report.tokens, work_bound_s=work, longest_bound_s=alone,
                tail_s=tail_time(finish, t1, cfg.tail_fraction), stats=report.stats, busy_s=report.engine_busy_s,
                finish_times=finish - t0, group_objects=groups if keep_groups else None, policy=report.policy,
                preemptions=pre1[0] - pre0[0], prefill_tokens=pre1[1] - pre0[1],
                **(_turn_slots(samples, run.scheduler.held_turn_slot_s - held0) if batches.multi_turn else {})))
            bar.update(1)
    totals = {k: sum(b.stats.get(k, 0) for b in outcomes) for k in STAT_KEYS}
    return PolicyRun(policy=name, settings=settings.model_dump(), batches=outcomes, engines=engines,
                     events=events, wall_s=time.perf_counter() - wall0, stats=totals)


def _turn_slots(samples: list[Sample], held_s: float) -> dict[str, float]:
    """A batch of a trace of turns: slot-seconds of requests on engines, slot-seconds held by samples waiting on
    their environment (``held_s``, from the scheduler), and the seconds samples waited on it."""
    slot = sum((seg.end_time_s or seg.submit_time_s) - seg.submit_time_s for s in samples for seg in s.segments)
    wait = sum((t.end_s or t.start_s) - t.start_s for s in samples for t in (s.turns or ()) if t.role == "environment")
    return {"slot_s": slot, "env_slot_s": held_s, "env_wait_s": wait}


def _check_lengths(policy: str, batch: int, samples: list[Sample]) -> None:
    for s in samples:
        if not s.finished or (s.num_generated != s.max_tokens and s.finish_reason != TRUNCATED):
            raise PdsrError(f"policy {policy!r}, batch {batch}: sample {s.key} ended with {s.num_generated} of "
                            f"{s.max_tokens} tokens ({s.finish_reason}); the simulation lost tokens (a bug)")


def simulate(trace, cfg: SimulateConfig, *, progress: ProgressFactory = silent_progress,
             keep_groups: bool = False) -> "SimulationReport":
    """Simulate ``trace`` with every policy of ``cfg.policy``; returns the report (see :mod:`report`)."""
    from pdsr_sdk.sim.report import SimulationReport

    batches = trace_batches(trace, cfg)
    names = run_names(cfg)
    runs = [run_policy(batches, cfg, name, keep_groups=keep_groups, record=cfg.timeline, progress=progress)
            for name in names]
    if batches.multi_turn and not cfg.hold_turn_slots and (cfg.references if cfg.references is not None
                                                           else len(policy_names(cfg.policy)) > 1):
        # the slot-holding reference: baseline as a framework that keeps each request's slot through its
        # environment's wait would run it
        held = run_policy(batches, cfg, "baseline", keep_groups=keep_groups, record=cfg.timeline, progress=progress,
                          hold_turn_slots=True)
        held.policy = HOLD_REFERENCE
        runs.append(held)
    return SimulationReport(cfg, batches, runs)


#: the name of the slot-holding reference run in a multi-turn simulation's report
HOLD_REFERENCE = "baseline-hold"


def trajectories_table(groups: list[Group]):
    """The simulated samples as a trajectories table (the schema `pdsr rollout` writes; no token ids)."""
    import pyarrow as pa

    from pdsr_sdk.dispatch.trajectory import sample_row, trajectory_schema

    rows = [sample_row(s, None, None, decode=False) for g in groups for s in g.samples]
    return pa.Table.from_pylist(rows, schema=trajectory_schema())


def apply_policy_sets(cfg: SimulateConfig, items: list[tuple[str | None, str, Any]]) -> SimulateConfig:
    """Add ``(policy or None, key, value)`` settings to ``cfg.policy_settings``
    (:func:`~pdsr_sdk.policies.resolve.with_policy_sets`); the reference schedules a run adds
    (:func:`run_names`) count as selected."""
    return with_policy_sets(cfg, items, run_names(cfg) if items else None, simulation=True)
