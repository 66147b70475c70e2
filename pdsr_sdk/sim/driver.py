"""Run a length trace through a dispatch policy on simulated engines, in virtual time.

Batches are consecutive runs of ``batch_size`` prompt groups of the trace,
run one after another (like GRPO steps); the policy instance persists across
batches. Every sample is forced to its recorded length. A trace of turns replays each multi-turn sample
turn by turn through the same scheduler (:class:`TurnReplay`): each turn is a request; at its end the sample is
parked (no slot held) and, after the trace's environment delay on the virtual clock, continues with the
environment's tokens (prefilled by the engine that runs the next turn) or, after its last turn, finishes. A policy with several
:meth:`~pdsr_sdk.dispatch.policy.Policy.simulation_variants` (the ``oracle`` reference) runs once per
variant, and its run keeps each batch's best outcome (:func:`best_of`). The same run assembly
(:class:`~pdsr_sdk.dispatch.run.DispatchRun`: scheduler, policy classes, batch reports) as a real
``pdsr rollout`` run drives :class:`~pdsr_sdk.sim.engine.SimEngine` s on a
:class:`~pdsr_sdk.dispatch.clock.VirtualClock`.
"""

from __future__ import annotations

import bisect
import gc
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig
from pdsr_sdk.dispatch.run import STAT_KEYS, DispatchRun
from pdsr_sdk.dispatch.types import FAST, HEAVY, STOP, TRUNCATED, Group, Sample, TurnRecord
from pdsr_sdk.errors import ConfigError, DataError, PdsrError
from pdsr_sdk.policies.resolve import policy_names, reference_policies, resolve_policy, with_policy_sets
from pdsr_sdk.progress import ProgressFactory, silent_progress
from pdsr_sdk.sim.config import EngineProfile, SimulateConfig
from pdsr_sdk.sim.cost import least_prefill
from pdsr_sdk.sim.engine import SimEngine
from pdsr_sdk.sim.report import batch_bounds, tail_time

if TYPE_CHECKING:
    from pdsr_sdk.sim.report import SimulationReport


@dataclass
class TraceBatches:
    """The trace cut into batches: per batch, the groups' ids, prompt lengths and forced lengths."""

    source: str
    #: per batch, its groups as (prompt id, prompt length, lengths, finish reasons or None, turns or None)
    batches: list[list[tuple[str, int, list[int], list[str] | None, list | None]]]
    zero_length_samples: int
    n: int | None

    @property
    def multi_turn(self) -> bool:
        """Whether any group has samples with turns (a trace of turns)."""
        return any(g[4] is not None for b in self.batches for g in b)

    @property
    def num_groups(self) -> int:
        return sum(len(b) for b in self.batches)

    @property
    def num_samples(self) -> int:
        return sum(len(g[2]) for b in self.batches for g in b)


@dataclass
class BatchOutcome:
    batch_index: int
    groups: int
    samples: int
    start_s: float
    makespan_s: float
    tokens: int
    work_bound_s: float        # least engine-seconds of the batch / number of engines
    longest_bound_s: float     # the slowest single sample alone on the cheapest engine
    tail_s: float              # time from when (1 - tail_fraction) of its samples had finished to its end
    stats: dict[str, int]
    busy_s: dict[str, float]
    finish_times: np.ndarray | None = None
    group_objects: list[Group] | None = None
    policy: dict[str, Any] = field(default_factory=dict)   # the policy's facts (Policy.batch_report)
    preemptions: int = 0       # requests evicted from a full KV cache during the batch (all engines)
    prefill_tokens: int = 0    # context tokens prefilled during the batch (all engines)
    slot_s: float = 0.0        # slot-seconds of requests on engines (launch to segment end), all samples
    env_slot_s: float = 0.0    # slot-seconds held by samples waiting on their environment (hold_turn_slots)
    env_wait_s: float = 0.0    # seconds samples spent waiting on their environment (multi-turn), summed

    @property
    def lower_bound_s(self) -> float:
        return max(self.work_bound_s, self.longest_bound_s)


