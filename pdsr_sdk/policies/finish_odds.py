"""Whether a running sample of a stream can still finish within its staleness window (v3's early restarts).

Under a staleness bound a group must be consumed before its oldest tokens grow too stale; a sample still
running when the step that is its group's last chance ends is restarted then, and its finished siblings
with it (their tokens are as old). A runaway that cannot reach its end within that last step is better
restarted at the step's start: the siblings keep their tokens, and the fresh draw mostly finishes in time.
v3 asks two things at each step's end, read here from plain numbers:

- how many tokens a sample makes in one step at the load the stream runs at (``rate``): a high quantile
  of what the samples running across the whole last step made;
- the chance that a sample that has produced ``generated`` tokens ends within ``tokens`` more
  (:meth:`FinishOdds.chance`): among the finished lengths past ``generated``, the share that ends by
  ``generated + tokens``, where the samples restarted earlier count as longer than the peak they reached
  (censored: under a staleness bound most runaways never finish, so the finished lengths alone would
  hide them).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Hashable, Iterable


class FinishOdds:
    """Per-step progress of running samples and the lengths restarted samples had reached."""

    def __init__(self, maxlen: int, quantile: float) -> None:
        self.quantile = quantile
        self.censored: deque[int] = deque(maxlen=maxlen)
        self.censored_sorted: list[int] = []
        #: tokens a sample made in the last step (None before two step ends were seen)
        self.rate: int | None = None
        self._last: dict[Hashable, tuple[int, int]] = {}   # key -> (restarts, generated) at the last step end

    def step_end(self, samples: Iterable[tuple[Hashable, int, int, bool, int]]) -> None:
        """A step ended. ``samples``: (key, restarts, generated, finished, earlier peak) of every sample of the
        groups going on. A sample restarted since the last step end adds its earlier peak to the censored
        lengths; one running then and now, in the same generation, adds what it made to the rate."""
        made = []
        now: dict[Hashable, tuple[int, int]] = {}
        for key, restarts, generated, finished, peak in samples:
            last = self._last.get(key)
            if last is not None and restarts > last[0] and peak > 0:
                self.censored.append(peak)
            if not finished:
                now[key] = (restarts, generated)
                if last is not None and restarts == last[0]:
                    made.append(generated - last[1])
        self._last = now
        self.censored_sorted = sorted(self.censored)
        if made:
            made.sort()
            self.rate = made[min(len(made) - 1, int(self.quantile * len(made)))]

    def chance(self, generated: int, tokens: float, finished_sorted: list[int]) -> float:
        """The chance that a sample that has produced ``generated`` tokens ends within ``tokens`` more: the
        finished lengths in (generated, generated + tokens] over those past ``generated`` and the censored
        lengths past it (0 when none is past it: nothing seen that long ever finished)."""
        i = bisect.bisect_right(finished_sorted, generated)
        ends = bisect.bisect_right(finished_sorted, generated + tokens) - i
        longer = len(finished_sorted) - i + len(self.censored_sorted) - bisect.bisect_right(self.censored_sorted,
                                                                                            generated)
        return ends / longer if longer else 0.0
