"""Equal-count balanced partitions: the batch itself split over data-parallel ranks.

What verl's ``_balance_batch`` does with ``get_seqlen_balanced_partitions(..., equal_size=True)``: every
rank gets the same number of samples (the trainer splits the reordered batch into equal slices) and about
the same load. Karmarkar-Karp with equal sizes, re-implemented: sort the weights, cut them into runs of
``num_parts`` consecutive values, each run one state whose parts hold one sample each; then merge states
as the token-quota partition does (largest spread first, the heaviest part of one joining the lightest of
the other). Every part gains exactly one sample per run, and a merge's spread is at most the larger of
the two merged, so the final max - min load is at most the widest run (largest minus smallest weight of
one run), which is at most the largest weight.

Plain Python: there are n / num_parts states, each merge costs O(num_parts log num_parts).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from pdsr_sdk.batching.partition import (
    BALANCE_MODES,
    DEFAULT_ATTENTION_COEF,
    _int_option,
    as_lengths,
    balance_weights,
)
from pdsr_sdk.errors import ConfigValueError, DataValueError


def equal_size_labels(weights: np.ndarray, k: int) -> np.ndarray:
    """Part of each sample (0..k-1, part 0 the heaviest) under equal-size Karmarkar-Karp; len(weights) % k == 0."""
    n = weights.shape[0]
    order = np.argsort(weights, kind="stable").tolist()
    heap = []
    for seq, start in enumerate(range(0, n, k)):
        run = order[start:start + k]
        parts = [[int(weights[i]), [i]] for i in reversed(run)]  # heaviest first
        heapq.heappush(heap, (-(parts[0][0] - parts[-1][0]), seq, parts))
    seq = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        for j in range(k):
            a[j][0] += b[k - 1 - j][0]
            a[j][1].extend(b[k - 1 - j][1])
        a.sort(key=lambda part: -part[0])  # stable: ties keep their order
        heapq.heappush(heap, (-(a[0][0] - a[-1][0]), seq, a))
        seq += 1
    labels = np.zeros(n, np.int64)
    for j, (_, members) in enumerate(heap[0][2] if heap else []):
        labels[members] = j
    return labels


def partition_equal_size(lengths: Any, num_parts: int, *, balance: str = "tokens",
                         attention_coef: int = DEFAULT_ATTENTION_COEF) -> list[list[int]]:
    """Split samples into ``num_parts`` parts of exactly ``len(lengths) / num_parts`` samples, balanced.

    For spreading one batch over data-parallel ranks (verl's ``_balance_batch``; no token cap: each rank
    then micro-batches its part with :func:`partition_by_tokens` or :func:`partition_on_rank`).

    Args:
        lengths: tokens per sample (list, numpy array or tensor of integers >= 0).
        num_parts: how many parts (the data-parallel size); must divide the number of samples.
        balance: ``"tokens"`` balances token sums; ``"attention"`` balances ``attention_coef * L + L**2``
            per sample (verl's ``calculate_workload`` at the default coefficient).
        attention_coef: the linear-layer weight a in a*L + L**2, about 12 x hidden size.

    Returns:
        ``num_parts`` lists of sample indices, ascending inside a part, heaviest part first. Balancing
        tokens, max - min load is at most the longest sample.

    Raises:
        DataValueError: a bad length, or a sample count that ``num_parts`` does not divide.
        ConfigValueError: a bad ``num_parts``, ``balance`` or ``attention_coef``.
    """
    k = _int_option("num_parts", num_parts, 1)
    if balance not in BALANCE_MODES:
        raise ConfigValueError(f"balance: expected one of {', '.join(BALANCE_MODES)}, got {balance!r}")
    coef = _int_option("attention_coef", attention_coef, 0)
    arr = as_lengths(lengths)
    n = arr.shape[0]
    if n % k:
        raise DataValueError(f"lengths: {n} samples do not split into num_parts={k} equal parts "
                             f"({n} % {k} = {n % k}); drop or add samples, or pick a num_parts that divides {n}")
    labels = equal_size_labels(balance_weights(arr, balance, coef), k)
    order = np.argsort(labels, kind="stable")
    return [part.tolist() for part in np.split(order, k)]