@dataclass
class EngineView:
    """One engine of a best-of run: its occupancy stitched from the batches the run kept (what the
    timeline reads; the rest of an engine's numbers are per batch in :class:`BatchOutcome`)."""

    name: str
    pool: str
    max_concurrency: int
    occupancy_t: list[float] = field(default_factory=lambda: [0.0])
    occupancy_n: list[int] = field(default_factory=lambda: [0])


@dataclass
class PolicyRun:
    """One policy's simulated run over all batches."""

    policy: str
    settings: dict[str, Any]
    batches: list[BatchOutcome]
    engines: list[SimEngine] | list[EngineView]
    events: int
    wall_s: float
    stats: dict[str, int] = field(default_factory=dict)
    #: a best-of run (several simulation variants): per variant, its own makespan and batches kept
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def makespan_s(self) -> float:
        return sum(b.makespan_s for b in self.batches)

    @property
    def lower_bound_s(self) -> float:
        return sum(b.lower_bound_s for b in self.batches)

    @property
    def tokens(self) -> int:
        return sum(b.tokens for b in self.batches)

    @property
    def groups(self) -> list[Group]:
        return [g for b in self.batches for g in (b.group_objects or [])]

    @property
    def env_slot_share(self) -> float:
        """The share of slot-time held by samples waiting on their environment (0 when parked samples free it)."""
        held = sum(b.env_slot_s for b in self.batches)
        total = held + sum(b.slot_s for b in self.batches)
        return held / total if total > 0 else 0.0


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


def trace_batches(trace, cfg: SimulateConfig) -> TraceBatches:
    """Cut ``trace`` (a LengthTrace) into batches of ``cfg.batch_size`` groups; lengths 0 become 1."""
    source = trace.source or "trace"
    sizes = trace.group_sizes
    if cfg.n is not None and trace.num_groups and sizes.min() < cfg.n:
        bad = int(np.argmax(sizes < cfg.n))
        raise DataError(f"{source}: n is {cfg.n} but group {bad} ({trace.prompt_ids[bad]!r}) has only "
                        f"{sizes[bad]} samples")
    lengths = trace.lengths.tolist()
    offsets = trace.offsets.tolist()
    plens = trace.prompt_lens.tolist()
    reasons = [str(r) for r in trace.finish_reasons] if trace.finish_reasons is not None else None
    turns = trace.turns if getattr(trace, "multi_turn", False) else None
    groups = []
    zero = 0
    for g, pid in enumerate(trace.prompt_ids):
        lo = offsets[g]
        hi = lo + cfg.n if cfg.n is not None else offsets[g + 1]
        lens = lengths[lo:hi]
        if 0 in lens:
            zero += lens.count(0)
            lens = [max(1, x) for x in lens]
        group_turns = None if turns is None else [turns.of(i) for i in range(lo, hi)]
        groups.append((pid, plens[g], lens, reasons[lo:hi] if reasons is not None else None, group_turns))
    b = cfg.batch_size
    batches = [groups[i:i + b] for i in range(0, len(groups), b)]
    if cfg.num_batches is not None:
        batches = batches[:cfg.num_batches]
    if not batches:
        raise DataError(f"{source}: the trace has no groups")
    return TraceBatches(source, batches, zero, cfg.n)


def build_batch(rows) -> list[Group]:
    """Groups of forced samples (prompt ids not kept: only lengths matter to the simulator)."""
    groups = []
    for i, (pid, plen, lens, reasons, turns) in enumerate(rows):
        g = Group(prompt_id=pid, prompt_token_ids=[], prompt_text="", n=len(lens), target_lengths=lens,
                  target_finish_reasons=reasons, position=i, prompt_length=plen, target_turns=turns)
        g.samples = [Sample(group=g, index=k, max_tokens=n, forced=True) for k, n in enumerate(lens)]
        if turns is not None:
            for s, t in zip(g.samples, turns):
                if t is not None:   # counts only: no ids, so no mask either (the trajectory's turns say it)
                    s.turns = []
                    s.turn_end = t[0][0]
        groups.append(g)
    return groups


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


