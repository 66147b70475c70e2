"""The scheduler's engines, their slots and the queues in front of them: which engine has room, what runs
where, and what waits where (a pool's queue or one engine's own)."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

from pdsr_sdk.dispatch.protocols import Clock, Engine
from pdsr_sdk.dispatch.types import Sample
from pdsr_sdk.errors import EngineError, PdsrError


@dataclass(eq=False, slots=True)
class Run:
    """One submitted segment of one sample."""

    request_id: str
    sample: Sample
    engine: Engine
    #: what to do when an abort we issued comes back: ("queue", pool, engine, cap, restart), ("finish", reason)
    #: or ("pause",) (hold it until the scheduler resumes)
    intent: tuple[Any, ...] | None = None
    stolen_from: str | None = None


@dataclass
class EngineUsage:
    """Per-engine counters for the run summary."""

    busy_s: float = 0.0
    busy_since: float | None = None
    segments: int = 0
    tokens: int = 0
    dead: bool = False
    #: the older policy version the engine still holds while it finishes samples under it (a staggered update,
    #: :meth:`~pdsr_sdk.dispatch.scheduler.lag.Lagging.lag`), else None
    lag_version: int | None = None


@dataclass(slots=True)
class Queued:
    """A sample waiting on a queue, with the cap it is to run under."""

    sample: Sample
    cap: int | None
    #: a multi-turn sample's next turn (continue_turn): launched as a continuation, the policy already placed it
    turn: bool = False


class SlotTable:
    """Engines, slots and queues (set by :meth:`_init_slots`), and the policy's questions about them. It launches
    nothing: it marks the engines and pools whose slots or queues changed (``_dirty_engines``, ``_dirty_pools``,
    ``_grown_pools``) for the next pump (:class:`~pdsr_sdk.dispatch.scheduler.launch.Launcher`)."""

    def _init_slots(self, engines: Sequence[Engine], clock: Clock) -> None:
        self.clock = clock
        self.engines: list[Engine] = list(engines)
        self.usage: dict[str, EngineUsage] = {e.name: EngineUsage() for e in engines}
        self._pool_queues: dict[str, deque[Queued]] = {}
        self._engine_queues: dict[str, deque[Queued]] = {e.name: deque() for e in engines}
        for e in engines:
            self._pool_queues.setdefault(e.pool, deque())
        self._runs: dict[str, Run] = {}               # request_id -> run
        self._run_of: dict[Sample, Run] = {}           # running sample -> run
        self._where: dict[Sample, tuple[str, str]] = {}  # queued sample -> ("pool"|"engine", key)
        self._running_on: dict[str, set[str]] = {e.name: set() for e in engines}
        self._by_name: dict[str, Engine] = {e.name: e for e in engines}
        self._order: dict[str, int] = {e.name: i for i, e in enumerate(engines)}
        # live engines per pool (O(1) "is the pool alive" checks; pools() is O(engines))
        self._live: dict[str, int] = {p: 0 for p in self._pool_queues}
        for e in engines:
            self._live[e.pool] += 1
        # per pool, a lazy heap of (load fraction, order, name): the least loaded engine first. Loads that
        # changed since the last pop wait in _load_changed and are pushed just before the next pop.
        self._free_heap: dict[str, list[tuple[float, int, str]]] = {p: [] for p in self._pool_queues}
        self._load_changed: dict[str, set[str]] = {p: set() for p in self._pool_queues}
        for e in engines:
            self._push_free(e)
        self._dirty_engines: set[str] = set()
        self._dirty_pools: set[str] = set()
        self._grown_pools: set[str] = set()   # pools whose queue got work since the last pump
        self._pool_engines: dict[str, list[Engine]] = {p: [e for e in engines if e.pool == p]
                                                       for p in self._pool_queues}
        self._lag_of: dict[Sample, Engine] = {}   # a sample finishing under older weights -> the engine holding them

    def pools(self) -> dict[str, list[Engine]]:
        out: dict[str, list[Engine]] = {pool: [] for pool in self._pool_queues}
        for e in self.live_engines():
            out.setdefault(e.pool, []).append(e)
        return out

    def live_engines(self) -> list[Engine]:
        return [e for e in self.engines if not self.usage[e.name].dead]

    def queued(self, pool: str) -> list[Sample]:
        return [q.sample for q in self._pool_queues.get(pool, ())]

    def queue_length(self, pool: str) -> int:
        return len(self._pool_queues.get(pool, ()))

    def queued_on(self, engine: Engine) -> list[Sample]:
        """Samples waiting on ``engine``'s own queue (placed on it, not on its pool's)."""
        return [q.sample for q in self._engine_queues.get(engine.name, ())]

    def running(self, engine: Engine | None = None) -> list[Sample]:
        if engine is None:
            return list(self._run_of)
        runs = self._runs
        return [runs[r].sample for r in self._running_on[engine.name] if r in runs]   # (not slots held by turns)

    def free_slots(self, engine: Engine) -> int:
        try:
            return self._free_slots(engine)
        except KeyError:
            raise self._foreign(engine, "asked for the free slots of") from None

    def _check_own(self, engine: Engine, what: str) -> None:
        """A PdsrError unless ``engine`` is one of this run's (a policy that ``what`` another engine)."""
        if self._by_name.get(engine.name) is not engine:
            raise self._foreign(engine, what)

    def _foreign(self, engine: Engine, what: str) -> PdsrError:
        return PdsrError(f"policy {what} engine {engine.name!r}, which is not one of this run's engines "
                         f"({', '.join(self._by_name)}); pass an engine from ctx.pools()")

    def least_loaded(self, pool: str) -> Engine | None:
        return self._pop_least_loaded(pool) if pool in self._free_heap else None

    def engine_of(self, sample: Sample) -> Engine | None:
        run = self._run_of.get(sample)
        return run.engine if run is not None else None

    @property
    def in_flight(self) -> int:
        """Requests submitted to engines that have not ended."""
        return len(self._runs)

    def _enqueue(self, sample: Sample, pool: str | None, engine: Engine | None, cap: int | None,
                 front: bool, *, check_live: bool = True, turn: bool = False) -> None:
        item = Queued(sample, cap, turn)
        lag = self._lag_of.get(sample)
        if lag is not None and self.usage[lag.name].dead:   # its weights died with the engine: it goes on as any
            del self._lag_of[sample]
            lag = None
        if lag is not None:   # it runs only where its weights are, wherever a policy sends it
            pool, engine = lag.pool, lag
        if engine is not None:
            self._check_own(engine, f"placed sample {sample.key} on")
            usage = self.usage[engine.name]
            if usage.dead or (usage.lag_version is not None and lag is not engine):
                pool, engine = engine.pool, None
            else:
                q = self._engine_queues[engine.name]
                q.appendleft(item) if front else q.append(item)
                self._where[sample] = ("engine", engine.name)
                self._dirty_engines.add(engine.name)
                return
        if pool is None:
            raise PdsrError(f"policy submitted sample {sample.key} without a pool or an engine")
        if pool not in self._pool_queues:
            raise PdsrError(f"policy submitted sample {sample.key} to pool {pool!r}; pools: "
                            f"{', '.join(sorted(self._pool_queues))}")
        if check_live and not self._live[pool]:
            raise EngineError(pool, f"no live engine left in pool {pool!r}")
        if sample.routed_to is None and not sample.is_probe:
            sample.routed_to = pool
        q = self._pool_queues[pool]
        q.appendleft(item) if front else q.append(item)
        self._where[sample] = ("pool", pool)
        self._dirty_pools.add(pool)
        self._grown_pools.add(pool)

    def _dequeue(self, sample: Sample) -> None:
        kind, key = self._where.pop(sample)
        q = self._pool_queues[key] if kind == "pool" else self._engine_queues[key]
        for i, item in enumerate(q):
            if item.sample is sample:
                del q[i]
                return

    def _free_slots(self, engine: Engine, *, own_queue: bool = False) -> int:
        """Room for new work on ``engine``: none while it is dead, nor while it lags (it holds older weights)
        except for its own queue (``own_queue``), which then holds only the samples it finishes under them."""
        usage = self.usage[engine.name]
        if usage.dead or (usage.lag_version is not None and not own_queue):
            return 0
        return engine.max_concurrency - len(self._running_on[engine.name])

    def _take_slot(self, engine: Engine, request_id: str) -> None:
        slots = self._running_on[engine.name]
        if not slots:
            self.usage[engine.name].busy_since = self.clock.now()
        slots.add(request_id)
        self._load_changed[engine.pool].add(engine.name)

    def _release_slot(self, engine: Engine, request_id: str) -> None:
        slots = self._running_on[engine.name]
        slots.discard(request_id)
        if not slots:
            self._mark_idle(engine)
        self._room_changed(engine)

    def _room_changed(self, engine: Engine) -> None:
        """``engine`` can take other work than before: its load, its queue and its pool are looked at again."""
        self._load_changed[engine.pool].add(engine.name)
        self._dirty_engines.add(engine.name)
        self._dirty_pools.add(engine.pool)

    def _push_free(self, engine: Engine) -> None:
        """Record the engine's current load in its pool's heap (stale entries are skipped on pop)."""
        if self._free_slots(engine) > 0:
            load = len(self._running_on[engine.name]) / engine.max_concurrency
            heapq.heappush(self._free_heap[engine.pool], (load, self._order[engine.name], engine.name))

    def _pop_least_loaded(self, pool: str) -> Engine | None:
        changed = self._load_changed[pool]
        if changed:
            for name in changed:
                self._push_free(self._by_name[name])
            changed.clear()
            heap = self._free_heap[pool]
            if len(heap) > 4 * self._live[pool] + 64:
                # drop stale entries (each live engine with room keeps exactly its current entry)
                heap[:] = [(len(self._running_on[n]) / e.max_concurrency, self._order[n], n)
                           for n, e in self._by_name.items()
                           if e.pool == pool and self._free_slots(e) > 0]
                heapq.heapify(heap)
        heap = self._free_heap[pool]
        while heap:
            load, _, name = heap[0]
            engine = self._by_name[name]
            if (not self.usage[name].dead and self._free_slots(engine) > 0
                    and load == len(self._running_on[name]) / engine.max_concurrency):
                return engine
            heapq.heappop(heap)
        return None

    def _mark_idle(self, engine: Engine) -> None:
        usage = self.usage[engine.name]
        if usage.busy_since is not None:
            usage.busy_s += self.clock.now() - usage.busy_since
            usage.busy_since = None
