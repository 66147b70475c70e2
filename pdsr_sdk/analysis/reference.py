"""Naive float64 twins of ``stats``: plain loops written straight from the definitions.

Slow on purpose and independent of the vectorised code (no shared helpers),
so a test comparing the two catches a mistake in either. Where ``stats``
takes an expectation over random tie orders, the ``brute_*`` functions
enumerate every tie order on tiny inputs, the definition itself.
"""

from __future__ import annotations

import itertools
import math


def naive_group_cv(rows: list[list[int]], ddof: int = 1) -> list[float]:
    out = []
    for row in rows:
        n = len(row)
        if n <= ddof:
            out.append(math.nan)
            continue
        mean = sum(float(v) for v in row) / n
        var = sum((float(v) - mean) ** 2 for v in row) / (n - ddof)
        out.append(0.0 if mean == 0 else math.sqrt(var) / mean)
    return out


def naive_average_ranks(values: list[float]) -> list[float]:
    ranks = []
    for v in values:
        less = sum(1 for w in values if w < v)
        equal = sum(1 for w in values if w == v)
        ranks.append(less + (equal + 1) / 2.0)  # average of ranks less+1 .. less+equal
    return ranks


def naive_pearson(a: list[float], b: list[float]) -> float:
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va = sum((x - ma) ** 2 for x in a)
    vb = sum((y - mb) ** 2 for y in b)
    if va == 0 or vb == 0:
        return math.nan
    return cov / math.sqrt(va * vb)


def naive_spearman_vs_probe(rows: list[list[int]]) -> list[float]:
    n = len(rows[0])
    probe = naive_average_ranks([float(r[0]) for r in rows])
    return [naive_pearson(probe, naive_average_ranks([float(r[j]) for r in rows])) for j in range(1, n)]


def naive_top_k_probs(values: list[int], k: int) -> list[float]:
    """P(index i is among the k largest) when ties are broken uniformly at random.

    Index i's tie block is shuffled: i lands on each of its block's positions
    with equal probability, and is in when that position is within the first k.
    """
    probs = []
    for v in values:
        above = sum(1 for w in values if w > v)
        tied = sum(1 for w in values if w == v)
        inside = sum(1 for pos in range(1, tied + 1) if above + pos <= k)
        probs.append(inside / tied)
    return probs


def naive_k(num_groups: int, frac: float) -> int:
    # floor(frac * G) with decimal-exact rounding (0.7 * 90 is 63, not 62.99999999999999); 0 is kept
    return int(round(frac * num_groups, 9))


def naive_top_k_recall(rows: list[list[int]], k_frac: float) -> list[float]:
    k = naive_k(len(rows), k_frac)
    if k == 0:
        return [math.nan] * (len(rows[0]) - 1)
    p0 = naive_top_k_probs([r[0] for r in rows], k)
    out = []
    for j in range(1, len(rows[0])):
        pj = naive_top_k_probs([r[j] for r in rows], k)
        out.append(sum(a * b for a, b in zip(p0, pj)) / k)  # independent tie orders: E|A ∩ B| = sum P(i in A) P(i in B)
    return out


def naive_safe_rate(rows: list[list[int]], k_frac: float, safe_frac: float) -> list[float]:
    k, ks = naive_k(len(rows), k_frac), naive_k(len(rows), safe_frac)
    if k == 0 or ks == 0:
        return [math.nan] * (len(rows[0]) - 1)
    p0 = naive_top_k_probs([r[0] for r in rows], k)
    out = []
    for j in range(1, len(rows[0])):
        pj = naive_top_k_probs([r[j] for r in rows], ks)
        out.append(sum(a * b for a, b in zip(p0, pj)) / k)
    return out


def _tie_orders(n: int):
    """Every order of n indices, as a rank per index (used to break ties)."""
    return [dict((i, r) for r, i in enumerate(perm)) for perm in itertools.permutations(range(n))]


def _top_k_set(values: list[int], k: int, rank: dict) -> frozenset:
    return frozenset(sorted(range(len(values)), key=lambda i: (-values[i], rank[i]))[:k])


