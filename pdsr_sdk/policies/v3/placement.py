"""v3's placement: where arriving work goes.

In a stream under a staleness bound whose probe is measured to predict, arriving groups are dealt from the ranked
pool (:mod:`.ranking`), one sample at a time to the least loaded engine as slots allow; so is a cold batch that
queues for slots (no length seen yet), probes first, so that its first finishes measure the probe. While the pool
is in queue order (the rank off), an engine that refills from it takes no more than its share by slots of the
predicted remaining work (``balance``).
Otherwise work is placed as baseline places it: each arrival's groups in contiguous chunks per engine
(``placement.mode``), so that a group's samples share their prompt's prefix cache on one engine; in a batch an
engine with free slots and nothing queued then takes whole unstarted groups from the end of another's chunk
(``chunk_steal``), so that chunks stay work-conserving. (KV-aware admission, which dealt a batch whose KV cache
bound and held each engine to a predicted KV budget, was removed: docs/notes/v3-rules.md.)"""

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
    """Places arriving groups (chunks or the ranked pool), fills engines as slots allow, and keeps chunks
    work-conserving by stealing whole unstarted groups."""

    def __init__(self, config: V3Settings, ctx: DispatchContext, ledger: Ledger, lengths: Lengths,
                 ranking: Ranking, lane: Lane) -> None:
        self.cfg = config
        self.ctx = ctx
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
        held = self.cfg.placement.heavy_max_seqs is not None   # only dealing holds an engine under its limit
        if mode == "chunk" or (mode == "auto" and not held and self._chunks(groups)):
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
        (but a cold one that queues: :meth:`_chunked_batch`)."""
        if self.ctx.streaming:
            return not self.ranking.informative or self.ctx.max_staleness is None
        return (not self.ranking.informative and self.ranking.correlation is not None) or self._chunked_batch(groups)

    def _chunked_batch(self, groups: list[Group]) -> bool:
        """Whether a batch goes in baseline's chunks (kept work-conserving by ``chunk_steal``, v3's moves all that
        differs): every batch once a length has been seen, and a cold one that starts at once. A cold batch that
        queues is dealt, probes first, so that its first finishes measure the probe. Dealing lost where a batch
        queues for slots once lengths were known (informative family, 8 engines, B=512, ten draws: 0.981x
        baseline, worst 1.015, against 0.964x, worst 1.000, in chunks with steals), and where every sample starts
        at once it spread each prompt over every engine's prefix cache and lost up to 3-11% on some draws
        (docs/notes/v3.md)."""
        book = self.ledger
        samples = sum(1 for g in groups for s in g.samples if not s.finished)
        if self.lengths.prior() > 0 or not samples:
            return True
        return book.total_assigned + len(book.waiting) + samples <= book.total_slots

    def _place_chunks(self, groups: list[Group]) -> None:
        """Baseline's placement of the arriving groups (``placement.mode``), with v3's bookkeeping."""
        engines = sorted((e for es in self.ctx.pools().values() for e in es), key=lambda e: e.name)
        samples = [s for g in groups for s in g.samples if not s.finished]
        probes = 0
        for g in groups:
            self.lengths.add_group(sum(1 for s in g.samples if not s.finished), id(g))
            if self.probes_first and not g.samples[0].finished:
                g.samples[0].is_probe = True   # its length still measures the probe's correlation
                probes += 1
        if probes:   # counted as the ranked pool counts its probes: the summary agrees with the rows' is_probe
            self.ctx.count("probes", probes)
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
        """Give ``e`` the top-ranked waiting sample (:meth:`Ranking.pick`) if it has a slot; True if it
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
        # (only in queue order: under the rank, holding an engine back delays the longest waiting work, and the
        # limit cost 0.2-1.0% on the members whose rank turns on: docs/notes/v3-rules.md)
        if (balance and self.balance and not self.ranking.informative and book.assigned[e.name]
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
        one, as far as slots allow (no share limit: what fits now starts now)."""
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
