"""``v1``: batch-synchronous probe (seed 001, section 1).

Sample 0 of every prompt runs on the fast pool, uncapped, and its wall time
is recorded. When every probe has finished (or the probe timeout passed), the
prompts are sorted by probe time: the top K% send their other N-1 samples to
the heavy pool, the rest to the fast pool under a static ``max_tokens`` cap
(a fast sample reaching it is truncated, finish reason ``truncated``).

Mitigations from the seed: a probe still running at the timeout is stopped
on the fast pool and its prompt marked heavy; the probe itself then continues
on the heavy pool (``resume``) or starts over there (``restart``), so the
group still gets all N samples.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pdsr_sdk.analysis.stats import offload_count
from pdsr_sdk.config import ConfigModel
from pdsr_sdk.dispatch.types import FAST, HEAVY, TRUNCATED, Group, Sample
from pdsr_sdk.policies.base import ProbeBarrierPolicy, probe_duration


class V1Settings(ConfigModel):
    """Settings of the v1 batch-sync probe policy."""

    top_fraction: float = Field(
        0.10, ge=0.0, le=1.0, description="K: fraction of prompts (by probe time, longest first; floor(K x B) of them, "
                                          "at least 1, as seed 002 counts its top 20%) sent to the heavy pool.")
    rank_by: Literal["time", "length"] = Field(
        "time", description="Rank probes by wall time (the seed's choice) or by response length.")
    probe_timeout_s: float | None = Field(
        5.0, gt=0, description="Stop probes still running this long after the batch started and mark their prompts "
                               "heavy; null disables.")
    on_probe_timeout: Literal["resume", "restart"] = Field(
        "resume", description="A stopped probe continues on the heavy pool from its tokens, or starts over there.")
    fast_max_tokens: int | None = Field(
        2048, ge=1,
        description="Static cap on response tokens for fast-pool samples; past it they are truncated. null = no cap.")


class BatchSyncProbePolicy(ProbeBarrierPolicy):
    name = "v1"
    config_model = V1Settings
    required_pools = (FAST, HEAVY)

    def on_over_cap(self, sample: Sample, engine) -> None:
        self.ctx.count("truncations")
        self.ctx.finish(sample, TRUNCATED)

    def on_probe_timeout(self, probe: Sample) -> None:
        self.ctx.move(probe, HEAVY, restart=self.cfg.on_probe_timeout == "restart")

    def route(self) -> None:
        late = {id(p.group) for p in self.timed_out}
        finished = [g for g in self.groups if id(g) not in late]

        def key(g: Group) -> float:
            probe = g.samples[0]
            return probe_duration(probe) if self.cfg.rank_by == "time" else probe.num_generated

        ranked = sorted(finished, key=lambda g: (-key(g), g.position))
        wanted = offload_count(self.cfg.top_fraction, len(self.groups)) if self.cfg.top_fraction > 0 else 0
        n_heavy = max(0, wanted - len(self.timed_out))
        for g in [p.group for p in self.timed_out] + ranked[:n_heavy]:
            self.route_group(g, HEAVY)
        for g in ranked[n_heavy:]:
            self.route_group(g, FAST, cap=self.cfg.fast_max_tokens)
