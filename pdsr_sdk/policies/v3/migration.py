"""v3's migration: the tail, moved to lightly loaded engines.

At a segment boundary a running sample that has already run long (past the 90th percentile of finished lengths in
a batch, the 97th in a stream, or past the length beyond which most samples ran to the response cap:
:class:`~.lengths.Lengths`) joins the tail.
Once nothing waits, a tail sample moves to the engine running the fewest tail samples (then the fewest
samples), when that engine runs clearly fewer than its own, its KV cache keeps some room free with the moved
context added (where the cache binds, a move into a full one crowds out the target's own long samples), and the
prefill of the moved samples still arriving there costs at most a share of what the move saves (each re-prefills
its context on the target; the prices are learnt from the engines' timings,
:class:`~pdsr_sdk.policies.move_prices.MovePrices`). It moves again, on the same terms, where a lighter engine
opens later, as its first target fills while others drain (B = 128, ten draws: `kv-bound` 0.894x of baseline
against 0.938x with one move, `longcot` 0.815x against 0.833x; elsewhere within 0.3%). With the tail lane on
(:mod:`.lane`) the lane moves instead. A multi-turn sample (an agent's) is not moved: on the multi-turn member its
moves cost up to 0.8% at B = 128 (8 engines, five seeds) and gained nothing where slots bind
(docs/notes/multi-turn.md)."""

from __future__ import annotations


from pdsr_sdk.dispatch.protocols import DispatchContext, Engine
from pdsr_sdk.dispatch.types import Sample
from pdsr_sdk.policies.move_prices import MovePrices
from pdsr_sdk.policies.v3.ledger import Ledger
from pdsr_sdk.policies.v3.lengths import Lengths
from pdsr_sdk.policies.v3.rule import BaseRule
from pdsr_sdk.policies.v3.settings import V3Settings

_MAX_TARGETS_TRIED = 8   # move targets ruled out (_takes) before a move is given up


class Migration(BaseRule):
    """Marks the tail, moves tail samples, and prices the moves (the moved samples still arriving)."""

    def __init__(self, config: V3Settings, ctx: DispatchContext, ledger: Ledger, lengths: Lengths) -> None:
        self.cfg = config
        self.ctx = ctx
        self.enabled = config.on("migration")
        self.ledger = ledger
        self.lengths = lengths
        self.arriving: dict[Sample, tuple[str, int]] = {}   # moved samples before their first segment on the
        #                                                     target ends -> (target, context tokens to prefill)
        self.arriving_on: dict[str, int] = {}        # such samples per target engine
        self.arriving_ctx: dict[str, int] = {}       # their context tokens per target engine
        self.prices = MovePrices()                   # a decode step's and a prefill token's seconds, as measured

    def on_sample_finished(self, sample: Sample) -> None:
        self._arrived(sample)

    def on_segment_end(self, sample: Sample, engine: Engine) -> None:
        self._arrived(sample)
        if sample not in self.ledger.tail and sample.num_generated >= self.lengths.tail_threshold:
            self.ledger.mark_tail(sample, engine.name, +1)

    def move(self, sample: Sample, engine: Engine) -> bool:
        if sample.turns is not None:
            return True   # a multi-turn sample is not moved: it did not pay (docs/notes/multi-turn.md)
        if self.enabled and not self.ledger.waiting and sample in self.ledger.tail:
            self._maybe_move(sample, engine)
        return True

    def on_engine_lost(self, engine: Engine, requeued: list[Sample]) -> None:
        self.arriving_on.pop(engine.name, None)
        self.arriving_ctx.pop(engine.name, None)

    def _arrived(self, s: Sample) -> None:
        """``s`` ended a segment (or finished): a move that brought it has been paid for on its target. Its span
        also tells the prices of the next moves."""
        segs = s.segments
        arrival = self.arriving.pop(s, None)
        if segs:
            self.prices.observe(segs[-2] if len(segs) > 1 else None, segs[-1], s.prompt_len + segs[-1].start_token,
                                moved_here=arrival is not None and arrival[0] == segs[-1].engine)
        if arrival is not None and arrival[0] in self.arriving_on:
            self.arriving_on[arrival[0]] -= 1
            self.arriving_ctx[arrival[0]] -= arrival[1]

    def _maybe_move(self, s: Sample, engine: Engine) -> None:
        """Move a tail sample to the engine with the fewest tail samples (then the fewest samples),
        when that engine is clearly less crowded than its own: fewer tail samples by two and fewer samples,
        or clearly fewer samples, and the prefill of the moves still arriving there stays within
        ``migration.stall_share`` of what the move saves. (A move costs a prefill of the whole context on the
        target; moving between engines that differ only in their tail counts cost 1-2% on cold batches, whose
        early tail threshold is low.)"""
        book = self.ledger
        context = s.prompt_len + s.num_generated
        target = self._open_target(s, engine, context)
        if target is None or target is engine:
            return
        name, to = engine.name, target.name
        tail_on, assigned = book.tail_on, book.assigned
        fewer_tails = tail_on[to] + 1 < tail_on[name] and assigned[to] < assigned[name]
        fewer_samples = (tail_on[to] <= tail_on[name] - 1
                         and assigned[name] - assigned[to] >= self.cfg.migration.min_gap
                         and assigned[to] <= self.cfg.migration.min_ratio * assigned[name])
        if not (fewer_tails or fewer_samples):
            return
        length = self.lengths.expected(s)
        if book.slots(target) <= 0 or self.ctx.free_slots(target) <= 0:
            return
        book.move_to(s, target, length)
        self.arriving[s] = (to, context)
        self.arriving_on[to] = self.arriving_on.get(to, 0) + 1
        self.arriving_ctx[to] = self.arriving_ctx.get(to, 0) + context

    def _open_target(self, s: Sample, source: Engine, context: int) -> Engine | None:
        """The best move target (:meth:`Ledger.best_target`) among those whose KV cache has room for this one's
        ``context`` tokens (``migration.kv_headroom``) and where the prefill of the moves still arriving, and of this
        one, pays (``migration.stall_share``); the next best are tried while the best are ruled out (with many
        engines one target was full and moves waited)."""
        remaining = self.lengths.residual(s.num_generated)
        return self.ledger.best_target(
            lambda target: target is not source and not (self._fits(target, context)
                                                         and self._takes(target.name, source.name, context, remaining)),
            tries=_MAX_TARGETS_TRIED)

    def _fits(self, target: Engine, context: int) -> bool:
        """Whether ``target``'s KV cache, as it reports it, keeps ``migration.kv_headroom`` free with the moved
        ``context`` added (an engine that reports no KV cache always fits)."""
        usage, tokens = target.load().kv_cache_usage, target.kv_cache_tokens
        return usage is None or not tokens or usage + context / tokens <= 1.0 - self.cfg.migration.kv_headroom

    def _takes(self, name: str, source: str, context: int, remaining: float) -> bool:
        """Whether engine ``name`` takes a moved sample of ``context`` tokens that has ``remaining`` still to come."""
        if not self.arriving_on.get(name, 0):
            return True
        return bool(self.prices.stall_pays(source, name, self.arriving_ctx.get(name, 0) + context, remaining,
                                           self.cfg.migration.stall_share))
