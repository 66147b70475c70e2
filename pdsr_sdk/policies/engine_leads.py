"""Per engine, the most tokens any of its samples has produced (v3's move guard reads it).

A lazy max-heap per engine: an entry is pushed whenever a sample is placed or ends a segment, and
entries of samples that left the engine (finished, moved, requeued) or were restarted below them are
dropped when they reach the top. A heap that grows past twice its engine's samples is compacted to
each sample's latest entry. Reading a lead is then amortised O(log n), where a scan of the engine's
samples would cost O(n) for every move considered.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping

from pdsr_sdk.dispatch.types import Sample

_SLACK = 64   # entries a heap may hold beyond twice its engine's samples before it is compacted


class EngineLeads:
    """The furthest-along sample's progress on each engine, over ``placement`` (sample -> engine name),
    a mapping the caller keeps up to date (it is read, never written)."""

    def __init__(self, placement: Mapping[Sample, str]) -> None:
        self.placement = placement
        self.heaps: dict[str, list[tuple[int, int, Sample]]] = {}
        self.seq = itertools.count()

    def note(self, s: Sample, samples_on_engine: int) -> None:
        """``s`` was placed or ended a segment: record what it has produced on its engine
        (``samples_on_engine``: how many samples that engine holds, for the compaction bound)."""
        name = self.placement.get(s)
        if name is None:
            return
        heap = self.heaps.setdefault(name, [])
        heapq.heappush(heap, (-s.num_generated, next(self.seq), s))
        if len(heap) > 2 * samples_on_engine + _SLACK:
            self.heaps[name] = self._compacted(heap, name)

    def lead(self, name: str) -> int | None:
        """The most tokens any sample placed on engine ``name`` has produced; None if it holds none."""
        heap = self.heaps.get(name)
        while heap:
            produced, _, s = heap[0]
            if self.placement.get(s) == name and s.num_generated >= -produced:
                return s.num_generated
            heapq.heappop(heap)
        return None

    def drop(self, name: str) -> None:
        """Engine ``name`` is gone."""
        self.heaps.pop(name, None)

    def _compacted(self, heap: list[tuple[int, int, Sample]], name: str) -> list[tuple[int, int, Sample]]:
        latest: dict[Sample, tuple[int, int, Sample]] = {}
        for entry in heap:
            s = entry[2]
            if self.placement.get(s) == name and (s not in latest or entry[:2] < latest[s][:2]):
                latest[s] = entry
        out = list(latest.values())
        heapq.heapify(out)
        return out
