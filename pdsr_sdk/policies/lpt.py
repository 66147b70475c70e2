"""``lpt``: probe-guided longest-predicted-first with load balancing across engines.

Every engine probes (sample 0 of each prompt). When all probes are back, each
remaining sample's length is predicted by its prompt's probe length; samples
are queued longest first, each on the engine with the least predicted work
so far (greedy LPT list scheduling). Pools are ignored: every engine takes
any sample. This is the "obvious next policy" of the spec and an example of a
policy that is not one of the seed's: register yours the same way.
"""

from __future__ import annotations

import heapq
from typing import Literal

from pydantic import Field

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.dispatch.types import Group
from pdsr_sdk.policies.base import ProbeBarrierPolicy


class LptSettings(ConfigModel):
    """Settings of the lpt policy."""

    predictor: Literal["probe_length", "probe_time"] = Field(
        "probe_length",
        description="Predict a sample's cost by its prompt's probe length, or by the probe's wall time.")
    weight_by_slots: bool = Field(True, description="Divide an engine's predicted work by its slots (engines of "
                                                    "different concurrency).")


class LongestPredictedFirstPolicy(ProbeBarrierPolicy):
    name = "lpt"
    config_model = LptSettings

    def probe_pools(self) -> tuple[str, ...]:
        return tuple(p for p, engines in self.ctx.pools().items() if engines)

    def _predict(self, group: Group) -> float:
        probe = group.samples[0]
        if self.cfg.predictor == "probe_time":
            from pdsr_sdk.policies.base import probe_duration

            return probe_duration(probe)
        return float(probe.num_generated)

    def route(self) -> None:
        engines = sorted((e for pool in self.ctx.pools().values() for e in pool), key=lambda e: e.name)
        rest = [(self._predict(g), g.position, s) for g in self.groups for s in g.samples[1:]]
        rest.sort(key=lambda t: (-t[0], t[1], t[2].index))
        # min-heap of (predicted work per slot, engine order)
        heap = [(0.0, i) for i in range(len(engines))]
        for cost, _, sample in rest:
            load, i = heapq.heappop(heap)
            engine = engines[i]
            self.ctx.submit(sample, engine=engine)
            per_slot = cost / engine.max_concurrency if self.cfg.weight_by_slots else cost
            heapq.heappush(heap, (load + per_slot, i))
