"""``v2``: streaming probe routing with a circuit breaker and work stealing (seed 001, section 2).

No batch barrier: each finished probe routes its prompt's other samples at
once. The threshold is the P-th percentile (default P80) of the last M probe
durations: above it, heavy; otherwise fast. On the fast pool a circuit
breaker watches every sample: past ``breaker_time_s`` of running or
``breaker_tokens`` tokens it is stopped, its context (prompt + generated ids)
is repacked and it continues on the heavy pool; its prompt is marked hard so
its remaining samples go heavy too. Idle engines steal: a fast engine takes
heavy-queue work under a strict time limit; a heavy engine takes fast-queue
work in bulk.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal

from pydantic import Field

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.dispatch.types import FAST, HEAVY, Group, Sample
from pdsr_sdk.policies.base import Policy, probe_duration


class V2Settings(ConfigModel):
    """Settings of the v2 streaming policy."""

    window: int = Field(64, ge=1, description="M: how many recent probe durations the threshold is computed over.")
    route_by: Literal["time", "length"] = Field(
        "time", description="What a probe is measured by: its wall time (the seed's choice; slows down as the fast "
                            "pool fills) or its length in tokens.")
    percentile: float = Field(80.0, gt=0, lt=100, description="P: the threshold is this percentile of the window.")
    min_history: int = Field(8, ge=1, description="Below this many probe durations every prompt is routed fast (the "
                                                  "breaker still guards).")
    breaker_time_s: float | None = Field(
        10.0, gt=0, description="A fast sample running longer than this moves to heavy; null disables.")
    breaker_tokens: int | None = Field(
        2048, ge=1, description="A fast sample generating more tokens than this moves to heavy; null disables.")
    breaker_on_probes: bool = Field(True, description="Apply the breaker to probes too (a broken probe marks its "
                                                      "prompt hard at once).")
    on_break: Literal["resume", "restart"] = Field(
        "resume", description="A broken sample continues on heavy from its tokens, or starts over.")
    steal: bool = Field(True, description="Let idle engines take work from the other pool's queue.")
    fast_steal_max: int = Field(1, ge=1, description="Heavy-queue samples an idle fast engine takes at a time.")
    fast_steal_time_limit_s: float = Field(
        5.0, gt=0,
        description="A stolen heavy sample still running on a fast engine after this long goes back to the heavy "
                    "queue.")
    heavy_steal_max: int | None = Field(
        None, ge=1,
        description="Fast-queue samples an idle heavy engine takes at a time; null = as many as it has free slots.")
    steal_below_load: float = Field(
        0.5, gt=0, le=1, description="An engine steals only while at most this fraction of its slots is busy (an idle "
                                     "worker, not merely one with a free slot); keeps one busy engine from collecting "
                                     "the other pool's queue.")


class StreamingProbePolicy(Policy):
    name = "v2"
    config_model = V2Settings
    required_pools = (FAST, HEAVY)
    streaming = True   # routes each group when its own probe finishes; its state spans batches

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.window: deque[float] = deque(maxlen=config.window)  # persists across batches
        self.hard: set[str] = set()
        self.routed: set[str] = set()
        # pending elapsed-time checks; cancelled when their sample finishes (most do, long before)
        self.breaker_timers: dict[Sample, object] = {}

    def on_batch(self, groups: list[Group]) -> None:
        self.submit_probes(groups, (FAST,), cap=self.cfg.breaker_tokens if self.cfg.breaker_on_probes else None)

    def threshold(self) -> float:
        if len(self.window) < self.cfg.min_history:
            return float("inf")
        return linear_percentile(self.window, self.cfg.percentile)

    def on_launch(self, sample: Sample, engine) -> None:
        if engine.pool != FAST or self.cfg.breaker_time_s is None:
            return
        if sample.is_probe and not self.cfg.breaker_on_probes:
            return
        if sample.segments[-1].pool != FAST:  # stolen heavy work has its own time limit
            return
        started = sample.run_start_s
        old = self.breaker_timers.pop(sample, None)
        if old is not None:
            old.cancel()
        self.breaker_timers[sample] = self.ctx.clock.call_later(
            self.cfg.breaker_time_s, lambda: self._check_elapsed(sample, engine, started))

    def _check_elapsed(self, sample: Sample, engine, started: float | None) -> None:
        self.breaker_timers.pop(sample, None)
        if not sample.finished and self.ctx.engine_of(sample) is engine and sample.run_start_s == started:
            self._break(sample, "time")

    def on_over_cap(self, sample: Sample, engine) -> None:
        self._break(sample, "tokens")

    def _break(self, sample: Sample, why: str) -> None:
        self.ctx.count("breaks")
        self.ctx.count(f"breaks_{why}")
        self.ctx.move(sample, HEAVY, restart=self.cfg.on_break == "restart", cap=None)
        self._mark_hard(sample.group)

    def _mark_hard(self, group: Group) -> None:
        if group.prompt_id in self.hard:
            return
        self.hard.add(group.prompt_id)
        if group.prompt_id not in self.routed:
            self.routed.add(group.prompt_id)
            self.route_group(group, HEAVY)
            return
        for s in self.ctx.queued(FAST):
            if s.group is group:
                self.ctx.move(s, HEAVY, cap=None)

    def on_sample_finished(self, sample: Sample) -> None:
        timer = self.breaker_timers.pop(sample, None)
        if timer is not None:
            timer.cancel()
        if not sample.is_probe:
            return
        group = sample.group
        duration = probe_duration(sample) if self.cfg.route_by == "time" else float(sample.num_generated)
        if group.prompt_id not in self.routed:
            self.routed.add(group.prompt_id)
            heavy = duration > self.threshold()
            self.route_group(group, HEAVY if heavy else FAST,
                             cap=None if heavy else self.cfg.breaker_tokens)
        self.window.append(duration)

    def idle_interest(self, pool: str) -> bool:
        # on_worker_idle acts only when the other pool's queue has work, and stealing never queues work
        if not self.cfg.steal:
            return False
        other = HEAVY if pool == FAST else FAST if pool == HEAVY else None
        return other is not None and self.ctx.queue_length(other) > 0

    def on_worker_idle(self, engine) -> None:
        """An engine of ``engine.pool`` went idle: the least loaded engine of that pool steals
        (busy engines hear "idle" most often; stealing for them would pile work on them)."""
        if not self.cfg.steal:
            return
        other = HEAVY if engine.pool == FAST else FAST if engine.pool == HEAVY else None
        if other is None or not self.ctx.queue_length(other):
            return
        thief = self.ctx.least_loaded(engine.pool)
        if thief is None:
            return
        limit = int(self.cfg.steal_below_load * thief.max_concurrency)
        busy = thief.max_concurrency - self.ctx.free_slots(thief)
        if busy > limit:
            return
        if thief.pool == FAST:
            self.ctx.steal(thief, HEAVY, self.cfg.fast_steal_max, time_limit_s=self.cfg.fast_steal_time_limit_s)
        else:
            room = max(1, limit - busy)
            self.ctx.steal(thief, FAST, min(room, self.cfg.heavy_steal_max or room), cap=None)


def linear_percentile(values, q: float) -> float:
    """``np.percentile(values, q)`` (method 'linear'), bit for bit, without numpy's per-call overhead.

    Same arithmetic in the same order: virtual index (n-1)*q/100, its floor, and numpy's two-sided lerp.
    """
    a = sorted(values)
    n = len(a)
    vi = (n - 1) * (q / 100)
    if vi >= n - 1:
        return float(a[-1])
    lo = math.floor(vi)
    gamma = vi - lo
    x, y = a[lo], a[lo + 1]
    diff = y - x
    return float(y - diff * (1 - gamma) if gamma >= 0.5 else x + diff * gamma)
