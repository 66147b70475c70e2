"""Benchmark: micro-batch count and balance of partition_by_tokens against the rules trainers use.

    .venv/bin/python bench/micro_batching_rules.py [--sequences 256] [--seeds 101 102 103 104 105]

Sequence lengths (prompt + response) of two members of the workload family: ``recorded-math-2048``
(SmolLM2 on MATH, responses up to 2,048) under a cap of 16,384 tokens and ``kv-bound`` (long tail,
543..33k tokens) under 36,864. For each seed, one rank's ``--sequences`` are split by:

- verl's rule: ceil(total / cap) micro-batches, Karmarkar-Karp on the workload 24576 L + L**2, no check
  of the result against the cap (``rearrange_micro_batches``; emulated with pdsr's own KK kernel);
- OpenRLHF's rule: as many micro-batches as first fit in input order needs, KK on tokens, no check
  (``get_minimum_num_micro_batch_size`` then ``get_seqlen_balanced_partitions``; emulated likewise);
- first-fit decreasing (the packing reference, written here);
- ``partition_by_tokens`` balancing tokens, and balancing the attention cost as verl does.

Printed per rule: micro-batches, max / min tokens per micro-batch and micro-batches over the cap
(median [min, max] over the seeds).
"""

from __future__ import annotations

import argparse
import math
import statistics

import numpy as np

CASES = [("recorded-math-2048", 16384), ("kv-bound", 36864)]


def sequence_lengths(member: str, n: int, seed: int) -> np.ndarray:
    from pdsr_sdk.traces.family import WORKLOADS

    trace = WORKLOADS.get(member).trace(groups=max(1, -(-n // 8)), seed=seed)
    per_prompt = len(trace.lengths) // len(trace.prompt_lens)
    lengths = np.asarray(trace.lengths) + np.repeat(np.asarray(trace.prompt_lens), per_prompt)
    return lengths[:n].astype(np.int64)


def groups_of(labels: np.ndarray, k: int) -> list[np.ndarray]:
    return [np.flatnonzero(labels == j) for j in range(k)]


def first_fit(lengths, cap: int, order) -> list[list[int]]:
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for j, free in enumerate(room):
            if free >= lengths[i]:
                bins[j].append(i)
                room[j] -= int(lengths[i])
                break
        else:
            bins.append([i])
            room.append(cap - int(lengths[i]))
    return bins


def rules(lengths: np.ndarray, cap: int) -> dict[str, list]:
    from pdsr_sdk.batching import partition_by_tokens
    from pdsr_sdk.batching.partition import kk_labels

    n = len(lengths)
    k_verl = min(n, math.ceil(int(lengths.sum()) / cap))
    k_openrlhf = len(first_fit(lengths, cap, range(n)))
    return {
        "verl (KK workload, ceil(total/cap))": groups_of(kk_labels(24576 * lengths + lengths ** 2, k_verl), k_verl),
        "OpenRLHF (KK tokens, first-fit count)": groups_of(kk_labels(lengths, k_openrlhf), k_openrlhf),
        "first-fit decreasing": first_fit(lengths, cap, np.argsort(-lengths, kind="stable")),
        "pdsr balance=tokens": partition_by_tokens(lengths, cap),
        "pdsr balance=attention": partition_by_tokens(lengths, cap, balance="attention"),
    }


def spread(values, fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} [{format(min(values), fmt)}, {format(max(values), fmt)}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=256, help="sequences on one rank (default 256)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[101, 102, 103, 104, 105],
                        help="trace seeds (default 101-105)")
    args = parser.parse_args()
    if args.sequences < 1:
        parser.error(f"--sequences: must be at least 1, got {args.sequences}")
    for member, cap in CASES:
        table: dict[str, dict[str, list]] = {}
        for seed in args.seeds:
            lengths = sequence_lengths(member, args.sequences, seed)
            for name, parts in rules(lengths, cap).items():
                loads = [int(lengths[list(p)].sum()) for p in parts]
                row = table.setdefault(name, {"count": [], "ratio": [], "over": []})
                row["count"].append(len(parts))
                row["ratio"].append(max(loads) / min(loads))
                row["over"].append(sum(load > cap for load in loads))
        print(f"\n{member}: {args.sequences} sequences, cap {cap}, seeds {', '.join(map(str, args.seeds))}")
        print(f"  {'rule':40s} {'micro-batches':>18s} {'max / min tokens':>26s} {'over the cap':>14s}")
        for name, row in table.items():
            print(f"  {name:40s} {spread(row['count'], 'd'):>18s} {spread(row['ratio'], '.3f'):>26s} "
                  f"{spread(row['over'], 'd'):>14s}")


if __name__ == "__main__":
    main()
