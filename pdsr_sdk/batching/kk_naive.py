"""Naive twin of :mod:`kk_kernel`: the same k-way Karmarkar-Karp in plain Python.

Obviously-correct rather than fast: every state is a list of (sum, members)
parts and a merge copies the member lists. Same tie-breaking as the kernel
(heap: larger spread first, then older state; parts re-sorted stably by
(sum, non-empty) descending), so both return identical labels.
"""

from __future__ import annotations

import heapq


def kk_labels_naive(weights, k: int, limit: int | None = None, tokens=None,
                    token_limit: int | None = None) -> list[int] | None:
    """Part label (0..k-1) of each item; part 0 has the largest sum.

    None when a part's sum exceeds ``limit``, or the ``tokens`` of its items (not balanced) add up to more
    than ``token_limit``.
    """
    weights = [int(w) for w in weights]
    n = len(weights)
    if n == 0:
        return []
    heap = []
    for i, w in enumerate(weights):
        parts = [(w, [i])] + [(0, []) for _ in range(k - 1)]
        heapq.heappush(heap, (-(parts[0][0] - parts[-1][0]), i, parts))
    counter = n
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]) for j in range(k)]
        merged = sorted(merged, key=lambda part: (-part[0], -int(bool(part[1]))))
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), counter, merged))
        counter += 1
    if limit is not None and heap[0][2][0][0] > limit:
        return None
    if token_limit is not None and max(sum(int(tokens[i]) for i in members) for _, members in heap[0][2]) > token_limit:
        return None
    labels = [0] * n
    for j, (_, members) in enumerate(heap[0][2]):
        for i in members:
            labels[i] = j
    return labels
