"""Benchmark: token-quota partitioning (numba KK) against its pure-Python twin, and tight caps.

    .venv/bin/python bench/partition.py [--runs 7] [--tight-sizes 256 4096 16384] [--old-max-counts 20]

Long-tailed lengths (lognormal, clipped to 16..16384), seeded. For each case
prints: the kernel at a fixed k (median of --runs after warm-up), the full
``partition_by_tokens`` with a cap that calls for exactly k micro-batches,
the naive twin once, the ratios, and the imbalance (max load / ideal load).
First-call cost is reported separately: in this process (numba's on-disk
cache may already hold the kernel) and cold, in a child process with an empty
cache directory.

Tight caps: sequence lengths (prompt + response) of the workload family's ``kv-bound`` and
``recorded-math-2048`` members, --tight-sizes of them, under caps of 1.1x, 1.5x, 2x and 4x the longest and
of 16,384 and 32,768 tokens (where no sample is longer), balancing tokens and attention. Per case: CPU time
of ``partition_by_tokens`` (median of --runs), the count and max / min tokens per micro-batch, and the same
for the linear count search it replaced (:mod:`pdsr_sdk.batching.partition_naive`, one Karmarkar-Karp run per
count from the lower bound up, on the same kernel), with the ratio of the two times. The old search is
timed once, and only where it needs at most --old-max-counts KK runs (the others take minutes).
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


def median_time(fn, runs: int, clock=time.perf_counter) -> float:
    times = []
    for _ in range(runs):
        t = clock()
        fn()
        times.append(clock() - t)
    return statistics.median(times)


def cpu_time(fn, runs: int) -> float:
    return median_time(fn, runs, time.process_time)


def max_over_min(lengths: np.ndarray, parts) -> float:
    loads = [int(lengths[p].sum()) for p in parts if len(p)]
    return max(loads) / max(min(loads), 1)


def tight_caps(sizes: list[int], runs: int, old_max_counts: int) -> None:
    from micro_batching_rules import sequence_lengths

    from pdsr_sdk.batching import partition_by_tokens
    from pdsr_sdk.batching.partition import as_lengths, packing_lower_bound
    from pdsr_sdk.batching.partition_naive import partition_lengths_naive

    print("\ntight caps: CPU ms of partition_by_tokens (median of --runs) -> micro-batches, max / min tokens; "
          "the old linear search once, where it needs at most --old-max-counts KK runs")
    for member in ("kv-bound", "recorded-math-2048"):
        for n in sizes:
            lengths = as_lengths(sequence_lengths(member, n, seed=101))
            longest = int(lengths.max())
            caps = [(f"{f}x", int(f * longest)) for f in (1.1, 1.5, 2.0, 4.0)]
            caps += [(f"{c // 1024}k", c) for c in (16384, 32768) if c >= longest]
            for name, cap in caps:
                for balance in ("tokens", "attention"):
                    parts = partition_by_tokens(lengths, cap, balance=balance)
                    t_new = cpu_time(lambda: partition_by_tokens(lengths, cap, balance=balance), runs)
                    line = (f"  {member:18s} n={n:5d} cap {name:>4s} ({cap:6d}) {balance:9s}: {t_new * 1e3:8.1f} ms "
                            f"-> {len(parts):5d}, max/min {max_over_min(lengths, parts):.3f}")
                    counts = len(parts) - packing_lower_bound(lengths, cap) + 1
                    if counts <= old_max_counts:
                        t = time.process_time()
                        old = partition_lengths_naive(lengths, cap, min_micro_batches=1, divisible_by=1,
                                                      balance=balance, attention_coef=24576, allow_empty=False)
                        t_old = time.process_time() - t
                        line += (f" | old {t_old * 1e3:8.1f} ms -> {len(old):5d}, max/min "
                                 f"{max_over_min(lengths, old):.3f}, ratio old / new {t_old / t_new:6.1f}x")
                    else:
                        line += f" | old skipped ({counts} KK runs)"
                    print(line, flush=True)


def imbalance(lengths: np.ndarray, parts) -> float:
    loads = [int(lengths[p].sum()) for p in parts]
    return max(loads) / (lengths.sum() / len(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="timed runs per fast measurement (median; default 7)")
    parser.add_argument("--tight-sizes", type=int, nargs="*", default=[256, 4096, 16384],
                        help="numbers of sequences for the tight-cap cases (default 256 4096 16384; none skips them)")
    parser.add_argument("--old-max-counts", type=int, default=20,
                        help="time the old linear search where it runs at most this many KK counts (default 20)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs: must be at least 1 (a median needs one run), got {args.runs}")
    if any(n < 1 for n in args.tight_sizes):
        parser.error(f"--tight-sizes: each must be at least 1, got {args.tight_sizes}")

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
    if args.tight_sizes:
        tight_caps(args.tight_sizes, args.runs, args.old_max_counts)


if __name__ == "__main__":
    main()
