"""``baseline``: what trainers do today. Every comparison is against it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.dispatch.types import Group
from pdsr_sdk.dispatch.policy import contiguous_chunks
from pdsr_sdk.policies.base import Policy


class BaselineSettings(ConfigModel):
    """Settings of the baseline policy."""

    assignment: Literal["chunk", "round_robin"] = Field(
        "chunk", description="'chunk': split the B x N samples into equal contiguous chunks, one per engine "
                             "(verl's split of a batch over rollout replicas; a group stays together); "
                             "'round_robin': sample i goes to engine i mod E.")


class BaselinePolicy(Policy):
    """Submit all B x N samples at once, spread evenly over all engines; no probe, no cap."""

    name = "baseline"
    config_model = BaselineSettings
    streaming = True   # each on_batch splits only its own samples; no per-batch state

    def on_batch(self, groups: list[Group]) -> None:
        engines = [e for pool in self.ctx.pools().values() for e in pool]
        engines.sort(key=lambda e: e.name)
        samples = [s for g in groups for s in g.samples]
        n_eng = len(engines)
        if self.cfg.assignment == "chunk":
            placed = contiguous_chunks(samples, engines)
        else:
            placed = [(sample, engines[i % n_eng]) for i, sample in enumerate(samples)]
        for sample, engine in placed:
            self.ctx.submit(sample, engine=engine)
