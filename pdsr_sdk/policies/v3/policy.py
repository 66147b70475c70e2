"""``v3`` (the default): every engine busy from the start, longest-ranked work first, the tail moved out.

What the measurements taught (docs/notes/v3.md): waiting for probes costs more than routing saves, and on equal
engines a group's probe says little about which single samples will be the longest. So v3 never waits on a
barrier and takes only what the probes and the running samples can tell. It is a coordinator that hands each
:class:`~pdsr_sdk.dispatch.protocols.Dispatcher` hook to its rules (:class:`~.rule.Rule`) in a fixed order,
after booking what the hook changed in the shared :class:`~.ledger.Ledger`:

- :mod:`.lengths`: finished lengths, each sample's expected length, the tail and lane thresholds;
- :mod:`.ranking`: the ranked pool of waiting samples (probes first, longest group first once the probe is
  seen to predict), and locality (an engine's own groups' siblings first where its KV cache does not bind);
- :mod:`.placement`: chunks or the ranked pool for arriving groups, chunk steals, the share limit on refills;
- :mod:`.migration`: the tail, moved to lightly loaded engines (again when a lighter one opens) where the move pays;
- :mod:`.lane`: in a stream under a staleness bound, the heavy pool as a tail lane for runaways;
- :mod:`.step_end`: at a step's end, early restarts of runaways in their last step, and refreshes;
- :mod:`.turns`: multi-turn samples: a parked sample's room goes to others, its next turn goes back to the engine
  holding its prefix.

Its settings (a section per rule and one ``disable`` list, each with the reason for its default) are in
:mod:`.settings`.
"""

from __future__ import annotations

import math
from typing import Any

from pdsr_sdk.dispatch.policy import Policy
from pdsr_sdk.dispatch.protocols import DispatchContext, Engine
from pdsr_sdk.dispatch.types import Group, Sample
from pdsr_sdk.policies.finish_odds import FinishOdds
from pdsr_sdk.policies.runaway_recurrence import RunawayRecurrence
from pdsr_sdk.policies.v3.lane import Lane
from pdsr_sdk.policies.v3.ledger import Ledger
from pdsr_sdk.policies.v3.lengths import Lengths
from pdsr_sdk.policies.v3.migration import Migration
from pdsr_sdk.policies.v3.placement import Placement
from pdsr_sdk.policies.v3.ranking import Ranking
from pdsr_sdk.policies.v3.rule import Rule
from pdsr_sdk.policies.v3.step_end import StepEnd
from pdsr_sdk.policies.v3.turns import Turns
from pdsr_sdk.policies.v3.settings import V3Settings