def brute_top_k_overlap(rows: list[list[int]], k_pred: int, k_other: int) -> list[float]:
    """E|top-k_pred of column 0 ∩ top-k_other of column j| / k_pred, averaged over every pair of tie orders.

    Enumerates all G! orders of each column (independently): tiny inputs only (G <= 6).
    """
    g = len(rows)
    orders = _tie_orders(g)
    col0 = [r[0] for r in rows]
    sets0 = [_top_k_set(col0, k_pred, o) for o in orders]
    out = []
    for j in range(1, len(rows[0])):
        colj = [r[j] for r in rows]
        setsj = [_top_k_set(colj, k_other, o) for o in orders]
        total = sum(len(a & b) for a in sets0 for b in setsj)
        out.append(total / (len(orders) ** 2 * k_pred))
    return out


def _longest_task(batch: list[list[int]]) -> tuple[int, list[int], list[int]]:
    """A batch's longest later sample, the groups holding it, and every group's probe."""
    later_max = [max(r[1:]) for r in batch]
    longest = max(later_max)
    return longest, [i for i, m in enumerate(later_max) if m == longest], [r[0] for r in batch]


def brute_batch_capture(rows: list[list[int]], batch_prompts: int, capture_top: int):
    """Per batch (capture probability, E[ratio], E[ratio if missed else 0]) averaged over every probe tie order
    and every choice of the group holding the longest task (tiny batches only)."""
    out = []
    for start in range(0, len(rows), batch_prompts):
        batch = rows[start:start + batch_prompts]
        longest, holders, probes = _longest_task(batch)
        orders = _tie_orders(len(batch))
        hits = ratio = miss_ratio = 0.0
        for o in orders:
            top = _top_k_set(probes, capture_top, o)
            for h in holders:
                r = longest / max(probes[h], 1)
                ratio += r
                if h in top:
                    hits += 1
                else:
                    miss_ratio += r
        events = len(orders) * len(holders)
        out.append((hits / events, ratio / events, miss_ratio / events))
    return out


def naive_false_negatives(rows: list[list[int]], length: int) -> tuple[float, float]:
    groups = hit_groups = samples = hit_samples = 0
    for row in rows:
        if row[0] < length:
            groups += 1
            hits = [v > length for v in row[1:]]
            hit_groups += any(hits)
            samples += len(hits)
            hit_samples += sum(hits)
    return (hit_groups / groups if groups else math.nan, hit_samples / samples if samples else math.nan)


def naive_batch_capture(rows: list[list[int]], batch_prompts: int, capture_top: int):
    """Per batch: (capture probability, E[cost ratio], E[cost ratio if missed else 0]), ties broken at random.

    The longest task is held by one of the groups tied for it, chosen
    uniformly; a holder is in the top capture_top probes with the probability
    that its shuffled tie block puts it there.
    """
    out = []
    for start in range(0, len(rows), batch_prompts):
        batch = rows[start:start + batch_prompts]
        longest, holders, probes = _longest_task(batch)
        in_top = naive_top_k_probs(probes, min(capture_top, len(batch)))
        capture = sum(in_top[h] for h in holders) / len(holders)
        ratios = {h: longest / max(probes[h], 1) for h in holders}
        ratio = sum(ratios.values()) / len(holders)
        miss = sum((1 - in_top[h]) * ratios[h] for h in holders) / len(holders)
        out.append((capture, ratio, miss))
    return out


def naive_dispatch_v25(rows: list[list[int]], batch_prompts: int, offload_fraction: float, cap_multiplier: float):
    """Returns (heavy, fast, fast_broke, wasted_tokens) sample counts and the count of fast prompts that broke."""
    heavy = fast = broke = wasted = prompts_broke = 0
    for start in range(0, len(rows), batch_prompts):
        batch = rows[start:start + batch_prompts]
        b = len(batch)
        n_heavy = min(b, max(1, math.floor(round(offload_fraction * b, 9))))
        order = sorted(range(b), key=lambda i: (-batch[i][0], i))
        heavy_set = set(order[:n_heavy])
        l_cut = batch[order[n_heavy - 1]][0]
        cap = math.floor(round(cap_multiplier * l_cut, 9))
        for i, row in enumerate(batch):
            if i in heavy_set:
                heavy += len(row)
                continue
            any_break = False
            for v in row:
                fast += 1
                if v > cap:
                    broke += 1
                    wasted += cap
                    any_break = True
            prompts_broke += any_break
    return heavy, fast, broke, wasted, prompts_broke
