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

import math
from typing import Literal

from pydantic import Field

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.policies.base import Policy, probe_duration
from pdsr_sdk.rollout.types import FAST, HEAVY, TRUNCATED, Group, Sample


class V1Settings(ConfigModel):
    """Settings of the v1 batch-sync probe policy."""

    top_fraction: float = Field(0.10, ge=0.0, le=1.0, description="K: fraction of prompts (by probe time, longest first) sent to the heavy pool.")
    rank_by: Literal["time", "length"] = Field("time", description="Rank probes by wall time (the seed's choice) or by response length.")
    probe_timeout_s: float | None = Field(5.0, gt=0, description="Stop probes still running this long after the batch started and mark their prompts heavy; null disables.")
    on_probe_timeout: Literal["resume", "restart"] = Field("resume", description="A stopped probe continues on the heavy pool from its tokens, or starts over there.")
    fast_max_tokens: int | None = Field(2048, ge=1, description="Static cap on response tokens for fast-pool samples; past it they are truncated. null = no cap.")


class BatchSyncProbePolicy(Policy):
    name = "v1"
    config_model = V1Settings
    required_pools = (FAST, HEAVY)

    def on_batch(self, groups: list[Group]) -> None:
        self.groups = groups
        self.pending: set[Sample] = set(self.submit_probes(groups, (FAST,)))
        self.timed_out: list[Group] = []
        self.routed = False
        self.timer = None
        if self.cfg.probe_timeout_s is not None:
            self.timer = self.ctx.clock.call_later(self.cfg.probe_timeout_s, self._probe_timeout)

    def on_sample_finished(self, sample: Sample) -> None:
        if sample in self.pending:
            self.pending.discard(sample)
            if not self.pending:
                self._route()

    def on_over_cap(self, sample: Sample, engine) -> None:
        self.ctx.count("truncations")
        self.ctx.finish(sample, TRUNCATED)

    def _probe_timeout(self) -> None:
        if self.routed:
            return
        for probe in sorted(self.pending, key=lambda s: s.group.position):
            self.timed_out.append(probe.group)
            self.ctx.count("probe_timeouts")
            self.ctx.move(probe, HEAVY, restart=self.cfg.on_probe_timeout == "restart")
        self.pending.clear()
        self._route()

    def _route(self) -> None:
        if self.routed:
            return
        self.routed = True
        if self.timer is not None:
            self.timer.cancel()
        heavy = set(id(g) for g in self.timed_out)
        finished = [g for g in self.groups if id(g) not in heavy]

        def key(g: Group) -> float:
            probe = g.samples[0]
            return probe_duration(probe) if self.cfg.rank_by == "time" else probe.num_generated

        ranked = sorted(finished, key=lambda g: (-key(g), g.position))
        n_heavy = max(0, math.ceil(self.cfg.top_fraction * len(self.groups)) - len(self.timed_out))
        for g in self.timed_out + ranked[:n_heavy]:
            self.route_group(g, HEAVY)
        for g in ranked[n_heavy:]:
            self.route_group(g, FAST, cap=self.cfg.fast_max_tokens)
