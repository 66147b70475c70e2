"""How well a group's probe predicts its siblings: the correlation of log lengths over a sliding window.

Pure arithmetic, no engines: v3 adds a (probe length, sibling length) pair for each sibling of each
group that completes, and ranks waiting work by the groups' finished lengths only while the
correlation is high enough. Running sums keep each pair O(1); tests hold :meth:`ProbeCorrelation.value`
to a two-pass float64 correlation of the window.
"""

from __future__ import annotations

import math
from collections import deque


class ProbeCorrelation:
    """Pearson correlation of ``log1p(probe length)`` with ``log1p(sibling length)`` over the last ``window``
    pairs."""

    def __init__(self, window: int) -> None:
        self.pairs: deque[tuple[float, float]] = deque(maxlen=window)
        self.sums = [0.0] * 5     # x, y, x^2, y^2, x*y over the window

    def __len__(self) -> int:
        return len(self.pairs)

    def add(self, probe_len: int, length: int) -> None:
        x, y = math.log1p(probe_len), math.log1p(length)
        sx, sy, sxx, syy, sxy = self.sums
        if len(self.pairs) == self.pairs.maxlen:
            ox, oy = self.pairs[0]
            sx, sy, sxx, syy, sxy = sx - ox, sy - oy, sxx - ox * ox, syy - oy * oy, sxy - ox * oy
        self.pairs.append((x, y))
        self.sums = [sx + x, sy + y, sxx + x * x, syy + y * y, sxy + x * y]

    def value(self) -> float:
        """The window's correlation; 0 when either side has no spread (or the window is empty)."""
        n = len(self.pairs)
        if not n:
            return 0.0
        sx, sy, sxx, syy, sxy = self.sums
        vx, vy = sxx - sx * sx / n, syy - sy * sy / n
        return (sxy - sx * sy / n) / math.sqrt(vx * vy) if vx > 0 and vy > 0 else 0.0


def window_correlations(lengths, window: int, min_pairs: int) -> list[float]:
    """The correlation a :class:`ProbeCorrelation` of ``window`` pairs reads after each group of ``lengths`` (a
    G x N matrix, sample 0 the probe) completes in trace order, once it holds ``min_pairs`` pairs: what v3's
    ranking would decide on over the trace (``pdsr analyze``'s verdict)."""
    pairs = ProbeCorrelation(window)
    out = []
    for row in lengths:
        for length in row[1:]:
            pairs.add(int(row[0]), int(length))
        if len(pairs) >= min_pairs:
            out.append(pairs.value())
    return out
