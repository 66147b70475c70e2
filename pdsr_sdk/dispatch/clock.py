"""Clocks: wall time on an asyncio loop, or virtual time for simulation and tests."""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import asyncio


class LoopClock:
    """Wall-clock seconds since creation, timers on the running asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        import asyncio

        self._loop = loop or asyncio.get_running_loop()
        self._t0 = self._loop.time()

    def now(self) -> float:
        return self._loop.time() - self._t0

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self._loop.call_later(max(0.0, delay), callback)


class _VirtualTimer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """Discrete-event time: ``run()`` fires timers in time order, jumping between them.

    Ties fire in scheduling order, so runs are deterministic.
    """

    def __init__(self, start: float = 0.0):
        self._now = start
        self._heap: list[tuple[float, int, _VirtualTimer, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> _VirtualTimer:
        return self.call_at(self._now + max(0.0, delay), callback)

    def call_at(self, when: float, callback: Callable[[], None]) -> _VirtualTimer:
        handle = _VirtualTimer()
        heapq.heappush(self._heap, (max(when, self._now), next(self._seq), handle, callback))
        return handle

    def pending(self) -> int:
        return sum(1 for _, _, h, _ in self._heap if not h.cancelled)

    def step(self) -> bool:
        """Fire the next live timer; False when none is left."""
        while self._heap:
            when, _, handle, callback = heapq.heappop(self._heap)
            if handle.cancelled:
                continue
            self._now = when
            callback()
            return True
        return False

    def run(self, until: Callable[[], bool] | None = None, max_events: int | None = None) -> int:
        """Fire timers until none is left or ``until()`` is true; returns events fired."""
        fired = 0
        while (until is None or not until()) and (max_events is None or fired < max_events):
            if not self.step():
                break
            fired += 1
        return fired
