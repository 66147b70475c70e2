"""Whether a runaway restarted for staleness runs away again (v3's tail lane reads it).

v3's tail lane keeps a runaway within a staleness bound, and sends a restarted one back there at once:
it may not be restarted twice. That pays where a restart repeats the runaway, as a length-controlled
replay does. A restart in RL sampling draws a fresh response, which rarely runs away again; there the
restart is cheap and the lane's light engines are capacity lost (`pdsr simulate --steps
--restart-lengths redraw`, docs/benchmarks.md). So the lane asks what the restarts it has seen did.
Plain numbers in and out.
"""

from __future__ import annotations

from collections.abc import Sequence


class RunawayRecurrence:
    """Outcomes of restarted runaways: how many finished, and how many of those ran away again."""

    def __init__(self, min_outcomes: int, share: float) -> None:
        self.min_outcomes = min_outcomes
        self.share = share
        self.outcomes = 0
        self.recurred = 0

    def note(self, length: int, earlier_peak: int, threshold: float) -> None:
        """A restarted sample finished with ``length`` tokens, its earlier generations having reached at most
        ``earlier_peak``: an outcome when that was a runaway (past ``threshold``, the lane's), a recurrence
        when the new one is too."""
        if earlier_peak >= threshold:
            self.outcomes += 1
            self.recurred += length >= threshold

    @property
    def recurs(self) -> bool:
        """True until ``min_outcomes`` are seen (the lane's cost is small next to a runaway restarted into
        the same run), then whether at least ``share`` of them ran away again."""
        return self.outcomes < self.min_outcomes or self.recurred >= self.share * self.outcomes


def earlier_peak(segment_ends: Sequence[tuple[int, int]]) -> int:
    """The most tokens a sample held before its current generation, from its segments' (start token, tokens)
    in order: a generation starts at a segment whose start token is 0 (after a restart)."""
    last = max((i for i, (start, _) in enumerate(segment_ends) if start == 0), default=0)
    return max((start + n for start, n in segment_ends[:last]), default=0)
