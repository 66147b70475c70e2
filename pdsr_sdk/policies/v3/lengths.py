"""What v3 predicts from finished lengths: each group's finished lengths so far (:class:`GroupRank`), the history
of finished lengths (:class:`~pdsr_sdk.policies.length_history.LengthHistory`), a sample's expected length and
what a running one has still to come, and the thresholds past which a running sample counts as the tail (moved
once by :mod:`.migration`) or as a runaway (:mod:`.lane`)."""

from __future__ import annotations

import math
from typing import Callable

from pdsr_sdk.dispatch.protocols import DispatchContext
from pdsr_sdk.dispatch.types import DROPPED, Sample
from pdsr_sdk.policies.length_history import LengthHistory
from pdsr_sdk.policies.v3.rule import BaseRule
from pdsr_sdk.policies.v3.settings import V3Settings


class GroupRank:
    __slots__ = ("longest", "total", "count", "stamp", "size")

    def __init__(self, size: int) -> None:
        self.longest = -1      # longest finished sample (-1: none finished: ranks as long)
        self.total = 0
        self.count = 0         # finishes seen (a restarted sample may count twice)
        self.stamp = 0
        self.size = size       # samples unfinished when the group arrived: it cannot be done before count reaches this


class Lengths(BaseRule):
    """The lengths rule: adds each finished length to the history and, every 64 finishes, sets the thresholds
    again (the lane's only while the ranking is on, or the history full: ``informative``)."""

    def __init__(self, config: V3Settings, ctx: DispatchContext, informative: Callable[[], bool]) -> None:
        self.cfg = config
        self.ctx = ctx
        self.informative = informative
        self.history = LengthHistory(config.lengths.history)   # finished lengths (sorted every 64 finishes)
        self.ranks: dict[int, GroupRank] = {}           # per unfinished group (by id), its finished lengths
        self.tail_threshold = math.inf
        self.lane_threshold = math.inf

    def add_group(self, size: int, key: int) -> None:
        self.ranks[key] = GroupRank(size)

    def on_sample_finished(self, sample: Sample) -> None:
        """(After the lane has judged the finish: it reads the threshold the sample ran under.)"""
        if sample.finish_reason == DROPPED:
            return   # cut short with its group (dynamic sampling): not a finished length
        self.history.add(sample.num_generated)
        if self.history.seen % 64 == 0:   # (by count: the history stops growing once full)
            self.update_thresholds()

    def prior(self) -> float:
        """Mean finished length of the history (0 before anything finished)."""
        return self.history.mean()

    def expected(self, s: Sample) -> float:
        """Predicted response length: its group's mean finished length, else the prior; never less than
        what it has produced, never more than the run's response cap (not the sample's own max_tokens: in a
        replay that is its recorded length, which capped v3's predictions at the truth)."""
        rank = self.ranks.get(id(s.group))
        est = rank.total / rank.count if rank is not None and rank.count else self.prior()
        return max(float(s.num_generated), min(est, float(self.ctx.sampling.max_tokens)))

    def residual(self, generated: int) -> float:
        """Expected tokens still to come for a sample that has produced ``generated`` (:meth:`LengthHistory.residual`,
        up to the run's response cap)."""
        return self.history.residual(generated, self.ctx.sampling.max_tokens)

    def update_thresholds(self) -> None:
        h = self.history
        h.refresh()
        migration = self.cfg.migration
        quantile = migration.stream_quantile if self.ctx.streaming else migration.quantile
        self.tail_threshold = min(h.quantile(quantile),
                                  h.cap_runner_threshold(self.ctx.sampling.max_tokens, migration.cap_runner_share))
        # the first finishes are the short ones, so an early quantile sends ordinary samples to the lane as
        # well: that spreads an informative stream's first steps (B=128: 0.436x against 0.455x when the lane
        # waits for a full history) but costs where lengths are noise, where v3 must be baseline
        self.lane_threshold = h.quantile(self.cfg.lane.quantile) if self.informative() or h.full else math.inf
