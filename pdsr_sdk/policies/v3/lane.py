"""v3's tail lane: in a stream under a staleness bound, heavy engines kept light for runaways.

The heavy pool (all of it while the stream leaves slots free, one engine when it fills every slot) becomes a
tail lane: runaways (past the 99.5th percentile of finished lengths, also after a restart) move there once, and a
lane engine holding one admits new work only up to ``lane.seqs`` (:mod:`.placement`). New work never stops in a
stream, so without the lane a runaway would run at full load for several steps (and be restarted when it grows too
stale); within one batch, or with no staleness bound, the lane costs more capacity than it saves. The lane stays
only while the runaways restarted so far ran away again (as in a length-controlled replay,
:class:`~pdsr_sdk.policies.runaway_recurrence.RunawayRecurrence`): a fresh RL sample rarely does, and then a
restart costs less than the lane's light engines. Until that is known, only restarted runaways go there, so
where the probe predicts, the lane opens only at the first runaway restarted for staleness: an empty lane held the
tail's moves (:mod:`.migration`) back, and on the KV-bound long-reasoning members a little over-provision ran
slower than none (docs/notes/partial-rollout.md). Where it predicts nothing, the stream is placed as baseline's and
the lane (no moves) stays from the start. With
the lane off, such a stream asks for segments of at least ``lane.segment_tokens``: a segment's end buys little
there and re-prefills the context's last partial block."""

from __future__ import annotations

import math

from pdsr_sdk.dispatch.protocols import DispatchContext, Engine
from pdsr_sdk.dispatch.types import HEAVY, Group, Sample
from pdsr_sdk.policies.runaway_recurrence import RunawayRecurrence, earlier_peak
from pdsr_sdk.policies.v3.ledger import Ledger
from pdsr_sdk.policies.v3.lengths import Lengths
from pdsr_sdk.policies.v3.rule import BaseRule
from pdsr_sdk.policies.v3.settings import V3Settings


class Lane(BaseRule):
    """Whether the heavy pool is a tail lane now (``on``), its engines, and the verdict on restarted runaways."""

    def __init__(self, config: V3Settings, ctx: DispatchContext, ledger: Ledger, lengths: Lengths) -> None:
        self.cfg = config
        self.ctx = ctx
        self.ledger = ledger
        self.lengths = lengths
        self.on = config.lane.mode == "always"
        #: 'auto': a runaway has been restarted for staleness (until then, where the probe predicts, no lane)
        self.opened = False
        self.names: set[str] = set()
        self.recurrence = RunawayRecurrence(config.lane.evidence, config.lane.recurrence)

    def on_batch(self, groups: list[Group]) -> None:
        self._set()

    def on_sample_finished(self, sample: Sample) -> None:
        self._observe_restarted(sample, finished=True)

    def on_segment_end(self, sample: Sample, engine: Engine) -> None:
        self._observe_restarted(sample, finished=False)

    def move(self, sample: Sample, engine: Engine) -> bool:
        """With the lane on, a restarted runaway (its tokens thrown away for staleness) goes back to the lane at
        once, once per generation; its restarted siblings are short and stay where they are. Until restarts are
        seen to repeat runaways (recurrence known) only restarted ones go: a first-generation runaway that outlives
        its window is restarted, where fresh responses make that cheap (also where the stream fills every slot:
        redraw B=512 0.638-0.656x against 0.649-0.669x moving from the start). With the lane on, no other rule
        moves samples."""
        if not self.on:
            return False
        threshold = self.lengths.lane_threshold
        if sample not in self.ledger.runaways and (sample.num_generated >= threshold or sample.restarts) \
                and _peak_generated(sample) >= threshold \
                and (sample.restarts or self.recurrence.known or self.cfg.lane.mode == "always"):
            if engine.name in self.names:
                self.ledger.hold_runaway(sample, engine.name)
            elif self.ledger.moved_at.get(sample) != sample.restarts:   # once per generation
                self._lane_move(sample, engine)
        return True

    def segment_floor(self) -> int:
        """In a stream under a staleness bound with the tail lane off, segments of at least
        ``lane.segment_tokens``: there a segment's end buys v3 little and costs a re-prefill of the context's
        last partial block. With the lane on, every end stays a chance to move a runaway there; without a bound
        the drain's moves need them."""
        if self.ctx.streaming and self.ctx.max_staleness is not None and not self.on:
            return self.cfg.lane.segment_tokens
        return 0

    def _observe_restarted(self, s: Sample, *, finished: bool) -> None:
        """Note whether a restarted runaway ran away again ('auto' lane: ``RunawayRecurrence``), and set the
        lane again when the verdict changes."""
        threshold = self.lengths.lane_threshold
        if not s.restarts or self.cfg.lane.mode != "auto" or math.isinf(threshold):
            return
        recurs, opened = self.recurrence.recurs, self.opened
        peak = earlier_peak([(x.start_token, x.num_tokens) for x in s.segments])
        self.opened = opened or peak >= threshold
        self.recurrence.observe(id(s), s.restarts, s.num_generated, peak, threshold, finished=finished)
        if self.recurrence.recurs != recurs or self.opened != opened:
            self._set()

    def _set(self) -> None:
        """'auto': a tail lane while groups stream in under a staleness bound (without one a slow tail just
        carries over, and the lane's capacity cost 1.6-2%), where the probe predicts only from the first runaway
        restarted for staleness (before it the lane has nothing to hold and migration moves the tail), unless the
        runaways restarted so far did not run away again (``lane.recurrence``: a restart then costs less than the
        lane); its engines: every heavy one while the stream leaves slots free, one when the stream fills every
        slot (``lane.engines``)."""
        if self.cfg.lane.mode == "auto":
            self.on = (self.ctx.streaming and self.ctx.max_staleness is not None and self.recurrence.recurs
                       and (self.opened or not self.lengths.informative()))
        heavy = sorted(e.name for e in self.ctx.pools().get(HEAVY, []))
        count = self.cfg.lane.engines or (len(heavy) if self.ledger.stream_has_room else 1)
        self.names = set(heavy[:count])

    def _lane_move(self, s: Sample, engine: Engine) -> None:
        """Move a runaway to the lane engine holding the fewest runaways (then the fewest samples); that
        engine then admits little new work (:mod:`.placement`), so the runaway runs light."""
        book = self.ledger
        lane = [e for e in self.ctx.pools().get(HEAVY, []) if e.name in book.tail_on and e.name in self.names]
        if not lane:
            return
        target = min(lane, key=lambda e: (book.runaways_on.get(e.name, 0), book.assigned[e.name]))
        if self.ctx.free_slots(target) <= 0:
            return
        book.move_to(s, target, self.lengths.expected(s))
        book.hold_runaway(s, target.name)


def _peak_generated(sample: Sample) -> int:
    """The most tokens the sample has held, counting generations it was restarted from."""
    return max((seg.start_token + seg.num_tokens for seg in sample.segments), default=0)
