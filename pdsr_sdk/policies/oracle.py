"""Reference schedules for ``pdsr simulate`` only: ``oracle`` (true lengths) and ``oracle-probe`` (probe lengths).

Neither could run on real engines: both read what a length trace forces every simulated sample to
generate (``sample.max_tokens`` of a ``forced`` sample; ``group.target_lengths``). They are yardsticks:
the report gives every policy's share of each reference's gain over baseline.

- ``oracle`` knows every sample's true length. Per batch it keeps the better of two schedules:

  - ``longest_first``: every sample, longest first, over all engines (see placement below);
  - ``heavy_tail``: the longest ``heavy_fraction`` (2%) of the samples alone on the heavy pool,
    longest first, and the rest longest first on the fast pool (needs both pools; skipped without).

  "Keeps the better" is done by the simulator, not by the policy: :meth:`OraclePolicy.simulation_variants`
  names the two variants, ``pdsr simulate`` runs each over every batch and keeps each batch's
  outcome with the smaller makespan (batches run one after another on empty engines, so the
  kept outcomes are one schedule). ``variant`` picks one of them alone.
- ``oracle-probe`` knows each group's probe length (sample 0's) from the start and nothing else:
  every sample, ranked by its group's probe length (longest first), over all engines.

Placement (``placement``) of a ranked list on a set of engines: ``list`` is list scheduling (the
first samples are dealt to the engine with the fewest dealt so far for its slots, round robin on
equal engines; then each slot that frees takes the next one); ``lpt`` submits every sample at once
to a per-engine queue, each to the engine with the least known work per slot so far (greedy LPT, as
the ``lpt`` policy does with predictions); ``best`` runs both and keeps each batch's better (as
``variant: best`` does), at twice the simulation time. The two are within about 1% of
each other; the defaults are the better one measured (docs/notes/reference-schedules.md): ``lpt`` for ``oracle``
(on examples/traces/synth_256x8.jsonl, 6 + 2 engines: 49.14 s against 49.39 s at 128 prompts per
batch, 28.43 s against 28.74 s at 512), ``list`` for ``oracle-probe`` (equal there; 105.8 s against
107.6 s on a 1024-group synthetic trace at 512 prompts per batch).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any, Literal

from pydantic import Field

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.dispatch.protocols import Engine
from pdsr_sdk.dispatch.types import FAST, HEAVY, Group, Sample
from pdsr_sdk.errors import PdsrError
from pdsr_sdk.policies.base import Policy

_PLACEMENT_HELP = ("'list': list scheduling (deal the first samples evenly by slots, then each freed slot takes "
                   "the next); 'lpt': submit everything at once to per-engine queues, each sample to the engine "
                   "with the least known work per slot; 'best': the simulator runs both and keeps each batch's "
                   "better (twice the simulation time).")


class OracleSettings(ConfigModel):
    """Settings of the oracle reference schedule (simulator only)."""

    variant: Literal["best", "longest_first", "heavy_tail"] = Field(
        "best", description="'best': per batch the better of the two schedules (the simulator runs both); "
                            "'longest_first': true-length longest first over all engines; 'heavy_tail': the "
                            "longest heavy_fraction of the samples alone on the heavy pool, the rest longest "
                            "first on the fast pool.")
    heavy_fraction: float = Field(0.02, gt=0, le=1, description="Share of a batch's samples (the longest; "
                                                                "ceil(fraction x samples)) run alone on the "
                                                                "heavy pool by the heavy_tail schedule.")
    placement: Literal["list", "lpt", "best"] = Field("lpt", description=_PLACEMENT_HELP + " Default: lpt, the "
                                                      "better measured for this reference.")


class OracleProbeSettings(ConfigModel):
    """Settings of the oracle-probe reference schedule (simulator only)."""

    placement: Literal["list", "lpt", "best"] = Field("list", description=_PLACEMENT_HELP + " Default: list, "
                                                      "the better measured for this reference.")


def _placements(settings: Any) -> list[tuple[str, Any]]:
    """(label, settings) per placement: both for 'best' (labels "list", "lpt"), else the one given."""
    if settings.placement != "best":
        return [("", settings)]
    return [(p, settings.model_copy(update={"placement": p})) for p in ("list", "lpt")]


def _join(*labels: str) -> str:
    return "/".join(label for label in labels if label)


class _KnownLengthFirst(Policy):
    """Rank a batch's samples by a length known from the trace, place them longest first per scope."""

    simulation_only = True

    @classmethod
    def simulation_variants(cls, settings: Any, pools: set[str]) -> list[tuple[str, Any]]:
        return _placements(settings)

    def __init__(self, config: Any, ctx):
        super().__init__(config, ctx)
        self.known: dict[Sample, int] = {}
        self.waiting: dict[str, deque[Sample]] = {}   # engine name -> its scope's queue (shared object)
        self.pending: list[deque[Sample]] = []
        self.dealing = False

    def length_of(self, sample: Sample) -> int:  # pragma: no cover - subclasses override
        raise NotImplementedError

    def scopes(self, ranked: list[Sample]) -> list[tuple[list[Engine], list[Sample]]]:
        """(engines, samples longest first) that are scheduled separately; default: one over every engine."""
        return [(self._engines(), ranked)]

    def _engines(self, pool: str | None = None) -> list[Engine]:
        pools = self.ctx.pools()
        engines = [e for p, es in pools.items() if pool is None or p == pool for e in es]
        return sorted(engines, key=lambda e: e.name)

    def on_batch(self, groups: list[Group]) -> None:
        samples = [s for g in groups for s in g.samples]
        known = [(self.length_of(s), s) for s in samples]
        known.sort(key=lambda t: (-t[0], t[1].group.position, t[1].index))
        self.known = {s: n for n, s in known}
        self.waiting = {}
        self.pending = []
        self.dealing = True
        try:
            for engines, ranked in self.scopes([s for _, s in known]):
                if not ranked:
                    continue
                if not engines:
                    raise PdsrError(f"policy {self.name!r}: no live engine to run {len(ranked)} sample(s)")
                if self.cfg.placement == "lpt":   # "best" outside the simulator's variants: list
                    self._lpt(engines, ranked)
                else:
                    self._deal(engines, ranked)
        finally:
            self.dealing = False

    def _deal(self, engines: list[Engine], ranked: list[Sample]) -> None:
        queue = deque(ranked)
        # the engine with the fewest samples dealt for its slots takes the next (round robin on equal engines)
        heap = [(0.0, i) for i, e in enumerate(engines) if self.ctx.free_slots(e) > 0]
        room = [self.ctx.free_slots(e) for e in engines]
        dealt = [0] * len(engines)
        heapq.heapify(heap)
        while queue and heap:
            _, i = heapq.heappop(heap)
            self.ctx.submit(queue.popleft(), engine=engines[i])
            dealt[i] += 1
            if dealt[i] < room[i]:
                heapq.heappush(heap, (dealt[i] / engines[i].max_concurrency, i))
        if queue:
            self.pending.append(queue)
            for e in engines:
                self.waiting[e.name] = queue

    def _lpt(self, engines: list[Engine], ranked: list[Sample]) -> None:
        heap = [(0.0, i) for i in range(len(engines))]
        for sample in ranked:
            load, i = heapq.heappop(heap)
            engine = engines[i]
            self.ctx.submit(sample, engine=engine)
            heapq.heappush(heap, (load + self.known[sample] / engine.max_concurrency, i))

    def on_worker_idle(self, engine: Engine) -> None:
        queue = self.waiting.get(engine.name) if not self.dealing else None
        if not queue:
            return
        # inside the scheduler's pump: submitted samples launch after this returns, so count the room once
        for _ in range(min(self.ctx.free_slots(engine), len(queue))):
            self.ctx.submit(queue.popleft(), engine=engine)

    def idle_interest(self, pool: str) -> bool:
        return any(self.pending)

    def on_engine_lost(self, engine: Engine, requeued: list[Sample]) -> None:
        self.waiting.pop(engine.name, None)