class V3Policy(Policy):
    """Seer-style ranked pool, chunks where they keep prefixes, early moves for the tail."""

    name = "v3"
    streaming = True
    config_model = V3Settings

    def __init__(self, config: V3Settings, ctx: DispatchContext):
        super().__init__(config, ctx)
        self.ledger = Ledger(config, ctx)
        self.lengths = Lengths(config, ctx, lambda: self.ranking.informative)
        self.ranking = Ranking(config, ctx, self.ledger, self.lengths, self.rank_key)
        self.lane = Lane(config, ctx, self.ledger, self.lengths)
        self.migration = Migration(config, ctx, self.ledger, self.lengths)
        self.step_end = StepEnd(config, ctx, self.ledger, self.lane)
        self.placement = Placement(config, ctx, self.ledger, self.lengths, self.ranking, self.lane)
        self.turns = Turns(self.ledger, self.lengths)
        # the rules each hook goes to, in this order. A finish: the lane judges a restarted runaway by the
        # threshold it ran under, before the lengths set new thresholds, before the ranking (which may switch
        # itself on and so change the lane's threshold). A segment end: every rule notes it (the tail is marked
        # before the lane moves a runaway), then the movers are asked in turn: the lane, while on, is the only one.
        self.batch_rules: tuple[Rule, ...] = (self.lane, self.placement)
        self.finish_rules: tuple[Rule, ...] = (self.migration, self.step_end, self.lane, self.lengths, self.ranking)
        self.segment_rules: tuple[Rule, ...] = (self.migration, self.lane)
        self.movers: tuple[Rule, ...] = (self.lane, self.migration)
        self.step_end_rules: tuple[Rule, ...] = (self.step_end,)
        self.lost_rules: tuple[Rule, ...] = (self.migration,)

    # ------------------------------------------------------------------ hooks
    def on_batch(self, groups: list[Group]) -> None:
        self.ledger.arrive([e for es in self.ctx.pools().values() for e in es], groups)
        for rule in self.batch_rules:
            rule.on_batch(groups)

    def on_sample_finished(self, sample: Sample) -> None:
        self.ledger.finished(sample)
        for rule in self.finish_rules:
            rule.on_sample_finished(sample)

    def on_segment_end(self, sample: Sample, engine: Engine) -> None:
        self.ledger.repredict(sample, self.lengths.expected)
        for rule in self.segment_rules:
            rule.on_segment_end(sample, engine)
        for mover in self.movers:
            if mover.move(sample, engine):
                break

    def on_step_end(self, carried: list[Group]) -> list[Sample]:
        """Partial rollout, a step ended: the samples of carried groups worth generating again under the new
        weights (:mod:`.step_end`)."""
        out: list[Sample] = []
        for rule in self.step_end_rules:
            out.extend(rule.on_step_end(carried))
        return out

    def on_worker_idle(self, engine: Engine) -> None:
        self.placement.on_worker_idle(engine)

    def on_turn_parked(self, sample: Sample, engine: Engine) -> None:
        self.turns.parked(sample)

    def on_next_turn(self, sample: Sample, engine: Engine) -> None:
        self.turns.next_turn(sample, engine)

    def idle_interest(self, pool: str) -> bool:
        return self.placement.idle_interest()

    def segment_floor(self, sample: Sample, engine: Engine) -> int:
        return self.lane.segment_floor()

    def on_engine_lost(self, engine: Engine, requeued: list[Sample]) -> None:
        self.ledger.lose(engine, requeued)
        for rule in self.lost_rules:
            rule.on_engine_lost(engine, requeued)

    def batch_report(self) -> dict[str, Any]:
        """What v3 learnt so far: whether it ranks, the probe's measured correlation, the tail threshold,
        whether the heavy pool is a tail lane (and which engines serve as it; how many restarted runaways
        finished, and how many of them ran away again), the prefill price its moves are limited by."""
        price = self.migration.prices.prefill_s_per_token
        lane, ranking, threshold = self.lane, self.ranking, self.lengths.tail_threshold
        return {"ranking": ranking.informative, "tail_lane": lane.on,
                "lane_engines": sorted(lane.names) if lane.on else [],
                "restarted_runaways": lane.recurrence.outcomes, "recurred": lane.recurrence.recurred,
                "probe_correlation": None if ranking.correlation is None else round(ranking.correlation, 4),
                "tail_threshold": None if math.isinf(threshold) else int(threshold),
                "prefill_s_per_token": None if price is None else float(f"{price:.3g}")}

    # ------------------------------------------------------- for references
    def rank_key(self, s: Sample) -> tuple[int, float]:
        """Where a waiting sample stands in the ranked pool, smallest first (ties in queue order): (tier, key).
        Called each time the sample is queued or its group's rank changes. A simulator-only reference may
        override it with what the trace knows (``bench/stream_oracle.py``)."""
        return self.ranking.default_key(s)

    @property
    def recurrence(self) -> RunawayRecurrence:
        """Whether restarted runaways run away again (:mod:`.lane`)."""
        return self.lane.recurrence

    @property
    def runaways(self) -> dict[Sample, str]:
        """Samples held as runaways -> the lane engine holding them (:class:`~.ledger.Ledger`)."""
        return self.ledger.runaways

    @property
    def runaways_on(self) -> dict[str, int]:
        """Runaways held per lane engine (:class:`~.ledger.Ledger`)."""
        return self.ledger.runaways_on

    @property
    def odds(self) -> FinishOdds:
        """Whether a running sample can end within a step (:mod:`.step_end`)."""
        return self.step_end.odds
