"""Benchmark: token-quota partitioning (numba KK) against its pure-Python twin.

    .venv/bin/python bench/partition.py [--runs 7]

Long-tailed lengths (lognormal, clipped to 16..16384), seeded. For each case
prints: the kernel at a fixed k (median of --runs after warm-up), the full
``partition_by_tokens`` with a cap that calls for exactly k micro-batches,
the naive twin once, the ratios, and the imbalance (max load / ideal load).
First-call cost is reported separately: in this process (numba's on-disk
cache may already hold the kernel) and cold, in a child process with an empty
cache directory.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CASES = [(4096, 64, 0.050), (16384, 128, 0.500)]  # n, k, target seconds
REFERENCE = {4096: 1.1, 16384: 6.3}  # verl get_seqlen_balanced_partitions, pure Python (seconds, as reported)

COLD = """
import time, numpy as np
t = time.perf_counter()
from pdsr_sdk.batching.partition import kk_labels
kk_labels(np.arange(100, dtype=np.int64), 4)
print(time.perf_counter() - t)
"""


def lengths_for(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(7.0, 1.0, n), 16, 16384).astype(np.int64)


def median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def imbalance(lengths: np.ndarray, parts) -> float:
    loads = [int(lengths[p].sum()) for p in parts]
    return max(loads) / (lengths.sum() / len(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="timed runs per fast measurement (median; default 7)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs: must be at least 1 (a median needs one run), got {args.runs}")

    from pdsr_sdk.batching import partition_by_tokens
    from pdsr_sdk.batching.kk_naive import kk_labels_naive
    from pdsr_sdk.batching.partition import kk_labels

    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", COLD], env=env, capture_output=True, text=True, check=True)
        cold = float(out.stdout.strip())
    t = time.perf_counter()
    kk_labels(np.arange(100, dtype=np.int64), 4)
    first = time.perf_counter() - t
    print(f"first call: {first * 1e3:.0f} ms in this process (numba cache as found), "
          f"{cold:.2f} s cold (empty cache: import + compile)")

    for n, k, target in CASES:
        lengths = lengths_for(n, seed=n)
        total = int(lengths.sum())
        cap = math.ceil(total / k * (1 + 0.5 / k))  # ceil(total / cap) == k
        kk_labels(lengths, k)  # warm-up
        t_kernel = median_time(lambda: kk_labels(lengths, k), args.runs)
        parts = partition_by_tokens(lengths, cap)
        t_full = median_time(lambda: partition_by_tokens(lengths, cap), args.runs)
        t = time.perf_counter()
        naive = kk_labels_naive(lengths.tolist(), k)
        t_naive = time.perf_counter() - t
        same = naive == kk_labels(lengths, k).tolist()
        att = partition_by_tokens(lengths, cap, balance="attention")
        print(f"\nn={n} into k={k} (lognormal(7, 1) clipped 16..16384, total {total} tokens, cap {cap})")
        print(f"  fast kernel, fixed k     : {t_kernel * 1e3:8.1f} ms (median of {args.runs})")
        print(f"  partition_by_tokens      : {t_full * 1e3:8.1f} ms -> {len(parts)} micro-batches, "
              f"imbalance max/ideal {imbalance(lengths, parts):.6f}")
        print(f"  naive Python twin (once) : {t_naive * 1e3:8.1f} ms, identical labels: {same}")
        print(f"  ratio naive / fast       : {t_naive / t_kernel:8.1f}x")
        print(f"  ratio target / full      : {target / t_full:8.1f}x (target {target * 1e3:.0f} ms)")
        print(f"  ratio verl ref / full    : {REFERENCE[n] / t_full:8.1f}x (verl's pure-Python KK, "
              f"{REFERENCE[n]:.1f} s as reported, not measured here)")
        print(f"  attention balance        : {len(att)} micro-batches, token imbalance "
              f"{imbalance(lengths, att):.4f}")


if __name__ == "__main__":
    main()
