"""Whether a runaway restarted for staleness runs away again (v3's tail lane reads it).

v3's tail lane keeps a runaway within a staleness bound, and sends a restarted one back there at once:
it may not be restarted twice. That pays where a restart repeats the runaway, as a length-controlled
replay does. A restart in RL sampling draws a fresh response, which rarely runs away again; there the
restart is cheap and the lane's light engines are capacity lost (`pdsr simulate --steps
--restart-lengths redraw`, docs/notes/restart-lengths.md). So the lane asks what the restarts it has seen did.
Plain numbers in and out.
"""

from __future__ import annotations

from collections.abc import Sequence


class RunawayRecurrence:
    """Outcomes of restarted runaways: each one's generation after the restart either ran away again
    (it passed the lane threshold once more) or finished short of it."""

    def __init__(self, min_outcomes: int, share: float) -> None:
        self.min_outcomes = min_outcomes
        self.share = share
        self.outcomes = 0
        self.recurred = 0
        self._noted: dict[int, int] = {}    # key -> the restart count whose outcome was noted

    def observe(self, key: int, restarts: int, generated: int, earlier_peak: int, threshold: float, *,
                finished: bool) -> None:
        """A sample (``key``) restarted ``restarts`` times holds ``generated`` tokens now; its earlier
        generations reached at most ``earlier_peak``. It is a restarted runaway when that passed
        ``threshold`` (the lane's); its outcome is known once it passes the threshold again (a recurrence,
        as soon as it does) or finishes short of it. Each generation's outcome counts once."""
        if not restarts or earlier_peak < threshold:
            return
        if self._noted.get(key) != restarts and (generated >= threshold or finished):
            self._noted[key] = restarts
            self.outcomes += 1
            self.recurred += generated >= threshold
        if finished:
            self._noted.pop(key, None)

    @property
    def known(self) -> bool:
        """Whether enough outcomes are in to judge (``min_outcomes``)."""
        return self.outcomes >= self.min_outcomes

    @property
    def recurs(self) -> bool:
        """True until the outcomes are known (the prior: a lane, as a replay needs), then whether at least
        ``share`` of them ran away again."""
        return not self.known or self.recurred >= self.share * self.outcomes


def earlier_peak(segment_ends: Sequence[tuple[int, int]]) -> int:
    """The most tokens a sample held before its current generation, from its segments' (start token, tokens)
    in order: a generation starts at a segment whose start token is 0 (after a restart)."""
    last = max((i for i, (start, _) in enumerate(segment_ends) if start == 0), default=0)
    return max((start + n for start, n in segment_ends[:last]), default=0)
