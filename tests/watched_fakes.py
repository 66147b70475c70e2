"""A fake engine (tests/fakes.py's LoopEngine) that keeps no request and watches which groups are still alive: for
the long-run tests, which check what a run lets go."""

from __future__ import annotations

import gc
import weakref

from fakes import LoopEngine


class WatchedLoopEngine(LoopEngine):
    """Watches (weakly) every group it is sent. At the first request of each new batch it collects garbage and
    records in ``ALIVE`` how many of the groups seen so far are still alive then."""

    SEEN: dict[int, weakref.ref] = {}   # id(group) -> the group (groups are unhashable dataclasses)
    ALIVE: list[int] = []
    _batch: int | None = None

    def submit(self, req) -> None:
        group = req.sample.group
        cls = type(self)
        if group.batch_index != cls._batch:
            cls._batch = group.batch_index
            gc.collect()
            cls.ALIVE.append(sum(ref() is not None for ref in cls.SEEN.values()))
        ref = cls.SEEN.get(id(group))
        if ref is None or ref() is not group:
            cls.SEEN[id(group)] = weakref.ref(group)
        super().submit(req)
        self.submitted.clear()   # the fake's own record of requests would keep every group

    @classmethod
    def reset(cls) -> None:
        cls.SEEN, cls.ALIVE, cls._batch = {}, [], None
