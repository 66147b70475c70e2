"""v3's ranked pool: which waiting sample runs next.

Probes (sample 0 of each group) go first; a group with no finished sample ranks as long; each finished sample
re-ranks its group's waiting samples (a group's rank is its longest finished sample, as in Seer). Under
``rank: auto`` it ranks only once whole groups have shown that the probe predicts its siblings
(:class:`~pdsr_sdk.policies.probe_correlation.ProbeCorrelation`); before that, and where it predicts nothing, the
pool is in queue order. In a stream, or while the rank is off, an engine takes its own groups' waiting siblings
first (``locality``: they find their prompt in its prefix cache), unless its KV cache binds: where it holds fewer
than half of the engine's slots at the mean context, a group's siblings, long together, crowd the cache of the
engine that holds them (`kv-bound` in a stream: 2.1% slower with locality, 0.4-0.9% in a batch; where the cache
does not bind it gains up to 3%)."""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Callable

from pdsr_sdk.dispatch.protocols import DispatchContext, Engine
from pdsr_sdk.dispatch.types import Group, Sample
from pdsr_sdk.policies.probe_correlation import ProbeCorrelation
from pdsr_sdk.policies.v3.ledger import Ledger
from pdsr_sdk.policies.v3.lengths import Lengths
from pdsr_sdk.policies.v3.rule import BaseRule
from pdsr_sdk.policies.v3.settings import V3Settings

#: locality steps aside on an engine whose slots at the mean context (prompt + the prior length) need more than this
#: many times its KV cache; the family's members sit at 0.5-1.1 (where it gains) or 3.3-4.0 (where it cost)
LOCALITY_MAX_KV_DEMAND = 2.0


