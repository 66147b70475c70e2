"""The finished response lengths a policy remembers, and what it reads from them.

Pure bookkeeping, no engines: v3 adds each finished sample's length, re-sorts every so many finishes
(:meth:`LengthHistory.refresh`), and reads its quantiles, the expected remaining tokens of a sample
that has produced so many, and the length past which samples likely run to the response cap. The
reads between refreshes see the sorted snapshot, not the newest finishes (sorting at every finish
cost more than the rest of the policy at scale). Tests hold each read to a plain loop over the
lengths.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque


class LengthHistory:
    """A sliding window of the last ``maxlen`` finished lengths, with a sorted snapshot."""

    def __init__(self, maxlen: int) -> None:
        self.lengths: deque[int] = deque(maxlen=maxlen)
        self.total = 0          # sum of the window
        self.seen = 0           # lengths ever added
        self.sorted: list[int] = []
        self.suffix: list[int] = [0]    # suffix[i] = sum(sorted[i:])

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def full(self) -> bool:
        return len(self.lengths) == self.lengths.maxlen

    def add(self, n: int) -> None:
        if self.full:
            self.total -= self.lengths[0]
        self.lengths.append(n)
        self.total += n
        self.seen += 1

    def mean(self) -> float:
        """Mean of the window (0 while empty)."""
        return self.total / len(self.lengths) if self.lengths else 0.0

    def refresh(self) -> None:
        """Sort the window: the reads below see it as of now."""
        data = self.sorted = sorted(self.lengths)
        self.suffix = list(itertools.accumulate(reversed(data)))[::-1] + [0]

    def quantile(self, q: float) -> float:
        """The sorted snapshot's element at rank ``int(q x n)`` (the last if past it); inf while empty."""
        data = self.sorted
        return float(data[min(len(data) - 1, int(q * len(data)))]) if data else math.inf

    def residual(self, generated: int, cap: int) -> float:
        """Expected tokens still to come for a sample that has produced ``generated``: the mean of the snapshot's
        lengths beyond that, less it (``cap`` less it, at least 1, if none is longer)."""
        data = self.sorted
        i = bisect.bisect_right(data, generated)
        if i == len(data):
            return max(1.0, float(cap - generated))
        return self.suffix[i] / (len(data) - i) - generated

    def cap_runner_threshold(self, cap: int, share: float) -> float:
        """:func:`cap_runner_threshold` of the sorted snapshot."""
        return cap_runner_threshold(self.sorted, cap, share)


def unseen_residual(generated: int, cap: int) -> int:
    """What a sample that has produced ``generated`` is taken to have left when no finished length can tell: as much
    again (in a heavy tail the sample further along is expected to run longer), but never past ``cap``."""
    return max(0, min(generated, cap - generated))


def cap_runner_threshold(lengths: list[int], cap: int, share: float) -> float:
    """The shortest of the sorted finished ``lengths`` past which at least ``share`` of the samples ran to
    ``cap`` (a sample that has produced more is then likely to run to the cap); inf if none reached it, or if
    every one did (no finished length short of the cap to name)."""
    n = len(lengths)
    n_cap = n - bisect.bisect_left(lengths, cap)
    if not n_cap or n_cap == n:
        return math.inf
    # the samples longer than lengths[k - 1] number at most n - k; at most n_cap / share of them may be longer
    k = max(1, math.ceil(n - n_cap / share - 1e-9))
    return float(lengths[k - 1])