def bound_coefficients(cfg: SimulateConfig) -> dict[str, float]:
    """The cheapest cost of every term over the pools that have engines (for the lower bound)."""
    profiles: list[EngineProfile] = []
    if cfg.fast:
        profiles.append(cfg.profiles.fast)
    if cfg.heavy:
        profiles.append(cfg.profiles.heavy)
    return dict(c0=min(p.c0_s for p in profiles), c1=min(p.c1_s_per_seq for p in profiles),
                c2=min(p.c2_s_per_token for p in profiles), prefill=min(p.prefill_s_per_token for p in profiles),
                max_seqs=max(p.max_num_seqs for p in profiles))


def least_prefill_tokens(prompt_len, prompt_ids, cfg: SimulateConfig, *, each: bool = False) -> np.ndarray:
    """The least tokens each sample of a batch prefills (for the lower bound). Together (the work): the first
    sample of each prompt its whole prompt, a later one, where a pool in use caches prompts, the least that
    any such pool's prefix cache leaves (``cost.least_prefill``). ``each``: the least each one alone may
    prefill (the longest-sample bound): which sample of a shared prompt comes first is not known, so only a
    prompt's sole sample pays it whole."""
    if each:
        counts = Counter(prompt_ids)
        whole = np.fromiter((counts[pid] == 1 for pid in prompt_ids), dtype=bool, count=len(prompt_ids))
    else:
        firsts = {pid: i for i, pid in reversed(list(enumerate(prompt_ids)))}   # each prompt's first index
        whole = np.zeros(len(prompt_ids), dtype=bool)
        whole[list(firsts.values())] = True
    blocks = {p.block_size for p, k in ((cfg.profiles.fast, cfg.fast), (cfg.profiles.heavy, cfg.heavy))
              if k and p.prompt_cache}
    if not blocks:
        return np.asarray(prompt_len, dtype=np.int64)
    return np.min([least_prefill(prompt_len, whole, b) for b in sorted(blocks)], axis=0)


def sample_bounds(samples: list[Sample], engines: int, cfg: SimulateConfig,
                  coeffs: dict[str, float]) -> tuple[float, float]:
    """(work / engines, longest alone) of finished samples (``report.batch_bounds``), with each prompt's
    least prefill (:func:`least_prefill_tokens`); samples with turns by :func:`turn_bounds`."""
    plen = np.fromiter((s.group.prompt_len for s in samples), dtype=np.int64, count=len(samples))
    gen = np.fromiter((s.num_generated for s in samples), dtype=np.int64, count=len(samples))
    pids = [s.group.prompt_id for s in samples]
    if any(s.turns is not None for s in samples):
        return turn_bounds(samples, plen, pids, engines, cfg, coeffs)
    return batch_bounds(plen, gen, engines, **coeffs, prefill_len=least_prefill_tokens(plen, pids, cfg),
                        alone_prefill_len=least_prefill_tokens(plen, pids, cfg, each=True))