class Ranking(BaseRule):
    """The ranked pool of waiting samples (a lazy heap), the probe's measured correlation, and the groups placed
    per engine whose siblings go first."""

    def __init__(self, config: V3Settings, ctx: DispatchContext, ledger: Ledger, lengths: Lengths,
                 key: Callable[[Sample], tuple[int, float]]) -> None:
        self.cfg = config
        self.ctx = ctx
        self.probes_first = config.on("probes_first")
        self.locality = config.on("locality")
        self.ledger = ledger
        self.lengths = lengths
        self.key = key                               # the policy's rank_key (a reference may override it)
        self.heap: list[tuple] = []
        self.seq = itertools.count()
        self.pairs = ProbeCorrelation(config.ranking.correlation_window)
        self.correlation: float | None = None
        # 'auto' starts in queue order until measured: ranking by noise costs (docs/notes/v3.md)
        self.informative = config.ranking.mode == "always"
        self.placed: dict[str, dict[int, Group]] = {}  # per engine, groups placed there (their siblings go first)

    def enqueue(self, groups: list[Group]) -> None:
        """Queue every unfinished sample of ``groups`` in the ranked pool, probes marked."""
        for g in groups:
            self.lengths.add_group(sum(1 for s in g.samples if not s.finished), id(g))
            for s in g.samples:
                if s.finished:
                    continue
                if s.index == 0 and self.probes_first:
                    s.is_probe = True
                self.ledger.queue(s)
                self.push(s)
        if self.probes_first:
            self.ctx.count("probes", len(groups))

    def on_sample_finished(self, sample: Sample) -> None:
        n = sample.num_generated
        g = sample.group
        rank = self.lengths.ranks.get(id(g))
        if rank is None:
            return
        rank.total += n
        rank.count += 1
        if rank.count >= rank.size and g.done:   # the count first: Group.done walks the samples
            del self.lengths.ranks[id(g)]
            # whole groups only: pairs taken as samples finish would over-represent the short ones
            probe = g.samples[0]
            if probe.is_probe:
                for s in g.samples[1:]:
                    self.pairs.add(probe.num_generated, s.num_generated)
                self._decide()
            return
        if n > rank.longest:
            rank.longest = n
            rank.stamp += 1
            for s in g.samples:
                if s in self.ledger.waiting:
                    self.push(s)
        # the group's running samples take its new mean at their next segment end (segments are short:
        # re-predicting every sibling on every finish cost more than the rest of the policy at scale)

    def _decide(self) -> None:
        """After a group completes: rank only while its probe has been seen to predict its siblings."""
        if self.cfg.ranking.mode == "auto" and len(self.pairs) >= self.cfg.ranking.min_pairs:
            first = self.correlation is None
            self.correlation = self.pairs.value()
            informative = self.correlation >= self.cfg.ranking.min_correlation
            if informative != self.informative or (first and not informative):
                self.informative = informative
                if informative and not self.ctx.streaming:
                    self.placed.clear()     # a ranked batch takes no sibling first (pick)
                self.heap = []
                for w in sorted(self.ledger.waiting, key=lambda w: (w.group.batch_index, w.group.position, w.index)):
                    self.push(w)

    def push(self, s: Sample) -> None:
        rank = self.lengths.ranks[id(s.group)]
        tier, key = self.key(s)
        g = s.group
        heapq.heappush(self.heap, (tier, key, g.batch_index, g.position, s.index, rank.stamp, next(self.seq), s))

    def default_key(self, s: Sample) -> tuple[int, float]:
        """``V3Policy.rank_key``'s default: (tier, key), smallest first."""
        rank = self.lengths.ranks[id(s.group)]
        # probes jump the queue only while their lengths may be worth knowing: once the probe is measured
        # to predict nothing, queue order is baseline's (sample 0 still measures, from where it runs)
        tier = 0 if (s.is_probe and self.probes_first and (self.informative or self.correlation is None)) else 1
        # rank by the group's longest finished sample only while the groups' lengths have been seen to
        # predict their samples' (otherwise the order is noise and costs; queue order is baseline's)
        key = (-math.inf if rank.longest < 0 else -rank.longest) if self.informative else 0.0
        return tier, key

    def top(self) -> Sample | None:
        heap = self.heap
        ranks = self.lengths.ranks
        while heap:
            entry = heap[0]
            s = entry[-1]
            rank = ranks.get(id(s.group))
            if s in self.ledger.waiting and rank is not None and entry[5] == rank.stamp:
                return s
            heapq.heappop(heap)
        return None

    def pick(self, e: Engine) -> tuple[Sample, Sample, bool] | None:
        """What ``e`` would take next: (the sample, the pool's top, whether locality chose it), or None when
        nothing waits. In a stream, or while the rank is off, a waiting sibling of a group already on ``e``
        comes first once the probes are out."""
        top = self.top()
        if top is None:
            return None
        local = self.locality and (self.ctx.streaming or not self.informative) and not self._kv_binds(e, top)
        s = top
        if local and not top.is_probe:
            s = _waiting_sibling(self.placed.get(e.name), self.ledger.waiting) or top
        return s, top, local

    def _kv_binds(self, e: Engine, s: Sample) -> bool:
        """Whether ``e``'s slots, each at ``s``'s prompt and the length prior, need over ``LOCALITY_MAX_KV_DEMAND``
        times its KV cache (an engine that reports no cache never binds; nor does any before a sample finished)."""
        tokens = e.kv_cache_tokens
        return bool(tokens) and self.ledger.limit(e) * (s.prompt_len + self.lengths.prior()) > \
            LOCALITY_MAX_KV_DEMAND * tokens

    def take(self, s: Sample, top: Sample, e: Engine, local: bool) -> None:
        """``s`` (picked for ``e``) leaves the pool; called before it is placed."""
        if s is top:
            heapq.heappop(self.heap)
        self.ledger.dequeue(s)     # (a sibling taken before the top leaves its heap entry to top)
        if local:
            self.placed.setdefault(e.name, {})[id(s.group)] = s.group


def _waiting_sibling(groups: dict[int, Group] | None, waiting: set[Sample]) -> Sample | None:
    """A waiting sample of one of ``groups`` (groups with none left are dropped on the way)."""
    while groups:
        key, g = next(iter(groups.items()))
        for s in g.samples:
            if s in waiting:
                return s
        del groups[key]
    return None
