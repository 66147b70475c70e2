"""Token-quota micro-batching: the partitions (order restore and data-parallel agreement: test_batching_restore_dp.py).

References are independent of the code under test: the plain-Python
Karmarkar-Karp twin, a plain first-fit-decreasing written here, exhaustive
bin packing for tiny inputs, and outputs computed on the unbatched data.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from partition_checks import check_partition

from pdsr_sdk.batching import (
    DEFAULT_ATTENTION_COEF,
    partition_by_tokens,
)
from pdsr_sdk.batching.kk_naive import kk_labels_naive
from pdsr_sdk.batching.partition import kk_labels, packing_lower_bound
from pdsr_sdk.errors import ConfigError, DataError, PdsrError

SETTINGS = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- references

def part_sums(labels, values, k):
    sums = [0] * k
    for i, j in enumerate(labels):
        sums[j] += int(values[i])
    return sums


def ffd_fits(lengths, cap, k):
    """Plain first-fit decreasing into k bins of size cap."""
    room = [cap] * k
    for length in sorted((int(x) for x in lengths), reverse=True):
        for j in range(k):
            if room[j] >= length:
                room[j] -= length
                break
        else:
            return False
    return True


def weights_of(lengths, balance, coef):
    return [int(x) if balance == "tokens" else coef * int(x) + int(x) * int(x) for x in lengths]


def reference_fits(lengths, cap, k, balance="tokens", coef=DEFAULT_ATTENTION_COEF):
    """KK (naive twin) at k keeps the cap, or FFD packs into k bins."""
    labels = kk_labels_naive(weights_of(lengths, balance, coef), k)
    return max(part_sums(labels, lengths, k)) <= cap or ffd_fits(lengths, cap, k)


def reference_count(lengths, cap, min_mb, d, balance="tokens", coef=DEFAULT_ATTENTION_COEF):
    """The documented rule from ceil(total / cap) upward; None when it needs more than n."""
    n = len(lengths)
    k = max(math.ceil(sum(int(x) for x in lengths) / cap), min_mb)
    k = -(-k // d) * d
    while k <= n:
        if reference_fits(lengths, cap, k, balance, coef):
            return k
        k += d
    return None


def optimal_bins(lengths, cap):
    """Exact minimum number of bins (exhaustive; tiny inputs only)."""
    items = sorted((int(x) for x in lengths), reverse=True)
    best = [len(items)]

    def place(i, bins):
        if len(bins) >= best[0]:
            return
        if i == len(items):
            best[0] = len(bins)
            return
        for j in range(len(bins)):
            if bins[j] + items[i] <= cap:
                bins[j] += items[i]
                place(i + 1, bins)
                bins[j] -= items[i]
        bins.append(items[i])
        place(i + 1, bins)
        bins.pop()

    place(0, [])
    return best[0] if items else 0


@st.composite
def length_cases(draw, max_n=40):
    cap = draw(st.integers(1, 200))
    if draw(st.booleans()):
        hi = draw(st.integers(0, cap))
        lengths = draw(st.lists(st.integers(0, hi), min_size=0, max_size=max_n))
    else:
        # Tight packing: a few values between cap/5 and 2cap/3, where the
        # count often has to grow past the lower bounds.
        values = draw(st.lists(st.integers(cap // 5, 2 * cap // 3), min_size=1, max_size=3))
        lengths = draw(st.lists(st.sampled_from(values), min_size=0, max_size=max_n))
    return lengths, cap


# ------------------------------------------------------------- kernel twin

@pytest.mark.parametrize("n,k,dist", [
    (1, 1, "uniform"), (7, 3, "uniform"), (50, 1, "uniform"), (50, 7, "zeros"), (64, 64, "uniform"),
    (30, 45, "uniform"), (300, 16, "lognormal"), (1000, 32, "lognormal"), (500, 8, "equal"), (200, 5, "few"),
    (1500, 300, "few"), (1200, 200, "equal"), (1000, 250, "lognormal"), (800, 100, "zeros"),
    # k near n / 2: a heavy state takes light ones one at a time (merged into its block in place)
    (1200, 500, "lognormal"), (1400, 600, "few"), (900, 450, "zeros"), (1000, 999, "uniform"),
])
def test_fast_kernel_equals_naive_twin(n, k, dist):
    rng = np.random.default_rng(n * 1000 + k)
    w = {
        "uniform": lambda: rng.integers(0, 1000, n),
        "zeros": lambda: rng.integers(0, 2, n) * rng.integers(0, 5, n),
        "lognormal": lambda: np.clip(rng.lognormal(6, 1.2, n), 0, 30000).astype(np.int64),
        "equal": lambda: np.full(n, 17),
        "few": lambda: rng.choice([3, 50, 400], n),
    }[dist]()
    fast = kk_labels(w, k)
    assert fast.tolist() == kk_labels_naive(w.tolist(), k)


@SETTINGS
@given(st.lists(st.integers(0, 10**6), max_size=60), st.integers(1, 20))
def test_fast_kernel_equals_naive_twin_random(weights, k):
    assert kk_labels(np.array(weights, np.int64), k).tolist() == kk_labels_naive(weights, k)


@SETTINGS
@given(st.lists(st.integers(0, 10**4), min_size=1, max_size=80), st.integers(2, 24))
def test_kk_spread_never_exceeds_largest_weight(weights, k):
    # Merging states with spreads sA, sB gives a spread <= max(sA, sB), so the
    # final max - min load is at most the largest single weight.
    labels = kk_labels(np.array(weights, np.int64), k)
    sums = part_sums(labels, weights, k)
    assert max(sums) - min(sums) <= max(weights)
    nonempty = len(set(labels.tolist()))
    assert nonempty == min(len(weights), k), "no empty part while there are samples to spare"


# ----------------------------------------------------------- partitioning

@SETTINGS
@given(length_cases(), st.integers(1, 6), st.integers(1, 4), st.sampled_from(["tokens", "attention"]))
def test_partition_rule_against_reference(case, min_mb, d, balance):
    lengths, cap = case
    coef = 7
    expected = reference_count(lengths, cap, min_mb, d, balance, coef)
    if not lengths:
        assert partition_by_tokens(lengths, cap, min_micro_batches=min_mb, divisible_by=d) == []
        return
    if expected is None:
        with pytest.raises(DataError, match="cannot fill"):
            partition_by_tokens(lengths, cap, min_micro_batches=min_mb, divisible_by=d,
                                balance=balance, attention_coef=coef)
        return
    parts = partition_by_tokens(lengths, cap, min_micro_batches=min_mb, divisible_by=d,
                                balance=balance, attention_coef=coef)
    k = len(parts)
    assert k == expected
    assert k % d == 0 and k >= min_mb
    check_partition(parts, len(lengths))
    assert all(parts), "no empty micro-batch"
    assert max(sum(lengths[i] for i in p) for p in parts) <= cap
    w = weights_of(lengths, balance, coef)
    loads = [sum(w[i] for i in p) for p in parts]
    assert loads == sorted(loads, reverse=True), "heaviest micro-batch first"
    if balance == "tokens":  # KK's bound, and the first-fit fallback's after rebalancing
        assert loads[0] - loads[-1] <= max(lengths)
    for a, b in zip(parts, parts[1:]):
        if sum(w[i] for i in a) == sum(w[i] for i in b):
            assert a[0] < b[0]
    # When KK keeps the cap, the result is exactly the twin's partition.
    labels = kk_labels_naive(w, k)
    if max(part_sums(labels, lengths, k)) <= cap:
        twin = sorted(sorted(i for i in range(len(w)) if labels[i] == j) for j in range(k))
        assert sorted(parts) == twin


def test_partition_rule_on_tight_instances():
    # Seeded sweep of tight packings (a few values between cap/5 and 2cap/3):
    # the count must follow the rule also when it grows past the bounds.
    rng = np.random.default_rng(4)
    grew = 0
    for _ in range(300):
        cap = int(rng.integers(20, 100))
        lengths = rng.choice(rng.integers(cap // 5, 2 * cap // 3 + 1, 3), int(rng.integers(4, 30))).tolist()
        d = int(rng.integers(1, 4))
        expected = reference_count(lengths, cap, 1, d)
        if expected is None:
            with pytest.raises(DataError, match="cannot fill"):
                partition_by_tokens(lengths, cap, divisible_by=d)
            continue
        parts = partition_by_tokens(lengths, cap, divisible_by=d)
        assert len(parts) == expected
        loads = [sum(lengths[i] for i in p) for p in parts]
        assert all(parts) and max(loads) <= cap
        assert max(loads) - min(loads) <= max(lengths)
        grew += expected > -(-packing_lower_bound(np.array(lengths), cap) // d) * d
    assert grew >= 10, "the sweep must exercise counts beyond the lower bounds"


@SETTINGS
@given(length_cases(max_n=7))
def test_packing_lower_bound_is_valid(case):
    lengths, cap = case
    assert packing_lower_bound(np.array(lengths, np.int64), cap) <= optimal_bins(lengths, cap)


def test_starts_at_token_bound_when_kk_fits():
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 200, 400)
    cap = 2000
    parts = partition_by_tokens(lengths, cap)
    assert len(parts) == math.ceil(lengths.sum() / cap)
    parts = partition_by_tokens(lengths, cap, divisible_by=4)
    assert len(parts) == -(-math.ceil(lengths.sum() / cap) // 4) * 4
    assert len(partition_by_tokens(lengths, cap, min_micro_batches=50)) == 50


def test_first_fit_fallback_when_kk_breaks_the_cap():
    lengths, cap = [5, 2, 0, 3, 2, 2, 3, 1], 6  # total 18 = 3 x 6: only an exact packing fits
    labels = kk_labels_naive(lengths, 3)
    assert max(part_sums(labels, lengths, 3)) > cap  # KK alone needs a 4th micro-batch
    parts = partition_by_tokens(lengths, cap)
    assert len(parts) == 3
    check_partition(parts, len(lengths))
    assert all(sum(lengths[i] for i in p) == 6 for p in parts)


def test_first_fit_fallback_fills_spare_micro_batches():
    # divisible_by=2 skips 9 (FFD's count) to 10, where KK breaks the cap; the
    # FFD packing then has an empty bin, which gets a sample from a full one.
    lengths = [26, 26, 25, 37, 26, 37, 37, 37, 26, 25, 25, 26, 37, 37, 25, 37, 25, 25, 25, 25, 37, 37]
    cap = 77
    assert max(part_sums(kk_labels_naive(lengths, 10), lengths, 10)) > cap
    assert not ffd_fits(lengths, cap, 8) and ffd_fits(lengths, cap, 9)
    parts = partition_by_tokens(lengths, cap, divisible_by=2)
    assert len(parts) == reference_count(lengths, cap, 1, 2) == 10
    check_partition(parts, len(lengths))
    assert all(parts) and max(sum(lengths[i] for i in p) for p in parts) <= cap


def test_count_grows_past_bounds_when_nothing_fits():
    # Three samples of 4 never share a cap of 10 with a fourth: total says 3, the
    # "longer than cap/3" bound says ceil(7 / 2) = 4 (at most 2 per micro-batch).
    lengths = [4] * 7
    assert packing_lower_bound(np.array(lengths), 10) == 4
    parts = partition_by_tokens(lengths, 10)
    assert len(parts) == 4 and max(len(p) for p in parts) == 2


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 100), min_size=200, max_size=600), st.integers(2000, 20000),
       st.sampled_from([1, 2, 3]))
def test_balance_within_five_percent_for_many_small_samples(lengths, cap, d):
    parts = partition_by_tokens(lengths, cap, divisible_by=d)
    k = len(parts)
    total = sum(lengths)
    ideal = total / k
    # The condition: no sample exceeds 5% of the ideal load. KK's max - min is at
    # most the longest sample, and a first-fit fallback only happens when
    # cap < ideal + longest, so either way the max is within 5% of the ideal.
    assume(max(lengths) <= 0.05 * ideal)
    assert max(sum(lengths[i] for i in p) for p in parts) <= 1.05 * ideal


def attention_cost(lengths, parts, coef):
    return max(sum(coef * int(lengths[i]) + int(lengths[i]) ** 2 for i in p) for p in parts)


@pytest.mark.parametrize("coef", [1024, DEFAULT_ATTENTION_COEF])
def test_attention_balance_lowers_the_max_attention_cost(coef):
    rng = np.random.default_rng(11)
    lengths = np.clip(rng.lognormal(6.5, 1.0, 512), 16, 32768).astype(np.int64)  # long tail
    cap = int(lengths.sum())
    by_tokens = partition_by_tokens(lengths, cap, min_micro_batches=8)
    by_attention = partition_by_tokens(lengths, cap, min_micro_batches=8, balance="attention", attention_coef=coef)
    assert len(by_tokens) == len(by_attention) == 8
    check_partition(by_attention, len(lengths))
    costs = [coef * int(x) + int(x) ** 2 for x in lengths]
    ideal = sum(costs) / 8
    assert attention_cost(lengths, by_attention, coef) <= ideal + max(costs)
    assert attention_cost(lengths, by_attention, coef) < 0.98 * attention_cost(lengths, by_tokens, coef)


def test_attention_keeps_the_token_cap():
    rng = np.random.default_rng(3)
    lengths = np.clip(rng.lognormal(6.5, 1.0, 300), 1, 4000).astype(np.int64)
    cap = 8000
    parts = partition_by_tokens(lengths, cap, balance="attention", attention_coef=0)
    check_partition(parts, len(lengths))
    assert max(int(lengths[p].sum()) for p in parts) <= cap


def test_input_kinds_and_zero_lengths():
    expected = partition_by_tokens([3, 0, 5, 0, 2, 9], 10)
    assert partition_by_tokens(np.array([3, 0, 5, 0, 2, 9], np.int32), 10) == expected
    assert partition_by_tokens((3.0, 0.0, 5.0, 0.0, 2.0, 9.0), 10) == expected
    assert partition_by_tokens([0, 0, 0], 1) == [[0, 1, 2]]
    assert partition_by_tokens([0, 0, 0], 1, min_micro_batches=3) == [[0], [1], [2]]
    assert partition_by_tokens([4], 4) == [[0]]


def test_torch_lengths_accepted():
    torch = pytest.importorskip("torch")
    lengths = [7, 1, 8, 3, 3, 9]
    assert partition_by_tokens(torch.tensor(lengths), 12) == partition_by_tokens(lengths, 12)
    # bfloat16 (numpy has none) was "TypeError: Got unsupported ScalarType BFloat16"
    assert partition_by_tokens(torch.tensor(lengths, dtype=torch.bfloat16), 12) == partition_by_tokens(lengths, 12)


def test_errors_name_what_is_wrong():
    with pytest.raises(DataError, match=r"lengths\[2\] = 11 tokens .*max_tokens_per_micro_batch=10"):
        partition_by_tokens([3, 4, 11, 2], 10)
    with pytest.raises(DataError, match=r"lengths\[1\] = -3: a length must be >= 0"):
        partition_by_tokens([3, -3], 10)
    with pytest.raises(DataError, match=r"lengths\[0\] = 1.5"):
        partition_by_tokens([1.5], 10)
    with pytest.raises(DataError, match="1-D"):
        partition_by_tokens([[1, 2]], 10)
    with pytest.raises(DataError, match="3 samples cannot fill 4 micro-batches"):
        partition_by_tokens([1, 1, 1], 10, min_micro_batches=4)
    with pytest.raises(DataError, match="cannot fill 4"):
        partition_by_tokens([5, 5, 5], 5, divisible_by=2)  # needs 3 -> 4 > 3 samples
    with pytest.raises(ConfigError, match="max_tokens_per_micro_batch"):
        partition_by_tokens([1], 0)
    with pytest.raises(ConfigError, match="divisible_by"):
        partition_by_tokens([1], 4, divisible_by=0)
    with pytest.raises(ConfigError, match="balance"):
        partition_by_tokens([1], 4, balance="flops")
    with pytest.raises(DataError, match="too large"):
        partition_by_tokens([2**31] * 4, 2**40, balance="attention")
    assert issubclass(DataError, PdsrError)


def test_totals_past_int64_are_refused_not_wrapped():
    # These lengths add up to 3.8e19 tokens: an int64 sum wrapped to 1.9e18, and before the check did not see it,
    # every micro-batch came back over the cap (1.2-1.55x).
    lengths = [2911538000480929518, 7203677800192366423, 7946817128418530264, 3572700197647467849,
               4000208211860776721, 3405195132802340845, 977059524860610051, 4375521483169543844,
               2204838546598634969]
    total = sum(lengths)
    with pytest.raises(DataError, match=f"{total} tokens in total, more than supported"):
        partition_by_tokens(lengths, 9135359231321651020)
    with pytest.raises(DataError, match=r"\b18446744073709551616 tokens in total"):
        partition_by_tokens([2**61] * 8, 2**62)  # wrapped to 0


def test_lengths_past_int64_are_named_as_they_were_given():
    # The int64 cast saturated floats and wrapped uint64 before the checks: 'lengths[0] = -9223372036854775808:
    # a length must be >= 0' for 1e20.
    with pytest.raises(DataError, match=r"lengths\[1\] = 1e\+20: too large for a token count"):
        partition_by_tokens([3.0, 1e20], 10)
    with pytest.raises(DataError, match=r"lengths\[0\] = 9223372036854775813: too large"):
        partition_by_tokens(np.array([2**63 + 5], np.uint64), 10)
    with pytest.raises(DataError, match=r"lengths\[0\] = -1e\+20: a length must be >= 0"):
        partition_by_tokens([-1e20], 10)


def test_options_past_int64_are_named():
    # An OverflowError ('Python int too large to convert to C long') from deep inside before.
    with pytest.raises(ConfigError, match=r"max_tokens_per_micro_batch: expected an integer <= 2\*\*63 - 1"):
        partition_by_tokens([1, 2, 3], 2**64)
    with pytest.raises(ConfigError, match="attention_coef: expected an integer <= "):
        partition_by_tokens([0, 0], 10, balance="attention", attention_coef=2**70)
    assert partition_by_tokens([1, 2, 3], 2**63 - 1) == [[0, 1, 2]]
