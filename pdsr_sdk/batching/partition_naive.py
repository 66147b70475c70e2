"""Naive twin of the count search in :func:`pdsr_sdk.batching.partition.partition_lengths`.

The search as it was before the fast one: Karmarkar-Karp at every count k0, k0 + d, k0 + 2d, ... until
its heaviest micro-batch fits the cap or first-fit decreasing (a plain Python loop here) packs into k.
Obviously the first such count, and slow where the cap is near the longest sample (one full KK run per
count: 310 of them for 16,384 lengths under 1.1x the longest of ``recorded-math-2048``). Tests and
``bench/partition.py`` hold the fast search to it: the same count where KK's fit is monotone in the
count, never a larger one on the inputs they draw. :func:`rebalance_naive` is the plain loop behind
:func:`pdsr_sdk.batching.rebalance.rebalance` (every sample scanned for each move).
"""

from __future__ import annotations

import numpy as np

from pdsr_sdk.batching.partition import (
    _fill_empty_parts,
    _labels_to_partitions,
    kk_labels,
    packing_lower_bound,
    validated_weights,
)
from pdsr_sdk.errors import DataValueError


def ffd_labels_naive(lengths: np.ndarray, cap: int) -> tuple[np.ndarray, int]:
    """First-fit-decreasing packing with unlimited bins: (bin of each sample, bins used)."""
    n = lengths.shape[0]
    order = np.argsort(-lengths, kind="stable")
    room = np.full(max(n, 1), cap, np.int64)
    labels = np.empty(n, np.int64)
    used = 0
    for i in order:
        length = lengths[i]
        j = int(np.argmax(room[: used + 1] >= length))  # bin `used` is fresh and always fits
        room[j] -= length
        labels[i] = j
        used = max(used, j + 1)
    return labels, used


def rebalance_naive(labels: np.ndarray, weights: np.ndarray, lengths: np.ndarray, k: int, cap: int) -> np.ndarray:
    """The rebalance of :func:`pdsr_sdk.batching.rebalance.rebalance` as a plain loop over every sample per move.

    Each move: the lightest part (smallest index among equals); per part, its sample of weight
    0 < w < gap (gap: its load less the lightest's) that keeps the lightest within the cap and is closest
    to halving the gap (smallest index among equals); of the parts with one, the heaviest (smallest index
    among equals) gives it to the lightest. Ends when no part has such a sample.
    """
    labels = np.array(labels, np.int64)
    load = np.zeros(k, np.int64)  # exact: attention weights reach 2**60, past float64's integers
    tokens = np.zeros(k, np.int64)
    np.add.at(load, labels, weights)
    np.add.at(tokens, labels, lengths)
    while True:
        light = int(np.argmin(load))
        best = [-1] * k
        score = [0] * k
        for i in range(labels.shape[0]):
            h = int(labels[i])
            gap = int(load[h] - load[light])
            w = int(weights[i])
            if 0 < w < gap and tokens[light] + lengths[i] <= cap:
                s = abs(2 * w - gap)
                if best[h] < 0 or s < score[h]:
                    best[h] = i
                    score[h] = s
        donors = [h for h in range(k) if best[h] >= 0]
        if not donors:
            return labels
        heavy = max(donors, key=lambda h: (load[h], -h))
        i = best[heavy]
        labels[i] = light
        load[heavy] -= weights[i]
        load[light] += weights[i]
        tokens[heavy] -= lengths[i]
        tokens[light] += lengths[i]


def partition_lengths_naive(lengths: np.ndarray, cap: int, *, min_micro_batches: int, divisible_by: int,
                            balance: str, attention_coef: int, allow_empty: bool) -> list[list[int]]:
    """What :func:`partition_lengths` returned with the linear search (same arguments, same errors)."""
    n = lengths.shape[0]
    d = divisible_by
    if n == 0 and not allow_empty:
        return []
    weights = validated_weights(lengths, cap, balance, attention_coef)
    bound = packing_lower_bound(lengths, cap)
    k = -(-max(bound, min_micro_batches) // d) * d
    ffd = None
    while True:
        if k > n and not allow_empty:
            raise DataValueError(f"lengths: {n} samples cannot fill {k} micro-batches")
        if k >= n:
            labels = np.arange(n, dtype=np.int64)
        else:
            labels = kk_labels(weights, k) if k > 1 else np.zeros(n, np.int64)
        if n == 0 or int(np.bincount(labels, weights=lengths, minlength=k).max()) <= cap:
            break
        if ffd is None:
            ffd = ffd_labels_naive(lengths, cap)
        if k >= ffd[1]:
            from pdsr_sdk.batching.rebalance import rebalance

            labels = rebalance(_fill_empty_parts(ffd[0], lengths, k), weights, lengths, k, cap)
            break
        k += d
    return _labels_to_partitions(labels, weights, k)
