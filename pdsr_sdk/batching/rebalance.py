"""The first-fit-decreasing fallback of ``partition_lengths``: the packing, and evening it out under the token cap.

Imports numba at module level: import this module lazily (``partition.py`` does).

:func:`ffd_labels` finds each sample's first bin with room through a tree of the bins' largest room, O(n log n)
(the plain loop, :func:`pdsr_sdk.batching.partition_naive.ffd_labels_naive`, scans the bins: 59-66 ms CPU on
16,384 kv-bound lengths under 1.1x-2x the longest, where this takes 3 ms).

First-fit decreasing fills micro-batches to the cap and leaves the last ones light (max / min tokens 7.45
on 256 long-tailed rollouts under a cap of 1.5 x the longest; 1.09 after this). :func:`rebalance` then moves one sample
at a time from a heavier micro-batch (load H) into the lightest (load l), choosing a sample of weight w with 0 < w < H -
l: both new loads lie strictly between l and H, so the sum of squared loads falls by 2w(H - l - w) > 0 each move and the
loop ends. Each move is taken from the heaviest micro-batch that has such a sample (a lone long sample cannot
move), and is the one closest to halving the gap. Balancing tokens, a move never breaks the cap (both new
loads are below H <= cap), and at the end no sample of the heaviest micro-batch fits the gap to the
lightest: max - min <= the longest sample, the bound Karmarkar-Karp meets. Balancing the attention cost, a
move must also keep the lightest micro-batch's tokens within the cap, so that bound is not promised there.

The moves are those of the plain loop (:func:`pdsr_sdk.batching.partition_naive.rebalance_naive`, which scans
every sample for each move), found without that scan: parts are kept in order of load and searched from the
heaviest down, each through its own members, skipping parts that cannot give a sample until their load
changes. 3,236-6,074 moves on 16,384 recorded-math-2048 lengths under 1.1x and 1.5x the longest took
0.2-0.7 s CPU with the scan, 45-70 ms now (the same moves).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def _ffd(lengths, order, cap):
    n = lengths.shape[0]
    size = 1
    while size < max(n, 1):
        size *= 2
    room = np.full(2 * size, -1, np.int64)  # room[size + j]: bin j's room; above: the larger of two children
    room[size:size + max(n, 1)] = cap
    for node in range(size - 1, 0, -1):
        room[node] = max(room[2 * node], room[2 * node + 1])
    labels = np.empty(n, np.int64)
    used = 0
    for i in order:
        length = lengths[i]
        node = 1
        while node < size:  # the leftmost bin with room: a fresh bin (room cap >= length) always exists
            node = 2 * node if room[2 * node] >= length else 2 * node + 1
        j = node - size
        room[node] -= length
        node //= 2
        while node >= 1:
            room[node] = max(room[2 * node], room[2 * node + 1])
            node //= 2
        labels[i] = j
        used = max(used, j + 1)
    return labels, used


def ffd_labels(lengths: np.ndarray, cap: int) -> tuple[np.ndarray, int]:
    """First-fit-decreasing packing with unlimited bins: (bin of each sample, bins used).

    With k bins FFD places every sample exactly as here as long as it needs
    no bin beyond k, so it fits in k bins iff ``bins used <= k``. Every length must be <= cap.
    """
    lengths = np.ascontiguousarray(lengths, np.int64)
    labels, used = _ffd(lengths, np.argsort(-lengths, kind="stable"), int(cap))
    return labels, int(used)


@numba.njit(cache=True, inline="always")
def _before(load, a, b):
    # Part a comes before part b in the order the donor is looked for in: heavier first, then smaller index.
    return load[a] > load[b] or (load[a] == load[b] and a < b)


@numba.njit(cache=True)
def _reposition(rank, pos, load, h, k):
    """Move part h to its place in ``rank`` (parts by descending load, ties by index) after its load changed."""
    p = pos[h]
    while p > 0 and _before(load, h, rank[p - 1]):
        rank[p] = rank[p - 1]
        pos[rank[p]] = p
        p -= 1
    while p + 1 < k and _before(load, rank[p + 1], h):
        rank[p] = rank[p + 1]
        pos[rank[p]] = p
        p += 1
    rank[p] = h
    pos[h] = p


@numba.njit(cache=True)
def _rebalance(labels, weights, lengths, k, cap):
    n = labels.shape[0]
    load = np.zeros(k, np.int64)
    tokens = np.zeros(k, np.int64)
    count = np.zeros(k, np.int64)
    head = np.full(k, -1, np.int64)  # each part's members: a doubly linked list
    nxt = np.full(n, -1, np.int64)
    prv = np.full(n, -1, np.int64)
    for i in range(n - 1, -1, -1):
        h = labels[i]
        load[h] += weights[i]
        tokens[h] += lengths[i]
        count[h] += 1
        if head[h] >= 0:
            prv[head[h]] = i
        nxt[i] = head[h]
        head[h] = i
    rank = np.argsort(-load, kind="mergesort")  # stable: ties by index
    pos = np.empty(k, np.int64)
    for p in range(k):
        pos[rank[p]] = p
    # A part none of whose samples has 0 < w < gap stays so until its load changes: the lightest load only
    # rises (both new loads of a move lie above it), so every other part's gap only shrinks.
    dead = np.zeros(k, np.bool_)
    while True:
        lowest = load[rank[k - 1]]  # the lightest part: the first of the lightest (smallest index, as argmin)
        lo = 0
        hi = k - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if load[rank[mid]] > lowest:
                lo = mid + 1
            else:
                hi = mid
        light = rank[lo]
        heavy = -1
        best = -1
        score = 0
        for p in range(k):  # the heaviest part with a sample that may move, as the scan over all samples chose
            h = rank[p]
            gap = load[h] - lowest
            if gap <= 1:
                break
            if dead[h] or count[h] < 2:  # a lone sample never moves (it would need w < w - lowest)
                continue
            alive = False
            i = head[h]
            while i >= 0:
                w = weights[i]
                if 0 < w < gap:
                    alive = True
                    if tokens[light] + lengths[i] <= cap:
                        s = abs(2 * w - gap)
                        if best < 0 or s < score or (s == score and i < best):
                            best = i
                            score = s
                i = nxt[i]
            dead[h] = not alive
            if best >= 0:
                heavy = h
                break
        if heavy < 0:
            return labels
        i = best
        if prv[i] >= 0:
            nxt[prv[i]] = nxt[i]
        else:
            head[heavy] = nxt[i]
        if nxt[i] >= 0:
            prv[nxt[i]] = prv[i]
        prv[i] = -1
        nxt[i] = head[light]
        if head[light] >= 0:
            prv[head[light]] = i
        head[light] = i
        labels[i] = light
        load[heavy] -= weights[i]
        load[light] += weights[i]
        tokens[heavy] -= lengths[i]
        tokens[light] += lengths[i]
        count[heavy] -= 1
        count[light] += 1
        dead[heavy] = False
        dead[light] = False
        _reposition(rank, pos, load, heavy, k)
        _reposition(rank, pos, load, light, k)


def rebalance(labels: np.ndarray, weights: np.ndarray, lengths: np.ndarray, k: int, cap: int) -> np.ndarray:
    """Labels after moving samples from heavier parts into the lightest while the token cap holds.

    ``labels`` (one part in 0..k-1 per sample) must already keep the cap. Parts never become empty (a
    part's last sample of weight w > 0 cannot move: it would need w < w - l). Loads stay in int64 (weights
    reach 2**60).
    """
    return _rebalance(np.array(labels, np.int64), np.ascontiguousarray(weights, np.int64),
                      np.ascontiguousarray(lengths, np.int64), int(k), int(cap))
