"""``v3`` (the default): every engine busy from the start, longest-ranked work first, KV-aware, tail moved once.

What the measurements taught (docs/notes/v3.md): waiting for probes costs more than routing
saves, and on equal engines a group's probe says little about which single samples will be the
longest. So v3 never waits on a barrier and takes only what the probes and the running samples can
tell:

- every sample is queued at once, in the policy's own ranked pool; probes (sample 0 of each group)
  go first;
- a group with no finished sample ranks as long; each finished sample re-ranks its group's waiting
  samples (a group's rank is its longest finished sample, as in Seer); a free slot takes the
  longest-ranked waiting sample;
- admission is KV-aware: an engine takes new work while the predicted KV demand of what it runs
  (prompt + the larger of what a sample has produced and its predicted length) leaves room for
  the new sample's; an engine with nothing running always takes work (the estimate never idles
  an engine);
- at a segment boundary, once nothing waits, a running sample that has already run long (past the
  97th percentile of finished lengths, or past the length beyond which most samples ran to the
  response cap) moves once to the engine running the fewest samples, when that engine runs clearly
  fewer than its own (the tail then runs on lightly loaded engines), unless that engine's furthest-along
  sample is expected to run longer than the moved one (it would be slowed, and it sets the target's
  end), and while the prefill of the moved samples still arriving there costs at most a share of what
  the move saves (each re-prefills its context on the target; the prices are learnt from the engines'
  timings); nothing moves twice;
- in a stream (groups arriving while others run: partial rollout across steps) under a
  staleness bound, the heavy pool (all of it while the stream leaves slots free, one engine
  when it fills every slot) becomes a tail lane: runaways (past the 99.5th percentile of finished
  lengths, also after a restart) move there once, and a lane engine holding one admits new work
  only up to ``lane_seqs``. New work never stops in a stream, so without the lane a runaway would
  run at full load for several steps (and be restarted when it grows too stale); within one
  batch, or with no staleness bound, the lane costs more capacity than it saves. The lane stays
  only while the runaways restarted so far ran away again (as in a length-controlled replay): a
  fresh RL sample rarely does, and then a restart costs less than the lane's light engines. Until
  that is known, only restarted runaways go there. With the lane off, such a stream asks for segments
  of at least ``stream_segment_tokens``: a segment's end buys little there and re-prefills the
  context's last partial block;
- in such a stream that fills every slot, unless restarted runaways are seen to run away again, a
  step's start restarts the running samples of groups in their last step (their oldest tokens would
  be too stale at the next) that are unlikely to end within it (``early_restart``,
  :mod:`.finish_odds`): restarted at that step's end instead, they would take their finished
  siblings' tokens with them.

With a probe measured to predict nothing it places work as baseline does: each arrival's groups in
contiguous chunks per engine (``placement``), so that a group's samples share their prompt's prefix
cache on one engine. So does a stream from its start, one without a staleness bound, and a batch
whose KV cache does not bind (by the predicted demand of what can run at once): there an engine with
free slots and nothing queued takes whole unstarted groups from the end of another's chunk
(``chunk_steal``), so that chunks stay work-conserving. A batch whose KV cache binds is dealt from the
ranked pool with KV-aware admission. Where it deals a stream, or an unranked batch, an engine takes
its own groups' siblings first (``locality``).

Its settings (one per rule, each with the reason for its default) are in :mod:`.v3_settings`; the
bookkeeping it reads, with no engines in it, in :mod:`.length_history` (finished lengths, thresholds,
expected remaining tokens), :mod:`.probe_correlation`, :mod:`.engine_leads`, :mod:`.move_prices` and
:mod:`.finish_odds`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque

from pdsr_sdk.dispatch.policy import Policy, contiguous_chunks
from pdsr_sdk.dispatch.protocols import Engine
from pdsr_sdk.dispatch.types import HEAVY, Group, Sample, oldest_version
from pdsr_sdk.policies.engine_leads import EngineLeads
from pdsr_sdk.policies.finish_odds import FinishOdds
from pdsr_sdk.policies.length_history import LengthHistory, unseen_residual
from pdsr_sdk.policies.move_prices import MovePrices
from pdsr_sdk.policies.probe_correlation import ProbeCorrelation
from pdsr_sdk.policies.runaway_recurrence import RunawayRecurrence, earlier_peak
from pdsr_sdk.policies.v3_settings import V3Settings


class _GroupRank:
    __slots__ = ("longest", "total", "count", "stamp", "size")

    def __init__(self, size: int) -> None:
        self.longest = -1      # longest finished sample (-1: none finished: ranks as long)
        self.total = 0
        self.count = 0         # finishes seen (a restarted sample may count twice)
        self.stamp = 0
        self.size = size       # samples unfinished when the group arrived: it cannot be done before count reaches this


class V3Policy(Policy):
    """Seer-style ranked pool, KV-aware admission, one early move for the tail."""

    name = "v3"
    streaming = True
    config_model = V3Settings

    def __init__(self, config: V3Settings, ctx):
        super().__init__(config, ctx)
        self.heap: list[tuple] = []
        self.ranks: dict[int, _GroupRank] = {}
        self.waiting: set[Sample] = set()
        self.engine_of: dict[Sample, str] = {}       # submitted (queued on or running on) engine
        self.demand: dict[str, float] = {}           # predicted final KV tokens per engine
        self.predicted: dict[Sample, tuple[float, int]] = {}   # placed sample -> (predicted length, generated then)
        self.assigned: dict[str, int] = {}           # samples placed on each engine and not finished
        self.history = LengthHistory(config.history)   # finished lengths (sorted every 64 finishes)
        self.lane = config.tail_lane == "always"
        self.stream_has_room = False
        self.tail_threshold = math.inf
        self.lane_threshold = math.inf
        self.lane_names: set[str] = set()
        self.runaways: dict[Sample, str] = {}        # samples past the lane threshold -> the lane engine holding them
        self.runaways_on: dict[str, int] = {}        # such samples per lane engine
        self.recurrence = RunawayRecurrence(config.lane_evidence, config.lane_recurrence)
        self.by_name: dict[str, Engine] = {}
        self.seq = itertools.count()
        self.filling = False
        self.total_assigned = 0
        self.total_slots = 0
        self.remaining: dict[str, float] = {}        # predicted tokens still to generate per engine
        self.pairs = ProbeCorrelation(config.correlation_window)
        self.correlation: float | None = None
        # 'auto' starts in queue order until measured: ranking by noise costs (docs/notes/v3.md)
        self.informative = config.rank == "always"
        self.tail: set[Sample] = set()               # running samples past the tail threshold (or moved)
        self.tail_on: dict[str, int] = {}            # tail samples per engine
        self.targets: list[tuple[int, int, str]] = []   # lazy heap of move targets
        self.targets_stale = True
        self.total_remaining = 0.0
        self.refreshed: set[Sample] = set()          # samples regenerated at a step's end (each once)
        self.odds = FinishOdds(_ODDS_STEPS, _RATE_QUANTILE)   # can a running sample end within a step
        self.finished_in_step: list[int] = []        # lengths finished since the last step end (early_restart)
        self.placed: dict[str, dict[int, Group]] = {}  # per engine, groups placed there (their siblings go first)
        self.arriving: dict[Sample, tuple[str, int]] = {}   # moved samples before their first segment on the
        #                                                     target ends -> (target, context tokens to prefill)
        self.arriving_on: dict[str, int] = {}        # such samples per target engine
        self.arriving_ctx: dict[str, int] = {}       # their context tokens per target engine
        self.prices = MovePrices()                   # a decode step's and a prefill token's seconds, as measured
        # per engine, its furthest-along sample's progress; kept only where the move guard reads it
        self.leads = EngineLeads(self.engine_of) if config.migrate and config.migrate_lead_guard else None
        self.chunks: dict[str, deque[Sample]] = {}   # per engine, samples placed there in chunks (chunk_steal)

    # ------------------------------------------------------------------ hooks
    def on_batch(self, groups: list[Group]) -> None:
        pools = self.ctx.pools()
        for engines in pools.values():
            for e in engines:
                self.by_name.setdefault(e.name, e)
                self.demand.setdefault(e.name, 0.0)
                self.assigned.setdefault(e.name, 0)
                self.remaining.setdefault(e.name, 0.0)
                if e.name not in self.tail_on:
                    self.tail_on[e.name] = 0
                    self._push_engine(e.name)
        self.total_slots = sum(self._limit(self.by_name[n]) for n in self.assigned)
        waiting_after = sum(1 for g in groups for s in g.samples if not s.finished) + len(self.waiting)
        self.stream_has_room = self.ctx.streaming and self.total_assigned + waiting_after <= self.total_slots
        self._set_lane()
        mode = self.cfg.placement
        if mode == "chunk" or (mode == "auto" and self._chunks(groups)):
            self._place_chunks(groups)
            return
        for g in groups:
            self.ranks[id(g)] = _GroupRank(sum(1 for s in g.samples if not s.finished))
            for s in g.samples:
                if s.finished:
                    continue
                if s.index == 0 and self.cfg.probes_first:
                    s.is_probe = True
                self.waiting.add(s)
                self._push(s)
        if self.cfg.probes_first:
            self.ctx.count("probes", len(groups))
        self._fill_all()

    def _chunks(self, groups: list[Group]) -> bool:
        """'auto' placement: baseline's chunks while the probe is measured useless, from a stream's start, in a
        stream without a staleness bound (no lane there: dealing only spreads groups over engines), and for a batch
        whose KV cache does not bind (``_kv_fits``)."""
        if self.ctx.streaming:
            return not self.informative or self.ctx.max_staleness is None
        return (not self.informative and self.correlation is not None) or self._kv_fits(groups)

    def _kv_fits(self, groups: list[Group]) -> bool:
        """Whether the arriving batch's samples that can run at once (as many as there are free slots) fit the
        engines' KV caches by their predicted demand (always, before any length has been seen). Then baseline's
        chunks place it, kept work-conserving by ``chunk_steal``, and what v3 adds (moves, steals) is all that
        differs; it deals from its ranked pool, with KV-aware admission, only where the KV cache binds. Dealing
        lost where a batch queues for slots (informative family, 8 engines, B=512, ten draws: 0.981x baseline,
        worst 1.015, against 0.964x, worst 1.000, in chunks with steals; a draw dealt without moves 1.043x,
        chunked 1.000x), and where every sample starts at once it spread each prompt over every engine's prefix
        cache and lost up to 3-11% on some draws (docs/notes/v3.md)."""
        samples = [s for g in groups for s in g.samples if not s.finished]
        prior = self._prior()
        if prior <= 0 or not samples:
            # nothing seen yet: a batch that starts at once goes as baseline's; one that queues is dealt, probes
            # first, so that its first finishes measure the probe and the lengths KV-aware admission needs
            return self.total_assigned + len(self.waiting) + len(samples) <= self.total_slots
        engines = [self.by_name[n] for n in self.assigned]
        cap = sum(getattr(e, "kv_cache_tokens", None) or 0 for e in engines)
        if not self.cfg.kv_admission or not cap:
            return True
        at_once = min(len(samples), max(0, self.total_slots - self.total_assigned - len(self.waiting)))
        each = sum(s.prompt_len + max(s.num_generated, prior) for s in samples) / len(samples)
        return sum(self.demand.values()) + at_once * each <= self.cfg.kv_budget * cap

    def _place_chunks(self, groups: list[Group]) -> None:
        """Baseline's placement of the arriving groups (``placement``), with v3's bookkeeping."""
        engines = sorted((e for es in self.ctx.pools().values() for e in es), key=lambda e: e.name)
        samples = [s for g in groups for s in g.samples if not s.finished]
        for g in groups:
            self.ranks[id(g)] = _GroupRank(sum(1 for s in g.samples if not s.finished))
            if self.cfg.probes_first and not g.samples[0].finished:
                g.samples[0].is_probe = True   # its length still measures the probe's correlation
        # steals keep a batch's chunks work-conserving; not a stream's (there the engines that hold carried work
        # should stay slower, so that the others complete their groups first), nor where the probe is measured to
        # predict nothing (there v3 is baseline, plus its moves)
        steal = self.cfg.chunk_steal and not self.ctx.streaming and (self.informative or self.correlation is None)
        for s, e in contiguous_chunks(samples, engines):
            self._place(s, e, self._expected_length(s))
            self.ctx.submit(s, engine=e)
            if steal:
                self.chunks.setdefault(e.name, deque()).append(s)

    def on_step_end(self, carried: list[Group]) -> list[Sample]:
        """Partial rollout, a step ended: the samples of carried groups worth generating again under the new
        weights: running ones unlikely to end within their group's last step (``early_restart``), and finished
        ones (``refresh``). Lengths are compared as time on an engine (a simulated engine reports a running
        segment's tokens only when it ends; a stopped one's pause is no work)."""
        out = self._early_restarts(carried)
        if not self.cfg.refresh:
            return out
        now = self.ctx.clock.now()
        for g in carried:
            running = [_engine_time(s, now) for s in g.samples if not s.finished]
            if not running:
                continue   # complete, waiting to be consumed: regenerating would only delay it
            bound = self.cfg.refresh_ratio * max(running)
            for s in g.samples:
                if s.finished and _engine_time(s, now) <= bound and s not in self.refreshed:
                    self.refreshed.add(s)
                    out.append(s)
        return out

    def _early_restarts(self, carried: list[Group]) -> list[Sample]:
        """Running samples of groups in their last step under the staleness bound (their oldest tokens would be
        too stale at the next) whose chance to end within a step's tokens (:class:`FinishOdds`) is below
        ``early_restart_chance``: restarted now, they spare their finished siblings. Not in a group whose finished
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
        if self.stream_has_room or odds.rate is None or (self.recurrence.known and self.recurrence.recurs):
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
                       and odds.chance(s.num_generated, odds.rate) < self.cfg.early_restart_chance)
        return out

    def _tracks_odds(self) -> bool:
        """Whether early restarts may happen here (a stream under a staleness bound, ``early_restart`` on), so
        that the finish odds are kept."""
        return self.cfg.early_restart and self.ctx.max_staleness is not None

    def batch_report(self) -> dict:
        """What v3 learnt so far: whether it ranks, the probe's measured correlation, the tail threshold,
        whether the heavy pool is a tail lane (and which engines serve as it; how many restarted runaways
        finished, and how many of them ran away again), the prefill price its moves are limited by."""
        price = self.prices.prefill_s_per_token
        return {"ranking": self.informative, "tail_lane": self.lane,
                "lane_engines": sorted(self.lane_names) if self.lane else [],
                "restarted_runaways": self.recurrence.outcomes, "recurred": self.recurrence.recurred,
                "probe_correlation": None if self.correlation is None else round(self.correlation, 4),
                "tail_threshold": None if math.isinf(self.tail_threshold) else int(self.tail_threshold),
                "prefill_s_per_token": None if price is None else float(f"{price:.3g}")}

    def on_worker_idle(self, engine: Engine) -> None:
        if self.waiting and not self.filling:
            self._fill(engine)
        elif self.chunks:
            self._steal_groups(engine)

    def idle_interest(self, pool: str) -> bool:
        return bool(self.waiting) or any(self.chunks.values())

    def on_sample_finished(self, sample: Sample) -> None:
        self._arrived(sample)
        self._unplace(sample)
        self.tail.discard(sample)
        self.waiting.discard(sample)
        n = sample.num_generated
        self.history.add(n)
        if self._tracks_odds():
            self.finished_in_step.append(n)
        self._observe_restarted(sample, finished=True)
        if self.history.seen % 64 == 0:   # (by count: the history stops growing once full)
            self._update_tail_threshold()
        g = sample.group
        rank = self.ranks.get(id(g))
        if rank is None:
            return
        rank.total += n
        rank.count += 1
        if rank.count >= rank.size and g.done:   # the count first: Group.done walks the samples
            del self.ranks[id(g)]
            # whole groups only: pairs taken as samples finish would over-represent the short ones
            probe = g.samples[0]
            if probe.is_probe:
                for s in g.samples[1:]:
                    self.pairs.add(probe.num_generated, s.num_generated)
                self._decide_ranking()
            return
        if n > rank.longest:
            rank.longest = n
            rank.stamp += 1
            for s in g.samples:
                if s in self.waiting:
                    self._push(s)
        # the group's running samples take its new mean at their next segment end (segments are short:
        # re-predicting every sibling on every finish cost more than the rest of the policy at scale)

    def on_segment_end(self, sample: Sample, engine: Engine) -> None:
        self._arrived(sample)
        self._repredict(sample)
        self._note_progress(sample)
        if sample not in self.tail and sample.num_generated >= self.tail_threshold:
            self._mark_tail(sample, engine.name, +1)
        self._observe_restarted(sample, finished=False)
        if self.lane:
            # a restarted runaway (its tokens thrown away for staleness) goes back to the lane at once, once
            # per generation; its restarted siblings are short and stay where they are. Until restarts are
            # seen to repeat runaways (recurrence known) only restarted ones go: a first-generation runaway
            # that outlives its window is restarted, where fresh responses make that cheap (also where the
            # stream fills every slot: redraw B=512 0.638-0.656x against 0.649-0.669x moving from the start)
            if sample not in self.runaways and (sample.num_generated >= self.lane_threshold or sample.restarts) \
                    and _peak_generated(sample) >= self.lane_threshold \
                    and (sample.restarts or self.recurrence.known or self.cfg.tail_lane == "always"):
                if engine.name in self.lane_names:
                    self._hold_runaway(sample, engine.name)
                elif sample.moves <= sample.restarts:
                    self._lane_move(sample, engine)
        elif self.cfg.migrate and not self.waiting and sample.moves == 0 and sample in self.tail:
            self._maybe_move(sample, engine)

    def segment_floor(self, sample: Sample, engine: Engine) -> int:
        """In a stream under a staleness bound with the tail lane off, segments of at least
        ``stream_segment_tokens``: there a segment's end buys v3 little and costs a re-prefill of the context's
        last partial block. With the lane on, every end stays a chance to move a runaway there; without a bound
        the drain's moves need them."""
        if self.ctx.streaming and self.ctx.max_staleness is not None and not self.lane:
            return self.cfg.stream_segment_tokens
        return 0

    def on_engine_lost(self, engine: Engine, requeued: list[Sample]) -> None:
        for s in requeued:
            self._unplace(s)
        self.demand.pop(engine.name, None)
        self.remaining.pop(engine.name, None)
        self.tail_on.pop(engine.name, None)
        self.runaways_on.pop(engine.name, None)
        self.arriving_on.pop(engine.name, None)
        self.arriving_ctx.pop(engine.name, None)
        if self.leads is not None:
            self.leads.drop(engine.name)
        self.assigned.pop(engine.name, None)
        self.total_slots = sum(self._limit(self.by_name[n]) for n in self.assigned)

    # --------------------------------------------------------------- ranking
    def _decide_ranking(self) -> None:
        """After a group completes: rank only while its probe has been seen to predict its siblings."""
        if self.cfg.rank == "auto" and len(self.pairs) >= self.cfg.min_pairs:
            first = self.correlation is None
            self.correlation = self.pairs.value()
            informative = self.correlation >= self.cfg.min_correlation
            if informative != self.informative or (first and not informative):
                self.informative = informative
                if informative and not self.ctx.streaming:
                    self.placed.clear()     # a ranked batch takes no sibling first (_take)
                self.heap = []
                for w in sorted(self.waiting, key=lambda w: (w.group.batch_index, w.group.position, w.index)):
                    self._push(w)

    def _push(self, s: Sample) -> None:
        rank = self.ranks[id(s.group)]
        tier, key = self.rank_key(s)
        g = s.group
        heapq.heappush(self.heap, (tier, key, g.batch_index, g.position, s.index, rank.stamp, next(self.seq), s))

    def rank_key(self, s: Sample) -> tuple[int, float]:
        """Where a waiting sample stands in the ranked pool, smallest first (ties in queue order): (tier, key).
        Called each time the sample is queued or its group's rank changes. A simulator-only reference may
        override it with what the trace knows (``bench/stream_oracle.py``)."""
        rank = self.ranks[id(s.group)]
        # probes jump the queue only while their lengths may be worth knowing: once the probe is measured
        # to predict nothing, queue order is baseline's (sample 0 still measures, from where it runs)
        tier = 0 if (s.is_probe and self.cfg.probes_first and (self.informative or self.correlation is None)) else 1
        # rank by the group's longest finished sample only while the groups' lengths have been seen to
        # predict their samples' (otherwise the order is noise and costs; queue order is baseline's)
        key = (-math.inf if rank.longest < 0 else -rank.longest) if self.informative else 0.0
        return tier, key

    def _top(self) -> Sample | None:
        heap = self.heap
        while heap:
            entry = heap[0]
            s = entry[-1]
            rank = self.ranks.get(id(s.group))
            if s in self.waiting and rank is not None and entry[5] == rank.stamp:
                return s
            heapq.heappop(heap)
        return None

    # ------------------------------------------------------------ prediction
    def _prior(self) -> float:
        """Mean finished length of the history (0 before anything finished: the context alone, as an
        engine's own admission sees it)."""
        return self.history.mean()

    def _expected_length(self, s: Sample) -> float:
        """Predicted response length: its group's mean finished length, else the prior; never less than
        what it has produced, never more than the run's response cap (not the sample's own max_tokens: in a
        replay that is its recorded length, which capped v3's predictions at the truth and flattered its
        KV-aware admission by about 1% on the KV-bound family)."""
        rank = self.ranks.get(id(s.group))
        est = rank.total / rank.count if rank is not None and rank.count else self._prior()
        return max(float(s.num_generated), min(est, float(self.ctx.sampling.max_tokens)))

    def _repredict(self, s: Sample) -> None:
        name = self.engine_of.get(s)
        if name is None:
            return
        new = self._expected_length(s)
        old_len, old_gen = self.predicted[s]
        self.demand[name] += new - old_len
        d_rem = (new - s.num_generated) - (old_len - old_gen)
        self.remaining[name] += d_rem
        self.total_remaining += d_rem
        self.predicted[s] = (new, s.num_generated)

    def _residual_length(self, generated: int) -> float:
        """Expected tokens still to come for a sample that has produced ``generated`` (:meth:`LengthHistory.residual`,
        up to the run's response cap)."""
        return self.history.residual(generated, self.ctx.sampling.max_tokens)

    def _update_tail_threshold(self) -> None:
        h = self.history
        h.refresh()
        self.tail_threshold = min(h.quantile(self.cfg.migrate_quantile),
                                  h.cap_runner_threshold(self.ctx.sampling.max_tokens, self.cfg.cap_runner_share))
        # the first finishes are the short ones, so an early quantile sends ordinary samples to the lane as
        # well: that spreads an informative stream's first steps (B=128: 0.436x against 0.455x when the lane
        # waits for a full history) but costs where lengths are noise, where v3 must be baseline
        self.lane_threshold = h.quantile(self.cfg.lane_quantile) if self.informative or h.full else math.inf

    # ------------------------------------------------------------- placement
    def _limit(self, e: Engine) -> int:
        limit = e.max_concurrency
        if self.cfg.heavy_max_seqs is not None and e.pool == HEAVY:
            limit = min(limit, self.cfg.heavy_max_seqs)
        return limit

    def _slots(self, e: Engine) -> int:
        """Free slots of ``e`` counting samples placed on it but not yet launched."""
        return self._limit(e) - self.assigned.get(e.name, 0)

    def _fits(self, e: Engine, need: float) -> bool:
        if not self.cfg.kv_admission or self.assigned.get(e.name, 0) == 0:
            return True
        cap = getattr(e, "kv_cache_tokens", None)
        return cap is None or self.demand[e.name] + need <= self.cfg.kv_budget * cap

    def _place(self, s: Sample, e: Engine, length: float) -> None:
        self.engine_of[s] = e.name
        self.predicted[s] = (length, s.num_generated)
        self.demand[e.name] += s.prompt_len + length
        self.remaining[e.name] += length - s.num_generated
        self.total_remaining += length - s.num_generated
        self.assigned[e.name] += 1
        self.total_assigned += 1
        if s in self.tail:
            self.tail_on[e.name] += 1
        self._push_engine(e.name)
        self._note_progress(s)

    def _unplace(self, s: Sample) -> None:
        # a runaway's hold ends wherever it was booked, or if it was not (a finished sample restarted for
        # staleness runs where it last ran, outside these books, and may be held there); that engine may have
        # been lost since (on_engine_lost drops its count)
        held = self.runaways.pop(s, None)
        if held is not None and held in self.runaways_on:
            self.runaways_on[held] -= 1
        name = self.engine_of.pop(s, None)
        if name is None:
            return
        length, gen = self.predicted.pop(s)
        if name in self.demand:
            self.demand[name] -= s.prompt_len + length
            self.remaining[name] -= length - gen
            self.assigned[name] -= 1
            if s in self.tail:
                self.tail_on[name] -= 1
            self._push_engine(name)
        self.total_remaining -= length - gen
        self.total_assigned -= 1

    def _fair_share(self, e: Engine) -> float:
        """``e``'s share (by slots) of the predicted remaining tokens of all unfinished work: when the last
        waiting samples are handed out, an engine that freed many slots at once must not take them all
        (its tail would run at a high step cost while the others drain)."""
        waiting_work = len(self.waiting) * self._prior()
        return self._limit(e) * (self.total_remaining + waiting_work) / self.total_slots

    def _take(self, e: Engine, balance: bool = True) -> bool:
        """Give ``e`` the top-ranked waiting sample if it has a slot and KV room; True if it did. In a stream, or
        while the rank is off, a waiting sibling of a group already on ``e`` comes first once the probes are out:
        it finds its prompt in ``e``'s prefix cache. Within a batch whose probe predicts, the rank is strict (there
        a hard group's long samples are better spread: 8 engines, B=128, seeds 12-14, four batches, 0.987 /
        0.994 / 1.019 of baseline spread, 0.991 / 0.989 / 1.025 kept together; KV-bound 0.941 / 0.969 against
        0.948 / 0.981)."""
        if self._slots(e) <= 0 or self.ctx.free_slots(e) <= 0:
            return False
        if self.lane and self.runaways_on.get(e.name) and self.assigned[e.name] >= self.cfg.lane_seqs:
            return False    # a lane engine holding a runaway stays light
        top = s = self._top()
        if top is None:
            return False
        local = self.cfg.locality and (self.ctx.streaming or not self.informative)
        if local and not top.is_probe:
            s = _waiting_sibling(self.placed.get(e.name), self.waiting) or top
        length = self._expected_length(s)
        if not self._fits(e, s.prompt_len + length):
            return False
        if (balance and self.cfg.balance and self.assigned[e.name]
                and self.remaining[e.name] + length > self._fair_share(e)):
            return False
        if s is top:
            heapq.heappop(self.heap)
        self.waiting.discard(s)     # (a sibling taken before the top leaves its heap entry to _top)
        self._place(s, e, length)
        if local:
            self.placed.setdefault(e.name, {})[id(s.group)] = s.group
        self.ctx.submit(s, engine=e)
        return True

    def _fill(self, engine: Engine) -> None:
        self.filling = True
        try:
            while self.waiting and self._take(engine):
                pass
        finally:
            self.filling = False

    def _fill_all(self) -> None:
        """A batch arrived: spread its ranked work over all engines, one sample at a time to the least loaded
        one, as far as slots and KV allow (no share limit: what fits now starts now)."""
        self.filling = True
        try:
            engines = [e for es in self.ctx.pools().values() for e in es]
            order = {e.name: i for i, e in enumerate(sorted(engines, key=lambda e: e.name))}
            heap = [(self.assigned[e.name] / e.max_concurrency, order[e.name], e) for e in engines]
            heapq.heapify(heap)
            while heap and self.waiting:
                _, i, e = heapq.heappop(heap)
                if self._take(e, balance=False):
                    heapq.heappush(heap, (self.assigned[e.name] / e.max_concurrency, i, e))
        finally:
            self.filling = False

    # --------------------------------------------------------------- the tail
    def _mark_tail(self, s: Sample, name: str, delta: int) -> None:
        if delta > 0:
            self.tail.add(s)
        else:
            self.tail.discard(s)
        if name in self.tail_on:
            self.tail_on[name] += delta
            self._push_engine(name)

    def _push_engine(self, name: str) -> None:
        """Record an engine's (tail samples, samples) in the lazy heap of move targets. Targets are only
        looked up once nothing waits, so while work waits the heap is marked stale instead (rebuilt once)."""
        if self.waiting:
            self.targets_stale = True
            return
        heapq.heappush(self.targets, (self.tail_on[name], self.assigned[name], name))

    def _best_target(self) -> Engine | None:
        """The live engine running the fewest tail samples, then the fewest samples."""
        if self.targets_stale:
            self.targets = [(n, self.assigned[name], name) for name, n in self.tail_on.items()]
            heapq.heapify(self.targets)
            self.targets_stale = False
        heap = self.targets
        while heap:
            tails, count, name = heap[0]
            if name in self.tail_on and tails == self.tail_on[name] and count == self.assigned[name]:
                return self.by_name[name]
            heapq.heappop(heap)
        return None

    def _note_progress(self, s: Sample) -> None:
        name = self.engine_of.get(s)
        if name is not None and self.leads is not None:
            self.leads.note(s, self.assigned.get(name, 0))

    def _lead_finishes_first(self, name: str, generated: int, remaining: float) -> bool:
        """Whether engine ``name``'s furthest-along sample is expected to finish before a moved sample that has
        produced ``generated`` and has ``remaining`` tokens still to come (``migrate_lead_guard``). While the history
        is not full and none of it ran to the cap, it holds the first finishes, the short ones, and cannot say what a
        long-running sample has left (read as the cap less its progress, the further-along runaway looked the nearer
        to its end, and a cold batch's runaways gathered on one engine); the one further along is then taken to have
        more left, up to the cap (:func:`unseen_residual`)."""
        lead = self.leads.lead(name) if self.leads is not None else None
        if lead is None:
            return True
        cap = self.ctx.sampling.max_tokens
        seen = self.history.sorted
        if (not self.history.full and not (seen and seen[-1] >= cap)
                and unseen_residual(lead, cap) >= unseen_residual(generated, cap)):
            return False
        return self._residual_length(lead) < remaining

    def _open_target(self, s: Sample, source: Engine, context: int) -> Engine | None:
        """The best move target (``_best_target``) among those whose furthest-along sample is expected to finish
        before ``s`` (``migrate_lead_guard``) and where the prefill of the moves still arriving, and of this one's
        ``context`` tokens, pays (``migrate_stall_share``); the next best are tried while the best are ruled out
        (with many engines one target was full and moves waited)."""
        skipped = []
        found = None
        remaining = self._residual_length(s.num_generated)
        while len(skipped) < _MAX_TARGETS_TRIED:
            target = self._best_target()
            if target is None:
                break
            if target is source or self._takes(target.name, source.name, s.num_generated, context, remaining):
                found = target
                break
            skipped.append(heapq.heappop(self.targets))
        for entry in skipped:
            heapq.heappush(self.targets, entry)
        return found

    def _takes(self, name: str, source: str, generated: int, context: int, remaining: float) -> bool:
        """Whether engine ``name`` takes a moved sample of ``context`` tokens that has produced ``generated`` and has
        ``remaining`` still to come."""
        if self.cfg.migrate_lead_guard and not self._lead_finishes_first(name, generated, remaining):
            return False
        if not self.arriving_on.get(name, 0):
            return True
        return bool(self.prices.stall_pays(source, name, self.arriving_ctx.get(name, 0) + context, remaining,
                                           self.cfg.migrate_stall_share))

    def _maybe_move(self, s: Sample, engine: Engine) -> None:
        """Move a tail sample once to the engine with the fewest tail samples (then the fewest samples),
        when that engine is clearly less crowded than its own: fewer tail samples by two and fewer samples,
        or clearly fewer samples, and the prefill of the moves still arriving there stays within
        ``migrate_stall_share`` of what the move saves. (A move costs a prefill of the whole context on the
        target; moving between engines that differ only in their tail counts cost 1-2% on cold batches, whose
        early tail threshold is low.)"""
        context = s.prompt_len + s.num_generated
        target = self._open_target(s, engine, context)
        if target is None or target is engine:
            return
        name, to = engine.name, target.name
        fewer_tails = self.tail_on[to] + 1 < self.tail_on[name] and self.assigned[to] < self.assigned[name]
        fewer_samples = (self.tail_on[to] <= self.tail_on[name] - 1
                         and self.assigned[name] - self.assigned[to] >= self.cfg.migrate_min_gap
                         and self.assigned[to] <= self.cfg.migrate_min_ratio * self.assigned[name])
        if not (fewer_tails or fewer_samples):
            return
        length = self._expected_length(s)
        if self._slots(target) <= 0 or self.ctx.free_slots(target) <= 0 or not self._fits(target, s.prompt_len + length):
            return
        self._move_to(s, target, length)
        self.arriving[s] = (to, context)
        self.arriving_on[to] = self.arriving_on.get(to, 0) + 1
        self.arriving_ctx[to] = self.arriving_ctx.get(to, 0) + context

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

    def _observe_restarted(self, s: Sample, *, finished: bool) -> None:
        """Note whether a restarted runaway ran away again ('auto' lane: ``RunawayRecurrence``), and set the
        lane again when the verdict changes."""
        if not s.restarts or self.cfg.tail_lane != "auto" or math.isinf(self.lane_threshold):
            return
        recurs = self.recurrence.recurs
        self.recurrence.observe(id(s), s.restarts, s.num_generated,
                                earlier_peak([(x.start_token, x.num_tokens) for x in s.segments]),
                                self.lane_threshold, finished=finished)
        if self.recurrence.recurs != recurs:
            self._set_lane()

    def _set_lane(self) -> None:
        """'auto': a tail lane while groups stream in under a staleness bound (without one a slow tail just
        carries over, and the lane's capacity cost 1.6-2%), unless the runaways restarted so far did not run
        away again (``lane_recurrence``: a restart then costs less than the lane); its engines: every heavy
        one while the stream leaves slots free, one when the stream fills every slot (``lane_engines``)."""
        if self.cfg.tail_lane == "auto":
            self.lane = self.ctx.streaming and self.ctx.max_staleness is not None and self.recurrence.recurs
        heavy = sorted(e.name for e in self.ctx.pools().get(HEAVY, []))
        count = self.cfg.lane_engines or (len(heavy) if self.stream_has_room else 1)
        self.lane_names = set(heavy[:count])

    def _lane_move(self, s: Sample, engine: Engine) -> None:
        """Move a runaway to the lane engine holding the fewest runaways (then the fewest samples); that
        engine then admits little new work (``_take``), so the runaway runs light."""
        lane = [e for e in self.ctx.pools().get(HEAVY, []) if e.name in self.tail_on and e.name in self.lane_names]
        if not lane:
            return
        target = min(lane, key=lambda e: (self.runaways_on.get(e.name, 0), self.assigned[e.name]))
        if self.ctx.free_slots(target) <= 0:
            return
        self._move_to(s, target, self._expected_length(s))
        self._hold_runaway(s, target.name)

    def _hold_runaway(self, s: Sample, name: str) -> None:
        """``s`` runs on lane engine ``name`` past the lane threshold: the engine stays light while it does."""
        self.runaways[s] = name
        self.runaways_on[name] = self.runaways_on.get(name, 0) + 1

    def _steal_groups(self, engine: Engine) -> None:
        """``engine`` has free slots and nothing queued (``chunk_steal``): it takes whole unstarted groups from
        the end of the chunk of the engine with the most unstarted samples, up to half of them, so that chunks
        stay work-conserving and each group keeps its prompt's prefix cache on one engine."""
        donor, most = None, 0
        for name, q in list(self.chunks.items()):
            while q and (q[0].segments or q[0].finished or self.engine_of.get(q[0]) != name):
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
                if not s.finished and self.engine_of.get(s) == donor and self.ctx.reroute(s, engine):
                    self._rebook(s, engine, self.predicted[s][0])
                    self.chunks.setdefault(engine.name, deque()).append(s)   # unstarted there too, until it runs
                    taken += 1

    def _rebook(self, s: Sample, target: Engine, length: float) -> None:
        """Re-place ``s`` on ``target`` in the policy's books (predicted ``length``)."""
        self._unplace(s)
        self._place(s, target, length)

    def _move_to(self, s: Sample, target: Engine, length: float) -> None:
        """Re-place ``s`` on ``target`` in the policy's books and ask the scheduler to move it there."""
        self._rebook(s, target, length)
        self.ctx.move(s, engine=target)     # counted by the scheduler as a move


_MAX_TARGETS_TRIED = 8   # move targets ruled out (_takes) before a move is given up
_RATE_QUANTILE = 0.9     # of what the samples running across a whole step made: a step's tokens at full speed
_ODDS_STEPS = 4          # steps of finished and restarted lengths the early-restart odds read (at B=512 one step
#                          finishes ~4,000 samples and the history's 2,048 hold only a few of the long ones)


def _waiting_sibling(groups: dict[int, Group] | None, waiting: set[Sample]) -> Sample | None:
    """A waiting sample of one of ``groups`` (groups with none left are dropped on the way)."""
    while groups:
        key, g = next(iter(groups.items()))
        for s in g.samples:
            if s in waiting:
                return s
        del groups[key]
    return None


def _peak_generated(sample: Sample) -> int:
    """The most tokens the sample has held, counting generations it was restarted from."""
    return max((seg.start_token + seg.num_tokens for seg in sample.segments), default=0)


def _engine_time(sample: Sample, now: float) -> float:
    """Seconds the sample has spent running on engines (a running segment counts up to ``now``)."""
    return sum((now if seg.end_time_s is None else seg.end_time_s) - seg.submit_time_s for seg in sample.segments)
