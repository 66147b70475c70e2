"""Whether a running sample of a stream can still finish within its staleness window (v3's early restarts).

Under a staleness bound a group must be consumed before its oldest tokens grow too stale; a sample still
running when the step that is its group's last chance ends is restarted then, and its finished siblings
with it (their tokens are as old). A runaway that cannot reach its end within that last step is better
restarted at the step's start: the siblings keep their tokens, and the fresh draw mostly finishes in time.
v3 asks two things at each step's end, read here from plain numbers over the last few steps:

- how many tokens a sample makes in one step at the load the stream runs at (``rate``): a high quantile
  of what the samples running across the whole last step made;
- the chance that a sample that has produced ``generated`` tokens ends within ``tokens`` more
  (:meth:`FinishOdds.chance`): among the lengths that finished past ``generated``, the share that ended by
  ``generated + tokens``, where a sample restarted with more than ``generated`` tokens counts as longer
  (censored: under a staleness bound most runaways never finish, so the finished lengths alone would
  hide them), and so does a sample still running with more than ``generated`` at the last step end (early in
  a stream only lengths shorter than the time it has run can have finished: without the running ones a
  runaway whose like has not ended yet would look certain to end). Finished and restarted samples are
  counted over the same last ``steps`` steps; the running ones as they were at the last step end.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Hashable, Iterable


class FinishOdds:
    """Per-step progress of running samples, and the lengths that finished or were restarted in the last steps."""

    def __init__(self, steps: int, quantile: float) -> None:
        self.quantile = quantile
        self.window: deque[tuple[list[int], list[int]]] = deque(maxlen=steps)   # per step: finished, restarted
        self.finished_sorted: list[int] = []
        self.censored_sorted: list[int] = []
        self.running_sorted: list[int] = []   # what each sample still running at the last step end had made
        #: tokens a sample made in the last step (None before two step ends were seen)
        self.rate: int | None = None
        self._last: dict[Hashable, tuple[int, int, int]] = {}   # key -> (restarts, generated, wasted) then

    def step_end(self, samples: Iterable[tuple[Hashable, int, int, bool, int]], finished: Iterable[int]) -> None:
        """A step ended. ``samples``: (key, restarts, generated, finished, wasted tokens so far) of every sample
        of the groups going on; ``finished``: the lengths that finished during the step. A sample running at the
        last step end and restarted since adds the tokens it threw away to the censored lengths; one running
        then and now, in the same generation, adds what it made to the rate. Each sample running now is known
        to be longer than what it has made."""
        made = []
        censored = []
        now: dict[Hashable, tuple[int, int, int]] = {}
        for key, restarts, generated, done, wasted in samples:
            last = self._last.get(key)
            if last is not None and restarts > last[0] and wasted > last[2]:
                censored.append(wasted - last[2])
            if not done:
                now[key] = (restarts, generated, wasted)
                if last is not None and restarts == last[0]:
                    made.append(generated - last[1])
        self._last = now
        self.running_sorted = sorted(generated for _, generated, _ in now.values())
        self.window.append((list(finished), censored))
        self.finished_sorted = sorted(n for f, _ in self.window for n in f)
        self.censored_sorted = sorted(n for _, c in self.window for n in c)
        if made:
            made.sort()
            self.rate = made[min(len(made) - 1, int(self.quantile * len(made)))]

    def chance(self, generated: int, tokens: float) -> float:
        """The chance that a sample that has produced ``generated`` tokens ends within ``tokens`` more: the
        finished lengths in (generated, generated + tokens] over those past ``generated``, the censored lengths
        past it and the running samples past it (0 when none is past it: nothing seen that long ever finished)."""
        fin, cen, run = self.finished_sorted, self.censored_sorted, self.running_sorted
        i = bisect.bisect_right(fin, generated)
        ends = bisect.bisect_right(fin, generated + tokens) - i
        longer = (len(fin) - i + len(cen) - bisect.bisect_right(cen, generated)
                  + len(run) - bisect.bisect_right(run, generated))
        return ends / longer if longer else 0.0