def _true_length(policy: str, sample: Sample) -> int:
    if not sample.forced:
        raise PdsrError(f"policy {policy!r} reads the true lengths of a length trace; sample {sample.key} has "
                        f"none (it is a reference schedule for `pdsr simulate` only)")
    return sample.max_tokens


class OraclePolicy(_KnownLengthFirst):
    """True lengths: the better per batch of longest first over all engines and the longest 2% alone on heavy."""

    name = "oracle"
    config_model = OracleSettings

    @classmethod
    def simulation_variants(cls, settings: OracleSettings, pools: set[str]) -> list[tuple[str, Any]]:
        if settings.variant != "best":
            schedules = [(settings.variant, settings)]
        else:
            schedules = [("longest_first", settings.model_copy(update={"variant": "longest_first"}))]
            if {FAST, HEAVY} <= pools:
                schedules.append(("heavy_tail", settings.model_copy(update={"variant": "heavy_tail"})))
        return [(_join(label, placed), s) for label, v in schedules for placed, s in _placements(v)]

    def length_of(self, sample: Sample) -> int:
        return _true_length(self.name, sample)

    def _variant(self) -> str:
        pools = self.ctx.pools()
        # "best" run on its own (not as the simulator's variants, e.g. in a test's DispatchRun) cannot
        # compare: it runs longest_first, as heavy_tail does without both pools
        if self.cfg.variant == "heavy_tail" and pools.get(FAST) and pools.get(HEAVY):
            return "heavy_tail"
        return "longest_first"

    def scopes(self, ranked: list[Sample]) -> list[tuple[list[Engine], list[Sample]]]:
        self.variant = self._variant()
        if self.variant == "longest_first":
            return super().scopes(ranked)
        k = math.ceil(self.cfg.heavy_fraction * len(ranked) - 1e-9)
        return [(self._engines(HEAVY), ranked[:k]), (self._engines(FAST), ranked[k:])]

    def batch_report(self) -> dict[str, Any]:
        return {"variant": getattr(self, "variant", None)}


class OracleProbePolicy(_KnownLengthFirst):
    """Each group's probe length, known for free from the start: longest first by it over all engines."""

    name = "oracle-probe"
    config_model = OracleProbeSettings

    def length_of(self, sample: Sample) -> int:
        lengths = sample.group.target_lengths
        if not lengths:
            raise PdsrError(f"policy {self.name!r} reads each group's probe length from a length trace; group "
                            f"{sample.group.prompt_id!r} has none (it is a reference schedule for `pdsr simulate` "
                            f"only)")
        return lengths[0]