def turn_bounds(samples: list[Sample], plen: np.ndarray, pids: list[str], engines: int, cfg: SimulateConfig,
                coeffs: dict[str, float]) -> tuple[float, float]:
    """The lower bound of :mod:`~pdsr_sdk.sim.report` for samples with turns: a sampled token is a step at its
    context (prompt + every response token before it, the environment's included), the environment's tokens are
    prefilled at least once each, and alone a sample also waits out its environment's delays one after another."""
    c0, c1, c2, p, m = coeffs["c0"], coeffs["c1"], coeffs["c2"], coeffs["prefill"], coeffs["max_seqs"]
    q = least_prefill_tokens(plen, pids, cfg).astype(np.float64)
    q_alone = least_prefill_tokens(plen, pids, cfg, each=True).astype(np.float64)
    sampled, env, delay, ctx = (np.zeros(len(samples)) for _ in range(4))
    for i, s in enumerate(samples):
        target = s.group.target_turns
        turns = target[s.index] if target is not None else None
        big_p = float(s.group.prompt_len)
        if turns is None:
            n = float(s.num_generated)
            sampled[i], ctx[i] = n, n * big_p + n * (n - 1) / 2
            continue
        pos = 0
        for k, e, d in turns:
            sampled[i] += k
            ctx[i] += k * (big_p + pos) + k * (k - 1) / 2
            pos += k + e
            env[i] += e
            delay[i] += d
    work = p * (q + env) + sampled * (c0 / m + c1) + c2 * ctx
    alone = p * (q_alone + env) + sampled * (c0 + c1) + c2 * ctx + delay
    return float(work.sum()) / engines, float(alone.max()) if alone.size else 0.0


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
    variant and the run keeps each batch's best outcome (:func:`best_of`). ``hold_turn_slots`` (default:
    ``cfg.hold_turn_slots``): multi-turn samples keep their slot while their environment works.
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
                       progress=progress, hold=hold, desc=f"simulate {name}" + (f" ({label})" if len(variants) > 1 else ""))
        runs.append((label, run))
    if len(runs) == 1:
        return runs[0][1]
    return best_of(name, settings.model_dump(), runs)


def best_of(name: str, settings: dict[str, Any], runs: list[tuple[str, PolicyRun]]) -> PolicyRun:
    """One run made of each batch's shortest outcome among ``runs`` (labelled variants of one policy over
    the same batches). Batches run one after another on empty engines, so the kept outcomes are a
    schedule: batch start times are recomputed and the engines' occupancy is stitched from the kept
    batches. Each kept batch's ``policy`` facts name its variant and every variant's makespan."""
    kept: list[BatchOutcome] = []
    sources: list[tuple[BatchOutcome, PolicyRun]] = []
    counts = dict.fromkeys((label for label, _ in runs), 0)
    start = 0.0
    for bi in range(len(runs[0][1].batches)):
        label, run = min(runs, key=lambda lr: lr[1].batches[bi].makespan_s)   # ties: the first variant
        b = run.batches[bi]
        counts[label] += 1
        facts = {**b.policy, "variant": label,
                 "variant_makespans_s": {lb: r.batches[bi].makespan_s for lb, r in runs}}
        kept.append(BatchOutcome(**{**b.__dict__, "start_s": start, "policy": facts}))
        sources.append((b, run))
        start += b.makespan_s
    engines = [EngineView(e.name, e.pool, e.max_concurrency) for e in runs[0][1].engines]
    for i, view in enumerate(engines):
        for b_new, (b_old, run) in zip(kept, sources):
            _stitch(view, run.engines[i], b_old.start_s, b_old.makespan_s, b_new.start_s)
    totals = {k: sum(b.stats.get(k, 0) for b in kept) for k in STAT_KEYS}
    return PolicyRun(policy=name, settings=settings, batches=kept, engines=engines,
                     events=sum(r.events for _, r in runs), wall_s=sum(r.wall_s for _, r in runs), stats=totals,
                     variants={label: {"makespan_s": r.makespan_s, "batches_kept": counts[label]}
                               for label, r in runs})


def _stitch(view: EngineView, engine, t0: float, span: float, at: float) -> None:
    """Append ``engine``'s occupancy during ``[t0, t0 + span]`` to ``view``, moved to start at ``at``."""
    t, n = engine.occupancy_t, engine.occupancy_n
    lo, hi = bisect.bisect_left(t, t0), bisect.bisect_right(t, t0 + span)
    for k in range(lo, hi):
        view.occupancy_t.append(max(t[k] - t0 + at, view.occupancy_t[-1]))
        view.occupancy_n.append(n[k])
    if view.occupancy_n[-1] != 0:   # engines are empty between batches
        view.occupancy_t.append(at + span)
        view.occupancy_n.append(0)


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
