"""``v2.5``: rank-based offloading with a dynamic cap (seed 002, the final design).

Every engine probes the batch in parallel (sample 0 of each prompt). When all
probes are back, prompts are sorted by probe length: the top 20% send their
other samples to the heavy pool; the rest stay on the fast pool with a cap of
``1.5 x L_cut``, where ``L_cut`` is the probe length at the 20% boundary of
this batch (the shortest offloaded probe). A fast sample that reaches the cap
"breaks": it moves to the heavy pool and continues from its tokens
(``on_break: resume``) or starts over there (``restart``, as the seed's
simulation counted it).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pdsr_sdk.analysis.stats import cap_tokens, offload_count
from pdsr_sdk.config import ConfigModel
from pdsr_sdk.dispatch.types import FAST, HEAVY, Group, Sample
from pdsr_sdk.policies.base import ProbeBarrierPolicy


class V25Settings(ConfigModel):
    """Settings of the v2.5 rank-based offloading policy."""

    offload_fraction: float = Field(
        0.20, ge=0.0, le=1.0, description="Fraction of prompts (longest probes first; floor(fraction x B) of them, at "
                                          "least 1: seed 002's 25 of 128) whose samples go to the heavy pool.")
    cap_multiplier: float = Field(1.5, gt=0, description="Fast-pool cap = floor(cap_multiplier x L_cut) tokens; a fast "
                                                         "sample longer than that breaks.")
    min_cap_tokens: int = Field(16, ge=1, description="The fast cap is never below this many tokens.")
    on_break: Literal["resume", "restart"] = Field(
        "resume", description="A fast sample over the cap continues on heavy from its tokens, or starts over there.")
    probe_pools: Literal["all", "fast"] = Field(
        "all", description="Run probes on every engine (split by slots) or on the fast pool only.")
    probe_timeout_s: float | None = Field(
        None, gt=0, description="Stop waiting for probes this long after the batch started (not in the seed; v1's "
                                "mitigation of the probe barrier): unfinished probes rank as the longest, continue on "
                                "the heavy pool, and their prompts go heavy. null = wait for every probe.")


class RankOffloadPolicy(ProbeBarrierPolicy):
    name = "v2.5"
    config_model = V25Settings
    required_pools = (FAST, HEAVY)
    #: this batch's cut (the probe length at the offload boundary) and fast-pool cap; set when it is routed
    l_cut: int | None = None
    cap: int | None = None

    def probe_pools(self) -> tuple[str, ...]:
        return (FAST, HEAVY) if self.cfg.probe_pools == "all" else (FAST,)

    def on_batch(self, groups: list[Group]) -> None:
        self.l_cut = None
        self.cap = None
        super().on_batch(groups)

    def batch_report(self) -> dict[str, Any]:
        return {"l_cut": self.l_cut, "fast_cap": self.cap}

    def on_probe_timeout(self, probe: Sample) -> None:
        engine = self.ctx.engine_of(probe)
        if engine is None or engine.pool != HEAVY:
            self.ctx.move(probe, HEAVY, cap=None)

    def route(self) -> None:
        late = set(self.timed_out)
        # timed-out probes rank first (their length is at least what they have so far)
        ranked = sorted(self.groups, key=lambda g: (g.samples[0] not in late,
                                                    -g.samples[0].num_generated, g.position))
        n_heavy = offload_count(self.cfg.offload_fraction, len(ranked)) if self.cfg.offload_fraction > 0 else 0
        n_heavy = max(n_heavy, len(late))
        heavy, fast = ranked[:n_heavy], ranked[n_heavy:]
        boundary = heavy[-1] if heavy else ranked[0]
        self.l_cut = boundary.samples[0].num_generated
        # floor: for integer lengths, "length > floor(1.5 L_cut)" is exactly "length > 1.5 L_cut"
        self.cap = max(self.cfg.min_cap_tokens, int(cap_tokens(self.cfg.cap_multiplier, self.l_cut)))
        for g in heavy:
            self.route_group(g, HEAVY)
        for g in fast:
            self.route_group(g, FAST, cap=self.cap)

    def on_over_cap(self, sample: Sample, engine) -> None:
        self.ctx.count("breaks")
        self.ctx.move(sample, HEAVY, restart=self.cfg.on_break == "restart", cap=None)
