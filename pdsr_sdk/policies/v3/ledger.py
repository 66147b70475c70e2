"""v3's shared books: what waits, where each sample is placed and what it is predicted to need there, each engine's
slots, its tail samples and its held runaways, and the lazy heap of move targets. Several rules read them; only
the ledger's own methods change them, so that every count moves with its placement."""

from __future__ import annotations

import heapq
from typing import Callable

from pdsr_sdk.dispatch.protocols import DispatchContext, Engine
from pdsr_sdk.dispatch.types import HEAVY, Group, Sample
from pdsr_sdk.policies.v3.settings import V3Settings


class Ledger:
    """Placement (engine, predicted length), demand (tokens still to generate), slots and moves."""

    def __init__(self, config: V3Settings, ctx: DispatchContext) -> None:
        self.cfg = config
        self.ctx = ctx
        self.waiting: set[Sample] = set()            # queued in the policy's ranked pool, not yet placed
        self.by_name: dict[str, Engine] = {}
        self.engine_of: dict[Sample, str] = {}       # submitted (queued on or running on) engine
        self.predicted: dict[Sample, tuple[float, int]] = {}   # placed sample -> (predicted length, generated then)
        self.assigned: dict[str, int] = {}           # samples placed on each engine and not finished
        self.remaining: dict[str, float] = {}        # predicted tokens still to generate per engine
        self.total_assigned = 0
        self.total_slots = 0
        self.total_remaining = 0.0
        self.stream_has_room = False                 # a stream whose work in flight leaves slots free
        self.tail: set[Sample] = set()               # running samples past the tail threshold (or moved)
        self.tail_on: dict[str, int] = {}            # tail samples per engine
        self.targets: list[tuple[int, int, str]] = []   # lazy heap of move targets
        self.targets_stale = True
        self.runaways: dict[Sample, str] = {}        # samples past the lane threshold -> the lane engine holding them
        self.runaways_on: dict[str, int] = {}        # such samples per lane engine
        self.moved_at: dict[Sample, int] = {}        # a moved sample -> its restarts at its latest move (generation)

    # ----------------------------------------------------------- engines
    def arrive(self, engines: list[Engine], groups: list[Group]) -> None:
        """``groups`` arrived: book the live engines not yet known, count the slots again, and note whether a
        stream leaves slots free with them."""
        for e in engines:
            self.by_name.setdefault(e.name, e)
            self.assigned.setdefault(e.name, 0)
            self.remaining.setdefault(e.name, 0.0)
            if e.name not in self.tail_on:
                self.tail_on[e.name] = 0
                self.push_engine(e.name)
        self.total_slots = sum(self.limit(self.by_name[n]) for n in self.assigned)
        waiting_after = sum(1 for g in groups for s in g.samples if not s.finished) + len(self.waiting)
        self.stream_has_room = self.ctx.streaming and self.total_assigned + waiting_after <= self.total_slots

    def lose(self, engine: Engine, requeued: list[Sample]) -> None:
        for s in requeued:
            self.unplace(s)
        self.remaining.pop(engine.name, None)
        self.tail_on.pop(engine.name, None)
        self.runaways_on.pop(engine.name, None)
        self.assigned.pop(engine.name, None)
        self.total_slots = sum(self.limit(self.by_name[n]) for n in self.assigned)

    def limit(self, e: Engine) -> int:
        limit = e.max_concurrency
        if self.cfg.placement.heavy_max_seqs is not None and e.pool == HEAVY:
            limit = min(limit, self.cfg.placement.heavy_max_seqs)
        return limit

    def slots(self, e: Engine) -> int:
        """Free slots of ``e`` counting samples placed on it but not yet launched."""
        return self.limit(e) - self.assigned.get(e.name, 0)

    def fair_share(self, e: Engine, prior: float) -> float:
        """``e``'s share (by slots) of the predicted remaining tokens of all unfinished work (each waiting sample
        counted at ``prior``): when the last waiting samples are handed out, an engine that freed many slots at once
        must not take them all (its tail would run at a high step cost while the others drain)."""
        waiting_work = len(self.waiting) * prior
        return self.limit(e) * (self.total_remaining + waiting_work) / self.total_slots

    # ------------------------------------------------------------ the pool
    def queue(self, s: Sample) -> None:
        """``s`` joins the ranked pool (placed nowhere yet)."""
        self.waiting.add(s)

    def dequeue(self, s: Sample) -> None:
        """``s`` leaves the ranked pool, about to be placed."""
        self.waiting.discard(s)

    # ------------------------------------------------------------ placement
    def place(self, s: Sample, e: Engine, length: float) -> None:
        self.engine_of[s] = e.name
        self.predicted[s] = (length, s.num_generated)
        self.remaining[e.name] += length - s.num_generated
        self.total_remaining += length - s.num_generated
        self.assigned[e.name] += 1
        self.total_assigned += 1
        if s in self.tail:
            self.tail_on[e.name] += 1
        self.push_engine(e.name)

    def unplace(self, s: Sample) -> None:
        # a runaway's hold ends wherever it was booked, or if it was not (a finished sample restarted for
        # staleness runs where it last ran, outside these books, and may be held there); that engine may have
        # been lost since (lose drops its count)
        held = self.runaways.pop(s, None)
        if held is not None and held in self.runaways_on:
            self.runaways_on[held] -= 1
        name = self.engine_of.pop(s, None)
        if name is None:
            return
        length, gen = self.predicted.pop(s)
        if name in self.assigned:
            self.remaining[name] -= length - gen
            self.assigned[name] -= 1
            if s in self.tail:
                self.tail_on[name] -= 1
            self.push_engine(name)
        self.total_remaining -= length - gen
        self.total_assigned -= 1

    def finished(self, s: Sample) -> None:
        """``s`` finished: out of every book."""
        self.unplace(s)
        self.moved_at.pop(s, None)
        self.tail.discard(s)
        self.waiting.discard(s)

    def repredict(self, s: Sample, expected: Callable[[Sample], float]) -> None:
        """A segment of ``s`` ended: book its new predicted length (``expected``)."""
        name = self.engine_of.get(s)
        if name is None:
            return
        new = expected(s)
        old_len, old_gen = self.predicted[s]
        d_rem = (new - s.num_generated) - (old_len - old_gen)
        self.remaining[name] += d_rem
        self.total_remaining += d_rem
        self.predicted[s] = (new, s.num_generated)

    # ---------------------------------------------------------------- moves
    def rebook(self, s: Sample, target: Engine, length: float) -> None:
        """Re-place ``s`` on ``target`` in the books (predicted ``length``)."""
        self.unplace(s)
        self.place(s, target, length)

    def move_to(self, s: Sample, target: Engine, length: float) -> None:
        """Re-place ``s`` on ``target`` in the books and ask the scheduler to move it there."""
        self.rebook(s, target, length)
        self.moved_at[s] = s.restarts
        self.ctx.move(s, engine=target)     # counted by the scheduler as a move

    def hold_runaway(self, s: Sample, name: str) -> None:
        """``s`` runs on lane engine ``name`` past the lane threshold: the engine stays light while it does."""
        self.runaways[s] = name
        self.runaways_on[name] = self.runaways_on.get(name, 0) + 1

    # ------------------------------------------------------------- the tail
    def mark_tail(self, s: Sample, name: str, delta: int) -> None:
        if delta > 0:
            self.tail.add(s)
        else:
            self.tail.discard(s)
        if name in self.tail_on:
            self.tail_on[name] += delta
            self.push_engine(name)

    def push_engine(self, name: str) -> None:
        """Record an engine's (tail samples, samples) in the lazy heap of move targets. Targets are only
        looked up once nothing waits, so while work waits the heap is marked stale instead (rebuilt once)."""
        if self.waiting or self.targets_stale:
            self.targets_stale = True   # (a stale heap is rebuilt whole at the next lookup: no push needed)
            return
        heapq.heappush(self.targets, (self.tail_on[name], self.assigned[name], name))
        if len(self.targets) > self.max_targets():
            # outdated entries leave only as they reach the top at a lookup, and a run with no moves looks up
            # none: rebuilt at the next lookup instead, the heap holds no more than this, however long the run
            self.targets = []
            self.targets_stale = True

    def max_targets(self) -> int:
        """The most entries the lazy heap of move targets holds before it is dropped, to be rebuilt (two per
        engine and some: a rebuild at most every few dozen pushes)."""
        return 2 * len(self.tail_on) + 32

    def best_target(self, ruled_out: Callable[[Engine], bool] | None = None, tries: int = 1) -> Engine | None:
        """The live engine running the fewest tail samples, then the fewest samples; with ``ruled_out``, the best
        of the first ``tries`` such engines that it does not rule out (the others stay in the heap)."""
        if self.targets_stale:
            self.targets = [(n, self.assigned[name], name) for name, n in self.tail_on.items()]
            heapq.heapify(self.targets)
            self.targets_stale = False
        skipped = []
        found = None
        while len(skipped) < tries:
            target = self._top_target()
            if target is None or ruled_out is None or not ruled_out(target):
                found = target
                break
            skipped.append(heapq.heappop(self.targets))
        for entry in skipped:
            heapq.heappush(self.targets, entry)
        return found

    def _top_target(self) -> Engine | None:
        heap = self.targets
        while heap:
            tails, count, name = heap[0]
            if name in self.tail_on and tails == self.tail_on[name] and count == self.assigned[name]:
                return self.by_name[name]
            heapq.heappop(heap)
        return None
