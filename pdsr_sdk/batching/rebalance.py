"""Evening out a packing that keeps the token cap (the first-fit-decreasing fallback of ``partition_lengths``).

Imports numba at module level: import this module lazily (``partition.py`` does).

First-fit decreasing fills micro-batches to the cap and leaves the last ones light (max / min tokens 7.45
on 256 long-tailed rollouts under a cap of 1.5 x the longest; 1.09 after this). :func:`rebalance` then moves one sample at a time from a heavier micro-batch
(load H) into the lightest (load l), choosing a sample of weight w with 0 < w < H - l: both new loads lie
strictly between l and H, so the sum of squared loads falls by 2w(H - l - w) > 0 each move and the loop
ends. Each move is taken from the heaviest micro-batch that has such a sample (a lone long sample cannot
move), and is the one closest to halving the gap. Balancing tokens, a move never breaks the cap (both new
loads are below H <= cap), and at the end no sample of the heaviest micro-batch fits the gap to the
lightest: max - min <= the longest sample, the bound Karmarkar-Karp meets. Balancing the attention cost, a
move must also keep the lightest micro-batch's tokens within the cap, so that bound is not promised there.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def _rebalance(labels, weights, lengths, k, cap):
    n = labels.shape[0]
    load = np.zeros(k, np.int64)
    tokens = np.zeros(k, np.int64)
    for i in range(n):
        load[labels[i]] += weights[i]
        tokens[labels[i]] += lengths[i]
    best = np.empty(k, np.int64)  # per part: its sample closest to halving the gap to the lightest, or -1
    score = np.empty(k, np.int64)
    while True:
        light = int(np.argmin(load))
        best[:] = -1
        for i in range(n):
            h = labels[i]
            gap = load[h] - load[light]
            w = weights[i]
            if 0 < w < gap and tokens[light] + lengths[i] <= cap:
                s = abs(2 * w - gap)
                if best[h] < 0 or s < score[h]:
                    best[h] = i
                    score[h] = s
        heavy = -1
        for h in range(k):
            if best[h] >= 0 and (heavy < 0 or load[h] > load[heavy]):
                heavy = h
        if heavy < 0:
            return labels
        i = best[heavy]
        labels[i] = light
        load[heavy] -= weights[i]
        load[light] += weights[i]
        tokens[heavy] -= lengths[i]
        tokens[light] += lengths[i]


def rebalance(labels: np.ndarray, weights: np.ndarray, lengths: np.ndarray, k: int, cap: int) -> np.ndarray:
    """Labels after moving samples from heavier parts into the lightest while the token cap holds.

    ``labels`` (one part in 0..k-1 per sample) must already keep the cap. Parts never become empty (a
    part's last sample of weight w > 0 cannot move: it would need w < w - l). Loads stay in int64 (weights
    reach 2**60).
    """
    return _rebalance(np.array(labels, np.int64), np.ascontiguousarray(weights, np.int64),
                      np.ascontiguousarray(lengths, np.int64), int(k), int(cap))
