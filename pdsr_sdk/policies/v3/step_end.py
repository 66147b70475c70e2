"""v3 at a step's end (partial rollout): which samples of carried groups to generate again under the new weights.

In a stream under a staleness bound that fills every slot, unless restarted runaways are seen to run away again,
a step's start restarts the running samples of groups in their last step (their oldest tokens would be too stale
at the next) that are unlikely to end within it (``early_restart``,
:class:`~pdsr_sdk.policies.finish_odds.FinishOdds`): restarted at that step's end instead, they would take their
finished siblings' tokens with them. With ``step_end.refresh_ratio`` set, finished samples of carried groups that
took little engine time against their running siblings are regenerated too (each once)."""

from __future__ import annotations

from pdsr_sdk.dispatch.protocols import DispatchContext
from pdsr_sdk.dispatch.types import Group, Sample, oldest_version
from pdsr_sdk.policies.finish_odds import FinishOdds
from pdsr_sdk.policies.v3.lane import Lane
from pdsr_sdk.policies.v3.ledger import Ledger
from pdsr_sdk.policies.v3.rule import BaseRule
from pdsr_sdk.policies.v3.settings import V3Settings

_RATE_QUANTILE = 0.9     # of what the samples running across a whole step made: a step's tokens at full speed
_ODDS_STEPS = 4          # steps of finished and restarted lengths the early-restart odds read (at B=512 one step
#                          finishes ~4,000 samples and the history's 2,048 hold only a few of the long ones)


class StepEnd(BaseRule):
    """Early restarts (with the finish odds they read) and refreshes."""

    def __init__(self, config: V3Settings, ctx: DispatchContext, ledger: Ledger, lane: Lane) -> None:
        self.cfg = config
        self.ctx = ctx
        self.early_restart = config.on("early_restart")
        self.ledger = ledger
        self.lane = lane
        self.refreshed: set[Sample] = set()          # samples regenerated at a step's end (each once)
        self.odds = FinishOdds(_ODDS_STEPS, _RATE_QUANTILE)   # can a running sample end within a step
        self.finished_in_step: list[int] = []        # lengths finished since the last step end (early_restart)

    def on_sample_finished(self, sample: Sample) -> None:
        if self._tracks_odds():
            self.finished_in_step.append(sample.num_generated)

    def on_step_end(self, carried: list[Group]) -> list[Sample]:
        """The samples of carried groups worth generating again under the new weights: running ones unlikely to
        end within their group's last step (``early_restart``), and finished ones (``step_end.refresh_ratio``).
        Lengths are compared as time on an engine (a simulated engine reports a running segment's tokens only when
        it ends; a stopped one's pause is no work)."""
        out = self._early_restarts(carried)
        ratio = self.cfg.step_end.refresh_ratio
        if ratio is None:
            return out
        # only carried groups' samples are looked at: those of groups consumed since go (kept, they would pile up
        # over a long run, each holding its tokens)
        self.refreshed.intersection_update(s for g in carried for s in g.samples)
        now = self.ctx.clock.now()
        for g in carried:
            running = [_engine_time(s, now) for s in g.samples if not s.finished]
            if not running:
                continue   # complete, waiting to be consumed: regenerating would only delay it
            bound = ratio * max(running)
            for s in g.samples:
                if s.finished and _engine_time(s, now) <= bound and s not in self.refreshed:
                    self.refreshed.add(s)
                    out.append(s)
        return out

    def _early_restarts(self, carried: list[Group]) -> list[Sample]:
        """Running samples of groups in their last step under the staleness bound (their oldest tokens would be
        too stale at the next) whose chance to end within a step's tokens (:class:`FinishOdds`) is below
        ``step_end.restart_chance``: restarted now, they spare their finished siblings. Not in a group whose finished
        siblings ran longer than a step's tokens (the fresh draw would likely not end in time either). Only where
        the stream fills every slot (there thrown-away tokens are time; with free slots a runaway runs faster, and
        holding a step for its fresh draw cost more), and not once restarted runaways are seen to run away again (a
        replay). Before that verdict they may: a stream's first groups reach their last step before any restart
        was seen, and waiting restarted them whole a step later, siblings and all."""
        if not self._tracks_odds():
            return []
        bound = self.ctx.max_staleness
        odds = self.odds
        odds.step_end(((s, s.restarts, s.num_generated, s.finished, s.wasted_tokens)
                       for g in carried for s in g.samples), self.finished_in_step)
        self.finished_in_step = []
        recurrence = self.lane.recurrence
        if self.ledger.stream_has_room or odds.rate is None or (recurrence.known and recurrence.recurs):
            return []
        version = self.ctx.policy_version
        out = []
        for g in carried:
            oldest = min((v for v in map(oldest_version, g.samples) if v is not None), default=None)
            if oldest is None or version - oldest != bound:
                continue
            if max((s.num_generated for s in g.samples if s.finished), default=0) > odds.rate:
                # a prompt of long answers: the fresh draw may not end within the step either, and its finished
                # siblings would then be restarted a step later with one step less before the group is due
                continue
            out.extend(s for s in g.samples if not s.finished and s.num_generated
                       and odds.chance(s.num_generated, odds.rate) < self.cfg.step_end.restart_chance)
        return out

    def _tracks_odds(self) -> bool:
        """Whether early restarts may happen here (a stream under a staleness bound, ``early_restart`` on), so
        that the finish odds are kept."""
        return self.early_restart and self.ctx.max_staleness is not None


def _engine_time(sample: Sample, now: float) -> float:
    """Seconds the sample has spent running on engines (a running segment counts up to ``now``)."""
    return sum((now if seg.end_time_s is None else seg.end_time_s) - seg.submit_time_s for seg in sample.segments)
