"""The fast count search of partition_by_tokens and its kernels, held to their naive twins.

The twins: the plain-Python Karmarkar-Karp (kk_naive, with the same early stop past a limit), the plain
first-fit-decreasing loop, the rebalance's loop over every sample per move and the linear count search
(partition_naive: KK at every count from the lower bound up). The fast search must give the same count or a
smaller one, and no worse max / min tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from partition_checks import check_partition

from pdsr_sdk.batching import partition_by_tokens
from pdsr_sdk.batching.kk_naive import kk_labels_naive
from pdsr_sdk.batching.partition import as_lengths, kk_labels, packing_lower_bound, partition_lengths
from pdsr_sdk.batching.partition_naive import ffd_labels_naive, partition_lengths_naive, rebalance_naive
from pdsr_sdk.batching.rebalance import ffd_labels, rebalance


def long_tailed(rng, n, kind):
    if kind == "lognormal":
        return np.clip(rng.lognormal(rng.uniform(5, 8), rng.uniform(0.6, 1.4), n), 1, 60000).astype(np.int64)
    if kind == "pareto":
        return (rng.pareto(1.5, n) * 300).astype(np.int64) + 16
    return rng.choice(rng.integers(20, 67, 3), n).astype(np.int64)  # a few lengths: tight packings


@pytest.mark.parametrize("n,k,kind", [
    (1, 1, "lognormal"), (40, 3, "few"), (200, 7, "lognormal"), (300, 64, "pareto"), (500, 120, "few"),
    (800, 300, "lognormal"), (1000, 450, "pareto"),
])
def test_kernel_stops_past_the_limit_exactly_when_the_result_would(n, k, kind):
    # The stop is at the first merged part above the limit; a finished partition's heaviest part is at least
    # every part ever formed, so the kernel says None iff the full run's heaviest part exceeds the limit.
    rng = np.random.default_rng(n + k)
    w = long_tailed(rng, n, kind)
    full = kk_labels_naive(w.tolist(), k)
    assert kk_labels(w, k).tolist() == full  # the in-place merge keeps the twin's labels
    heaviest = int(max(np.bincount(full, weights=w, minlength=k)))
    for limit in (heaviest - 1, heaviest, heaviest + 1, int(w.max()), int(w.sum())):
        fast = kk_labels(w, k, limit)
        if heaviest > limit:   # the twin's answer, checking its finished partition (the twin once, not per limit)
            assert fast is None
        else:
            assert fast.tolist() == full
    assert kk_labels_naive(w.tolist(), k, heaviest - 1) is None   # the twin's own limit check, one limit each way
    assert kk_labels_naive(w.tolist(), k, heaviest) == full


@pytest.mark.parametrize("n,k,kind", [
    (1, 1, "lognormal"), (2, 1, "few"), (40, 3, "few"), (300, 64, "pareto"), (600, 250, "few"),
    (900, 400, "lognormal"), (1200, 500, "pareto"),
])
@pytest.mark.parametrize("coef", [0, 7, 24576])
def test_kernel_stops_past_the_token_limit_exactly_when_the_result_would(n, k, kind, coef):
    # Balancing the attention cost a*L + L**2, the kernel also stops at the first joined part over the token
    # cap (its tokens kept at the part's first member): None iff the full run has a part over it, the same
    # labels otherwise, as the twin that checks the finished partition.
    rng = np.random.default_rng(n + k + coef)
    lengths = long_tailed(rng, n, kind)
    w = lengths * coef + lengths * lengths
    full = kk_labels_naive(w.tolist(), k)
    assert kk_labels(w, k).tolist() == full
    most = int(max(np.bincount(full, weights=lengths, minlength=k)))
    for token_limit in (most - 1, most, most + 1, int(lengths.max()), int(lengths.sum())):
        fast = kk_labels(w, k, None, lengths, token_limit)
        if most > token_limit:   # the twin's answer, checking its finished partition (the twin once, not per limit)
            assert fast is None
        else:
            assert fast.tolist() == full
    small = max(0, most - 1)   # the twin's own limit check, on one limit each way
    assert kk_labels_naive(w.tolist(), k, None, lengths.tolist(), small) is None or most <= small
    assert kk_labels_naive(w.tolist(), k, None, lengths.tolist(), most) == full
    heaviest = int(max(np.bincount(full, weights=w, minlength=k)))
    assert kk_labels(w, k, heaviest - 1, lengths, int(lengths.sum())) is None  # either limit stops it
    assert kk_labels(w, k, heaviest, lengths, most).tolist() == full


@pytest.mark.parametrize("n,kind,cap_over_longest", [
    (1, "lognormal", 1.0), (50, "few", 1.3), (300, "lognormal", 1.1), (1000, "pareto", 2.0), (2000, "few", 4.0),
])
def test_ffd_kernel_equals_the_plain_loop(n, kind, cap_over_longest):
    rng = np.random.default_rng(n)
    lengths = long_tailed(rng, n, kind)
    lengths[rng.integers(0, n, max(1, n // 20))] = 0  # zero-length samples go to the first bin
    cap = max(1, int(cap_over_longest * lengths.max()))
    labels, used = ffd_labels(lengths, cap)
    naive_labels, naive_used = ffd_labels_naive(lengths, cap)
    assert used == naive_used and labels.tolist() == naive_labels.tolist()
    assert np.bincount(labels, weights=lengths).max() <= cap


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["lognormal", "pareto", "few", "short and long"])
@pytest.mark.parametrize("balance", ["tokens", "attention"])
def test_rebalance_equals_the_plain_loop(seed, kind, balance):
    # The rebalance searches parts in order of load and skips those that cannot give a sample; the plain loop
    # scans every sample for each move. Same moves, so the same labels, from first-fit decreasing's packing
    # under caps from the longest sample to 3x it (many moves where the cap is tight), zero-length samples too.
    # Short samples among long ones, balancing attention: the lightest part by weight is often not by tokens,
    # so the cap keeps some samples in place (a part is skipped only for the weights, never for that).
    from pdsr_sdk.batching.partition import _fill_empty_parts, balance_weights

    rng = np.random.default_rng(7 * seed + len(kind))
    mixed = kind == "short and long"
    for _ in range(30 if mixed else 4):
        if mixed:  # small: the cap binds the lightest part when a few long samples weigh most
            n = int(rng.integers(4, 60))
            lengths = np.where(rng.random(n) < rng.uniform(0.1, 0.6), rng.integers(50, 100, n),
                               rng.integers(1, 20, n)).astype(np.int64)
        else:
            n = int(rng.integers(2, 600))
            lengths = long_tailed(rng, n, kind)
            lengths[rng.integers(0, n, n // 10)] = 0
        cap = max(1, int(lengths.max() * rng.uniform(1.0, 2.0 if mixed else 3.0)))
        weights = balance_weights(lengths, balance, int(rng.choice([0, 7, 50 if mixed else 24576])))
        ffd, used = ffd_labels(lengths, cap)
        k = min(n, used + int(rng.integers(0, 3)))  # extra parts start empty, filled as the search does
        start = _fill_empty_parts(ffd, lengths, k)
        fast = rebalance(start, weights, lengths, k, cap)
        assert fast.tolist() == rebalance_naive(start, weights, lengths, k, cap).tolist()
        assert np.bincount(fast, weights=lengths, minlength=k).max() <= cap


def loads_ratio(lengths, parts):
    loads = [int(lengths[p].sum()) for p in parts if p]
    return max(loads) / max(min(loads), 1)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("kind", ["lognormal", "pareto", "few"])
@pytest.mark.parametrize("balance", ["tokens", "attention"])
def test_fast_search_against_the_linear_one(seed, kind, balance):
    # Random long-tailed lengths under caps from the longest sample to 3x it, counts a multiple of 1-3: the
    # fast search's count is the linear search's or smaller, its max / min tokens no worse where they agree.
    rng = np.random.default_rng(1000 * seed + len(kind))
    for _ in range(6):
        n = int(rng.integers(2, 400))
        lengths = long_tailed(rng, n, kind)
        cap = int(lengths.max() * rng.uniform(1.0, 3.0))
        options = dict(min_micro_batches=int(rng.integers(1, 3)), divisible_by=int(rng.choice([1, 2, 3])),
                       balance=balance, attention_coef=int(rng.choice([7, 1024, 24576])), allow_empty=True)
        old = partition_lengths_naive(lengths, cap, **options)
        new = partition_lengths(lengths, cap, **options)
        check_partition(new, n)
        assert max(int(lengths[p].sum()) for p in new) <= cap
        assert len(new) <= len(old)
        if len(new) == len(old):
            assert loads_ratio(lengths, new) <= loads_ratio(lengths, old)


@pytest.mark.parametrize("cap_over_longest", [1.1, 1.5])
def test_fast_search_on_tight_caps_of_the_workload_family(cap_over_longest):
    # 1,024 recorded-math-2048 sequences: under 1.1x the longest the linear search runs KK at 22 counts
    # (the lower bound 419 up to first-fit decreasing's 440), under 1.5x at 4; the fast one, balancing tokens,
    # at 3 (the bound, one below FFD's count, FFD's count), balancing attention at 19 and 4, and gives the
    # same micro-batches.
    from pdsr_sdk.traces.family import WORKLOADS

    trace = WORKLOADS.get("recorded-math-2048").trace(groups=128, seed=101)
    per_prompt = len(trace.lengths) // len(trace.prompt_lens)
    lengths = as_lengths(np.asarray(trace.lengths) + np.repeat(np.asarray(trace.prompt_lens), per_prompt))
    cap = int(cap_over_longest * lengths.max())
    for balance in ("tokens", "attention"):
        old = partition_lengths_naive(lengths, cap, min_micro_batches=1, divisible_by=1, balance=balance,
                                      attention_coef=24576, allow_empty=False)
        assert partition_by_tokens(lengths, cap, balance=balance) == old
    assert len(old) > packing_lower_bound(lengths, cap)
