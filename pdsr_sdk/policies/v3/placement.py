"""v3's placement and KV admission: where arriving work goes and when an engine takes more.

A batch whose KV cache binds (by the predicted demand of what can run at once) is dealt from the ranked pool
(:mod:`.ranking`), one sample at a time to the least loaded engine, while the predicted KV demand of what an
engine runs (prompt + the larger of what a sample has produced and its predicted length) leaves room for the new
sample's; an engine with nothing running always takes work. Otherwise, with a probe measured to predict
nothing, from a stream's start and in a stream without a staleness bound, it places work as baseline does: each
arrival's groups in contiguous chunks per engine (``placement.mode``), so that a group's samples share their prompt's
prefix cache on one engine; in a batch an engine with free slots and nothing queued then takes whole unstarted
groups from the end of another's chunk (``chunk_steal``), so that chunks stay work-conserving."""

from __future__ import annotations

import heapq
from collections import deque

from pdsr_sdk.dispatch.policy import contiguous_chunks
from pdsr_sdk.dispatch.protocols import DispatchContext, Engine
from pdsr_sdk.dispatch.types import Group, Sample
from pdsr_sdk.policies.v3.lane import Lane
from pdsr_sdk.policies.v3.ledger import Ledger
from pdsr_sdk.policies.v3.lengths import Lengths
from pdsr_sdk.policies.v3.ranking import Ranking
from pdsr_sdk.policies.v3.rule import BaseRule
from pdsr_sdk.policies.v3.settings import V3Settings


