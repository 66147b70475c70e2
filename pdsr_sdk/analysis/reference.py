"""Naive float64 twins of ``stats``: plain loops written straight from the definitions.

Slow on purpose and independent of the vectorised code (no shared helpers),
so a test comparing the two catches a mistake in either.
"""

from __future__ import annotations

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


def naive_top_k(values: list[int], k: int) -> set[int]:
    """Indices of the k largest values, ties broken by index."""
    return set(sorted(range(len(values)), key=lambda i: (-values[i], i))[:k])


def naive_k(num_groups: int, frac: float) -> int:
    # floor(frac * G) with decimal-exact rounding (0.7 * 90 is 63, not 62.99999999999999)
    return max(1, int(round(frac * num_groups, 9)))


def naive_top_k_recall(rows: list[list[int]], k_frac: float) -> list[float]:
    k = naive_k(len(rows), k_frac)
    top0 = naive_top_k([r[0] for r in rows], k)
    return [len(top0 & naive_top_k([r[j] for r in rows], k)) / k for j in range(1, len(rows[0]))]


def naive_safe_rate(rows: list[list[int]], k_frac: float, safe_frac: float) -> list[float]:
    k, ks = naive_k(len(rows), k_frac), naive_k(len(rows), safe_frac)
    top0 = naive_top_k([r[0] for r in rows], k)
    return [len(top0 & naive_top_k([r[j] for r in rows], ks)) / k for j in range(1, len(rows[0]))]


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
    """Returns (captured flags, cost ratios), one per batch."""
    captured, ratios = [], []
    for start in range(0, len(rows), batch_prompts):
        batch = rows[start:start + batch_prompts]
        later_max = [max(r[1:]) for r in batch]
        longest = max(later_max)
        holders = [i for i, m in enumerate(later_max) if m == longest]
        probes = [r[0] for r in batch]
        top = [i for i in range(len(batch)) if sum(1 for p in probes if p > probes[i]) < capture_top]
        captured.append(any(i in top for i in holders))
        probe = max(probes[i] for i in holders)
        ratios.append(longest / max(probe, 1))
    return captured, ratios


def naive_dispatch_v25(rows: list[list[int]], batch_prompts: int, offload_fraction: float, cap_multiplier: float):
    """Returns (heavy, fast, fast_broke, wasted_tokens) sample counts and the count of fast prompts that broke."""
    heavy = fast = broke = wasted = prompts_broke = 0
    for start in range(0, len(rows), batch_prompts):
        batch = rows[start:start + batch_prompts]
        b = len(batch)
        n_heavy = min(b, math.ceil(round(offload_fraction * b, 9)))
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
