"""The base class of dispatch policies: no-op hooks and the helpers every probing policy uses.

Subclass :class:`Policy` (also importable as ``pdsr_sdk.policies.base.Policy``) for a new policy; it
implements :class:`~pdsr_sdk.dispatch.protocols.Dispatcher`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.dispatch.protocols import DispatchContext, Engine
from pdsr_sdk.dispatch.types import FAST, HEAVY, TRUNCATED, Group, Sample
from pdsr_sdk.errors import RunError


class NoSettings(ConfigModel):
    """This policy has no settings."""


class Policy:
    """Default hooks do nothing; see :class:`pdsr_sdk.dispatch.protocols.Dispatcher`."""

    name: ClassVar[str] = ""
    config_model: ClassVar[type[ConfigModel]] = NoSettings
    #: pools this policy needs at least one engine in
    required_pools: ClassVar[tuple[str, ...]] = ()
    #: a reference schedule that reads what only the simulator knows (the trace's lengths): `pdsr simulate`
    #: runs it, `pdsr rollout` refuses it, and ``--policy all`` leaves it out
    simulation_only: ClassVar[bool] = False
    #: True if ``on_batch`` may be called again while groups of earlier calls still run (streaming:
    #: ``DispatchRun.add_groups``, ``pdsr simulate --steps``); a policy with per-batch state leaves it False
    streaming: ClassVar[bool] = False

    def __init__(self, config: Any, ctx: DispatchContext):
        self.cfg = config
        self.ctx = ctx

    @classmethod
    def simulation_variants(cls, settings: Any, pools: set[str]) -> list[tuple[str, Any]]:
        """``(label, settings)`` of the runs ``pdsr simulate`` makes of this policy on engines in ``pools``.

        With more than one, each variant runs over every batch and the report keeps, per batch, the
        variant with the smallest makespan (batches run one after another on empty engines, so the
        best of each is a schedule too). Default: one run with ``settings``.
        """
        return [("", settings)]

    def on_batch(self, groups: list[Group]) -> None:  # pragma: no cover - every policy overrides
        raise NotImplementedError

    def on_launch(self, sample: Sample, engine: Engine) -> None:
        pass

    def on_sample_finished(self, sample: Sample) -> None:
        pass

    def on_segment_end(self, sample: Sample, engine: Engine) -> None:
        pass

    def on_over_cap(self, sample: Sample, engine: Engine) -> None:
        self.ctx.finish(sample, TRUNCATED)

    def on_worker_idle(self, engine: Engine) -> None:
        pass

    def on_turn_parked(self, sample: Sample, engine: Engine) -> None:
        """A multi-turn sample's turn ended on ``engine``; it holds no slot while its environment works."""

    def on_next_turn(self, sample: Sample, engine: Engine) -> None:
        """A parked multi-turn sample's next turn is about to queue on ``engine`` (its prefix is cached there);
        ``ctx.move(sample, engine=...)`` here sends it elsewhere."""

    def idle_interest(self, pool: str) -> bool:
        """Whether ``on_worker_idle`` may act on an idle engine of ``pool`` now (default: yes).

        A speed hint for large pools: the scheduler skips telling a pool's idle engines when this is
        False. Return False only if ``on_worker_idle`` would do nothing for every engine of the pool
        until the scheduler's current pump ends (no hook called during it makes it act).
        """
        return True

    def on_engine_lost(self, engine: Engine, requeued: list[Sample]) -> None:
        pass

    def segment_floor(self, sample: Sample, engine: Engine) -> int:
        """The fewest tokens the next segment of ``sample`` should ask for (default 0: the budget-aware
        length alone; see :class:`~pdsr_sdk.dispatch.protocols.Dispatcher`)."""
        return 0

    def batch_report(self) -> dict[str, Any]:
        """Facts about the batch that just finished, for its report (default: none)."""
        return {}

    # ---------------------------------------------------------------- helpers
    def submit_probes(self, groups: list[Group], pools: tuple[str, ...] = (FAST,), *,
                      cap: int | None = None) -> list[Sample]:
        """Mark sample 0 of each group as its probe and queue the probes (uncapped by default).

        With several pools the probes are split in proportion to each pool's slots.
        """
        probes = []
        for g in groups:
            probe = g.samples[0]
            probe.is_probe = True
            probes.append(probe)
        live = self.ctx.pools()
        slots = [sum(e.max_concurrency for e in live.get(p, [])) for p in pools]
        total = sum(slots)
        if total == 0:
            raise RunError(f"policy {self.name or type(self).__name__!r}: no live engine in pool(s) {', '.join(pools)} "
                           f"to run probes (their engines failed or none was configured: see the engine errors, "
                           f"or set --fast/--heavy)")
        # largest-remainder split so the shares add up exactly
        quotas = [len(probes) * s / total for s in slots]
        counts = [math.floor(q) for q in quotas]
        for i in sorted(range(len(pools)),
                        key=lambda i: quotas[i] - counts[i], reverse=True)[: len(probes) - sum(counts)]:
            counts[i] += 1
        start = 0
        for pool, count in zip(pools, counts):
            for probe in probes[start:start + count]:
                self.ctx.submit(probe, pool, cap=cap)
            start += count
        self.ctx.count("probes", len(probes))
        return probes

    def route_group(self, group: Group, pool: str, *, cap: int | None = None) -> None:
        """Queue every not-yet-submitted sample of ``group`` (all but the probe) on ``pool``."""
        for s in group.samples[1:]:
            if not s.finished and self.ctx.engine_of(s) is None and s.submit_time_s is None:
                self.ctx.submit(s, pool, cap=cap)
        if pool == HEAVY:
            self.ctx.count("offloaded_prompts")


def contiguous_chunks(samples: list[Sample], engines: list[Engine]) -> list[tuple[Sample, Engine]]:
    """Baseline's split (verl's split of a batch over rollout replicas): sample i of n goes to engine
    floor(i x E / n), so the engines get equal contiguous chunks and a group stays together."""
    return [(s, engines[i * len(engines) // len(samples)]) for i, s in enumerate(samples)]


def probe_duration(sample: Sample) -> float:
    """Wall (or virtual) time a probe spent generating: first launch to finish."""
    start = sample.segments[0].submit_time_s if sample.segments else (sample.submit_time_s or 0.0)
    return (sample.finish_time_s or start) - start