class Placement(BaseRule):
    """Places arriving groups (chunks or the ranked pool), fills engines as slots and KV allow, and keeps chunks
    work-conserving by stealing whole unstarted groups."""

    def __init__(self, config: V3Settings, ctx: DispatchContext, ledger: Ledger, lengths: Lengths,
                 ranking: Ranking, lane: Lane) -> None:
        self.cfg = config
        self.ctx = ctx
        self.kv_admission = config.on("kv_admission")
        self.probes_first = config.on("probes_first")
        self.chunk_steal = config.on("chunk_steal")
        self.balance = config.on("balance")
        self.ledger = ledger
        self.lengths = lengths
        self.ranking = ranking
        self.lane = lane
        self.filling = False
        self.chunks: dict[str, deque[Sample]] = {}   # per engine, samples placed there in chunks (chunk_steal)

    def on_batch(self, groups: list[Group]) -> None:
        mode = self.cfg.placement.mode
        if mode == "chunk" or (mode == "auto" and self._chunks(groups)):
            self._place_chunks(groups)
            return
        self.ranking.enqueue(groups)
        self._fill_all()

    def on_worker_idle(self, engine: Engine) -> None:
        if self.ledger.waiting and not self.filling:
            self._fill(engine)
        elif self.chunks:
            self._steal_groups(engine)

    def idle_interest(self) -> bool:
        return bool(self.ledger.waiting) or any(self.chunks.values())

    def _chunks(self, groups: list[Group]) -> bool:
        """'auto' placement: baseline's chunks while the probe is measured useless, from a stream's start, in a
        stream without a staleness bound (no lane there: dealing only spreads groups over engines), and for a batch
        whose KV cache does not bind (``_kv_fits``)."""
        if self.ctx.streaming:
            return not self.ranking.informative or self.ctx.max_staleness is None
        return (not self.ranking.informative and self.ranking.correlation is not None) or self._kv_fits(groups)

    def _kv_fits(self, groups: list[Group]) -> bool:
        """Whether the arriving batch's samples that can run at once (as many as there are free slots) fit the
        engines' KV caches by their predicted demand (always, before any length has been seen). Then baseline's
        chunks place it, kept work-conserving by ``chunk_steal``, and what v3 adds (moves, steals) is all that
        differs; it deals from its ranked pool, with KV-aware admission, only where the KV cache binds. Dealing
        lost where a batch queues for slots (informative family, 8 engines, B=512, ten draws: 0.981x baseline,
        worst 1.015, against 0.964x, worst 1.000, in chunks with steals; a draw dealt without moves 1.043x,
        chunked 1.000x), and where every sample starts at once it spread each prompt over every engine's prefix
        cache and lost up to 3-11% on some draws (docs/notes/v3.md)."""
        book = self.ledger
        samples = [s for g in groups for s in g.samples if not s.finished]
        prior = self.lengths.prior()
        if prior <= 0 or not samples:
            # nothing seen yet: a batch that starts at once goes as baseline's; one that queues is dealt, probes
            # first, so that its first finishes measure the probe and the lengths KV-aware admission needs
            return book.total_assigned + len(book.waiting) + len(samples) <= book.total_slots
        engines = [book.by_name[n] for n in book.assigned]
        cap = sum(getattr(e, "kv_cache_tokens", None) or 0 for e in engines)
        if not self.kv_admission or not cap:
            return True
        at_once = min(len(samples), max(0, book.total_slots - book.total_assigned - len(book.waiting)))
        each = sum(s.prompt_len + max(s.num_generated, prior) for s in samples) / len(samples)
        return sum(book.demand.values()) + at_once * each <= self.cfg.placement.kv_budget * cap

    def _place_chunks(self, groups: list[Group]) -> None:
        """Baseline's placement of the arriving groups (``placement.mode``), with v3's bookkeeping."""
        engines = sorted((e for es in self.ctx.pools().values() for e in es), key=lambda e: e.name)
        samples = [s for g in groups for s in g.samples if not s.finished]
        for g in groups:
            self.lengths.add_group(sum(1 for s in g.samples if not s.finished), id(g))
            if self.probes_first and not g.samples[0].finished:
                g.samples[0].is_probe = True   # its length still measures the probe's correlation
        # steals keep a batch's chunks work-conserving; not a stream's (there the engines that hold carried work
        # should stay slower, so that the others complete their groups first), nor where the probe is measured to
        # predict nothing (there v3 is baseline, plus its moves)
        steal = self.chunk_steal and not self.ctx.streaming and (
            self.ranking.informative or self.ranking.correlation is None)
        for s, e in contiguous_chunks(samples, engines):
            self.ledger.place(s, e, self.lengths.expected(s))
            self.ctx.submit(s, engine=e)
            if steal:
                self.chunks.setdefault(e.name, deque()).append(s)

    def _take(self, e: Engine, balance: bool = True) -> bool:
        """Give ``e`` the top-ranked waiting sample (:meth:`Ranking.pick`) if it has a slot and KV room; True if it
        did. Within a batch whose probe predicts, the rank is strict (there a hard group's long samples are better
        spread: 8 engines, B=128, seeds 12-14, four batches, 0.987 / 0.994 / 1.019 of baseline spread, 0.991 /
        0.989 / 1.025 kept together; KV-bound 0.941 / 0.969 against 0.948 / 0.981)."""
        book = self.ledger
        if book.slots(e) <= 0 or self.ctx.free_slots(e) <= 0:
            return False
        if self.lane.on and book.runaways_on.get(e.name) and book.assigned[e.name] >= self.cfg.lane.seqs:
            return False    # a lane engine holding a runaway stays light
        picked = self.ranking.pick(e)
        if picked is None:
            return False
        s, top, local = picked
        length = self.lengths.expected(s)
        if not book.fits(e, s.prompt_len + length):
            return False
        if (balance and self.balance and book.assigned[e.name]
                and book.remaining[e.name] + length > book.fair_share(e, self.lengths.prior())):
            return False
        self.ranking.take(s, top, e, local)
        book.place(s, e, length)
        self.ctx.submit(s, engine=e)
        return True

    def _fill(self, engine: Engine) -> None:
        self.filling = True
        try:
            while self.ledger.waiting and self._take(engine):
                pass
        finally:
            self.filling = False

    def _fill_all(self) -> None:
        """A batch arrived: spread its ranked work over all engines, one sample at a time to the least loaded
        one, as far as slots and KV allow (no share limit: what fits now starts now)."""
        self.filling = True
        assigned = self.ledger.assigned
        try:
            engines = [e for es in self.ctx.pools().values() for e in es]
            order = {e.name: i for i, e in enumerate(sorted(engines, key=lambda e: e.name))}
            heap = [(assigned[e.name] / e.max_concurrency, order[e.name], e) for e in engines]
            heapq.heapify(heap)
            while heap and self.ledger.waiting:
                _, i, e = heapq.heappop(heap)
                if self._take(e, balance=False):
                    heapq.heappush(heap, (assigned[e.name] / e.max_concurrency, i, e))
        finally:
            self.filling = False

    def _steal_groups(self, engine: Engine) -> None:
        """``engine`` has free slots and nothing queued (``chunk_steal``): it takes whole unstarted groups from
        the end of the chunk of the engine with the most unstarted samples, up to half of them, so that chunks
        stay work-conserving and each group keeps its prompt's prefix cache on one engine."""
        engine_of = self.ledger.engine_of
        donor, most = None, 0
        for name, q in list(self.chunks.items()):
            while q and (q[0].segments or q[0].finished or engine_of.get(q[0]) != name):
                q.popleft()     # started (chunks start in order), finished or moved away
            if not q:
                del self.chunks[name]
            elif name != engine.name and len(q) > most:
                donor, most = name, len(q)
        if donor is None:
            return
        q = self.chunks[donor]
        want = min(self.ctx.free_slots(engine), (most + 1) // 2)
        taken = 0
        while q and taken < want:
            g = q[-1].group
            if any(x.segments for x in g.samples):
                break           # the last group has started: its prompt is cached where it runs
            while q and q[-1].group is g:
                s = q.pop()
                if not s.finished and engine_of.get(s) == donor and self.ctx.reroute(s, engine):
                    self.ledger.rebook(s, engine, self.ledger.predicted[s][0])
                    self.chunks.setdefault(engine.name, deque()).append(s)   # unstarted there too, until it runs
                    taken += 1
