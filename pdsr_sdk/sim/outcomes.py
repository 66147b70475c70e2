"""What simulating one policy returns (:class:`PolicyRun`, of one :class:`BatchOutcome` per batch), and
:func:`best_of`, which makes one run of a policy's variant runs."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pdsr_sdk.dispatch.run import STAT_KEYS
from pdsr_sdk.dispatch.types import Group

if TYPE_CHECKING:
    from pdsr_sdk.sim.engine import SimEngine


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
