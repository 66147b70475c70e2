"""Statistics of length traces: hand-computed examples, naive float64 twins, and the report."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys

import numpy as np
import pytest

from pdsr_sdk.analysis import (
    AnalyzeConfig,
    analyze_trace,
    average_ranks,
    batch_capture,
    dispatch_v25,
    false_negatives,
    group_cv,
    offload_count,
    report_notes,
    report_tables,
    safe_rate,
    spearman_vs_probe,
    top_k_count,
    top_k_recall,
    write_plots,
)
from pdsr_sdk.analysis import reference as ref
from pdsr_sdk.analysis.stats import cap_tokens, count_greater_rowwise, greater_equal_counts, top_k_prob
from pdsr_sdk.errors import DataError
from pdsr_sdk.traces import LengthTrace, synth_trace

# 4 groups x 3 samples; column 0 is the probe.
HAND = np.array([
    [10, 12, 30],
    [20, 25, 15],
    [30, 28, 40],
    [40, 50, 20],
])


# -- hand-computed examples -----------------------------------------------------------------

def test_cv_by_hand():
    rows = np.array([[2, 4, 6], [1, 2, 3], [10, 10, 10], [0, 0, 0]])
    # [2,4,6]: mean 4, sample var (4+0+4)/2 = 4 -> std 2 -> 0.5; population var 8/3
    np.testing.assert_allclose(group_cv(rows, ddof=1), [0.5, 0.5, 0.0, 0.0])
    np.testing.assert_allclose(group_cv(rows, ddof=0), [math.sqrt(8 / 3) / 4, math.sqrt(2 / 3) / 2, 0.0, 0.0])
    assert np.isnan(group_cv(np.array([[3], [4]]), ddof=1)).all()


def test_spearman_by_hand():
    # column 1 ranks 1,2,3,4 like the probe -> 1; column 2 ranks 3,1,4,2:
    # sum d^2 = 4+1+1+4 = 10, rho = 1 - 6*10/(4*(16-1)) = 0
    np.testing.assert_allclose(spearman_vs_probe(HAND), [1.0, 0.0], atol=1e-12)


def test_spearman_with_ties_by_hand():
    # probe [1,1,2,3] -> average ranks [1.5,1.5,3,4]; vs [1,2,3,4]:
    # cov 4.5, var 4.5 and 5 -> rho = 4.5 / sqrt(22.5) = sqrt(0.9)
    x = np.array([[1, 1], [1, 2], [2, 3], [3, 4]])
    np.testing.assert_allclose(spearman_vs_probe(x), [math.sqrt(0.9)])
    np.testing.assert_allclose(average_ranks(x[:, 0]), [1.5, 1.5, 3, 4])
    # a constant column has no rank correlation
    assert np.isnan(spearman_vs_probe(np.array([[1, 5], [2, 5], [3, 5]])))[0]


def test_top_k_recall_and_safe_rate_by_hand():
    # k = floor(0.5 * 4) = 2. Top-2 by probe: groups {2, 3}; by sample 1: {2, 3}; by sample 2: {0, 2}
    np.testing.assert_allclose(top_k_recall(HAND, 0.5), [1.0, 0.5])
    # top 25% by probe: {3}; in sample j's top 50%? sample 1 {2,3} yes, sample 2 {0,2} no
    np.testing.assert_allclose(safe_rate(HAND, 0.25, 0.5), [1.0, 0.0])


def test_top_k_prob_splits_a_tied_block_across_the_boundary():
    # three groups tie at 7 for two slots: each is in with probability 2/3, whichever comes first
    x = np.array([[5], [7], [7], [7], [1]])
    np.testing.assert_allclose(top_k_prob(x, 2)[:, 0], [0, 2 / 3, 2 / 3, 2 / 3, 0])
    np.testing.assert_allclose(top_k_prob(x, 4)[:, 0], [1, 1, 1, 1, 0])
    np.testing.assert_allclose(top_k_prob(x, 0)[:, 0], 0)
    assert top_k_prob(x, 3)[:, 0].sum() == pytest.approx(3)
    with pytest.raises(ValueError, match="k must be in 0..5"):
        top_k_prob(x, 6)


def test_ties_no_longer_count_as_agreement():
    # probe and sample 1 tie everywhere: a shared "earlier group first" rule called this 100% recall
    x = np.array([[3, 3], [3, 3], [3, 3], [3, 3], [1, 1]])
    np.testing.assert_allclose(top_k_recall(x, 0.4), [0.5])      # k = 2 of 4 tied groups: E overlap 4 * (1/2)^2 = 1
    np.testing.assert_allclose(safe_rate(x, 0.2, 0.4), [0.5])    # 1 pick of 4 tied, in a top 2 of the 4 tied
    # the group below the tie is never picked; a group above it always is
    y = np.array([[9, 9], [3, 3], [3, 3], [1, 1]])
    np.testing.assert_allclose(top_k_recall(y, 0.5), [(1 + 0.25 + 0.25) / 2])


def test_top_k_count_and_offload_count_round_as_documented():
    assert top_k_count(7424, 0.1) == 742      # the seed's "Top 742"
    assert top_k_count(90, 0.7) == 63         # 0.7 * 90 = 62.99999999999999 in floats: still 63
    assert top_k_count(5, 0.1) == 0           # no group is the top 10% of 5: the statistics are n/a, not raised to 1
    assert top_k_count(10, 0.1) == 1
    assert offload_count(0.2, 16) == 4        # ceil(3.2)
    assert offload_count(0.2, 15) == 3
    assert offload_count(0.55, 100) == 55     # 0.55 * 100 = 55.00000000000001 in floats: still 55
    assert offload_count(0.2, 128) == 26
    assert offload_count(0.01, 3) == 1
    assert offload_count(1.0, 7) == 7


def test_false_negatives_by_hand():
    # probes < 25: groups 0 (10) and 1 (20). Group 0 later [12, 30]: 30 > 25.
    # Group 1 later [25, 15]: 25 is not > 25. -> 1 of 2 groups, 1 of 4 later samples.
    fn = false_negatives(HAND, 25)
    assert (fn.groups_below, fn.groups_exceeding, fn.samples_below, fn.samples_exceeding) == (2, 1, 4, 1)
    assert fn.group_rate == 0.5 and fn.sample_rate == 0.25
    none = false_negatives(HAND, 5)
    assert none.groups_below == 0 and math.isnan(none.group_rate) and math.isnan(none.sample_rate)


def test_batch_capture_by_hand():
    # B=2, top 1. Batch 0 (groups 0,1): longest later sample 30 in group 0, but the top probe is
    # group 1 (20 > 10) -> missed, cost 30/10 = 3. Batch 1 (groups 2,3): longest 50 in group 3,
    # which has the top probe 40 -> captured, cost 50/40.
    cap = batch_capture(HAND, batch_prompts=2, capture_top=1)
    assert cap.capture_prob.tolist() == [0.0, 1.0]
    assert cap.longest.tolist() == [30, 50] and cap.sizes.tolist() == [2, 2]
    np.testing.assert_allclose(cap.cost_ratio, [3.0, 1.25])
    np.testing.assert_allclose(cap.miss_cost, [3.0, 0.0])
    np.testing.assert_allclose(cap.miss_max, [3.0, np.nan])
    assert cap.capture_rate == 0.5 and cap.chance_rate == 0.5
    # top 2 of a batch of 2 captures everything, whatever the probe: no batch is ranked
    top2 = batch_capture(HAND, 2, 2)
    assert (top2.capture_prob == 1).all() and not top2.ranked.any() and math.isnan(top2.capture_rate)


def test_batch_capture_ties_and_short_last_batch():
    x = np.array([
        [5, 9],   # holds the longest (9), probe ranked 2nd
        [8, 9],   # also holds 9, probe ranked 1st -> captured with top 1
        [1, 2],
        [0, 50],  # a last batch of one: always captured; probe 0 counts as 1
    ])
    cap = batch_capture(x, batch_prompts=3, capture_top=1)
    # groups 0 and 1 tie for the longest task: it is either one's, each half the time; only group 1 is top 1
    np.testing.assert_allclose(cap.capture_prob, [0.5, 1.0])
    np.testing.assert_allclose(cap.cost_ratio, [(9 / 5 + 9 / 8) / 2, 50.0])
    np.testing.assert_allclose(cap.miss_cost, [0.5 * 9 / 5, 0.0])
    np.testing.assert_allclose(cap.miss_max, [9 / 5, np.nan])
    # the last batch of one is captured whatever the probe: left out of the rate
    assert cap.ranked.tolist() == [True, False] and cap.capture_rate == 0.5
    # equal probes share the top slot: each is "top 1" half the time
    tie = np.array([[7, 1], [7, 30], [3, 2]])
    assert batch_capture(tie, 3, 1).capture_prob.tolist() == [0.5]


def test_dispatch_v25_by_hand():
    # B=2, offload ceil(0.5*2) = 1 prompt per batch, cap = floor(1.2 * L_cut).
    # Batch 0: heavy = group 1 (probe 20), L_cut 20, cap 24; fast group 0 [10, 12, 30]: 30 breaks.
    # Batch 1: heavy = group 3 (probe 40), L_cut 40, cap 48; fast group 2 [30, 28, 40]: none break.
    d = dispatch_v25(HAND, batch_prompts=2, offload_fraction=0.5, cap_multiplier=1.2)
    assert (d.batches, d.samples, d.heavy, d.fast, d.fast_broke, d.fast_ok) == (2, 12, 6, 6, 1, 5)
    assert (d.fast_prompts, d.fast_prompts_broke) == (2, 1)
    assert d.l_cut.tolist() == [20, 40] and d.cap.tolist() == [24, 48]
    assert d.tokens == 320 and d.wasted_tokens == 24


def test_dispatch_cap_is_exact_for_float_products():
    assert cap_tokens(1.15, 100) == 115       # 1.15 * 100 = 114.99999999999999 in floats
    assert cap_tokens(1.5, np.array([3, 4])).tolist() == [4, 6]
    # a fast sample of exactly 115 tokens does not break a cap of 1.15 x 100; 116 does
    x = np.array([[100, 100], [50, 115], [50, 116]])
    d = dispatch_v25(x, batch_prompts=3, offload_fraction=0.3, cap_multiplier=1.15)
    assert (d.heavy, d.fast_broke) == (2, 1)


def test_dispatch_v25_shorter_last_batch_and_ties():
    x = np.array([[9, 9], [9, 100], [1, 1], [4, 4], [2, 50]])
    # B=4: batch 0 probes 9,9,1,4 -> ceil(0.25*4)=1 heavy: group 0 (tie broken by order), L_cut 9,
    # cap floor(1.5*9)=13: group 1 sample 100 breaks. Last batch (group 4 alone): ceil(0.25*1)=1 heavy.
    d = dispatch_v25(x, batch_prompts=4, offload_fraction=0.25, cap_multiplier=1.5)
    assert d.l_cut.tolist() == [9, 2] and d.cap.tolist() == [13, 3]
    assert (d.heavy, d.fast, d.fast_broke, d.wasted_tokens) == (4, 6, 1, 13)
    assert (d.fast_prompts, d.fast_prompts_broke) == (3, 1)


# -- naive twins on random traces --------------------------------------------------------------

def _random_trace(seed: int, g: int, n: int, high: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # small `high` makes many ties; a shared group factor makes columns correlated
    base = rng.integers(0, high, size=(g, 1))
    return np.clip(base + rng.integers(-high // 3, high // 3 + 1, size=(g, n)), 0, None)


CASES = [(seed, g, n, high) for seed, (g, n, high) in enumerate([
    (7, 2, 5), (40, 3, 6), (53, 8, 1000), (100, 4, 20), (257, 8, 50), (33, 5, 3), (90, 3, 30),
])]


@pytest.mark.parametrize("seed, g, n, high", CASES)
def test_kernels_match_naive_twins(seed, g, n, high):
    x = _random_trace(seed, g, n, high)
    rows = x.tolist()
    for ddof in (0, 1):
        np.testing.assert_allclose(group_cv(x, ddof), ref.naive_group_cv(rows, ddof), rtol=1e-12)
    np.testing.assert_allclose(spearman_vs_probe(x), ref.naive_spearman_vs_probe(rows), rtol=1e-10, atol=1e-12)
    for col in range(n):
        np.testing.assert_allclose(average_ranks(x)[:, col], ref.naive_average_ranks(x[:, col].tolist()))
    for k_frac, safe_frac in ((0.1, 0.2), (0.25, 0.5), (0.3, 0.3), (0.7, 0.7)):
        np.testing.assert_allclose(top_k_recall(x, k_frac), ref.naive_top_k_recall(rows, k_frac))
        np.testing.assert_allclose(safe_rate(x, k_frac, safe_frac), ref.naive_safe_rate(rows, k_frac, safe_frac))
    for length in (0, int(np.median(x)), int(x.max())):
        fn = false_negatives(x, length)
        want = ref.naive_false_negatives(rows, length)
        np.testing.assert_allclose([fn.group_rate, fn.sample_rate], want)
    for b, top in ((16, 3), (5, 1), (7, 2)):
        cap = batch_capture(x, b, top)
        want = np.array(ref.naive_batch_capture(rows, b, top))
        np.testing.assert_allclose(cap.capture_prob, want[:, 0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(cap.cost_ratio, want[:, 1], rtol=1e-12)
        np.testing.assert_allclose(cap.miss_cost, want[:, 2], rtol=1e-12, atol=1e-12)
    for b, frac, mult in ((16, 0.2, 1.5), (5, 0.2, 1.5), (7, 0.3, 1.1), (15, 0.2, 1.15), (100, 0.55, 1.5)):
        d = dispatch_v25(x, b, frac, mult)
        want = ref.naive_dispatch_v25(rows, b, frac, mult)
        assert (d.heavy, d.fast, d.fast_broke, d.wasted_tokens, d.fast_prompts_broke) == want


# tiny traces, most of them heavy with ties: every tie order is enumerated (G! per column)
TINY = [(seed, g, n, high) for seed, (g, n, high) in enumerate([
    (1, 2, 1), (2, 3, 1), (3, 2, 2), (4, 3, 2), (5, 2, 2), (5, 3, 3), (6, 2, 2), (6, 4, 2), (6, 3, 1000),
], start=100)]


@pytest.mark.parametrize("seed, g, n, high", TINY)
def test_rank_kernels_are_the_average_over_every_tie_order(seed, g, n, high):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, high + 1, size=(g, n))
    rows = x.tolist()
    for k_frac, safe_frac in ((0.2, 0.4), (0.34, 0.5), (0.5, 0.5), (0.5, 1.0), (1.0, 1.0)):
        k, ks = top_k_count(g, k_frac), top_k_count(g, safe_frac)
        if k == 0:
            assert np.isnan(top_k_recall(x, k_frac)).all() and np.isnan(safe_rate(x, k_frac, safe_frac)).all()
            continue
        np.testing.assert_allclose(top_k_recall(x, k_frac), ref.brute_top_k_overlap(rows, k, k), rtol=1e-12)
        np.testing.assert_allclose(top_k_recall(x, k_frac), ref.naive_top_k_recall(rows, k_frac), rtol=1e-12)
        np.testing.assert_allclose(safe_rate(x, k_frac, safe_frac), ref.brute_top_k_overlap(rows, k, ks),
                                   rtol=1e-12)
    for b, top in ((g, 1), (g, 2), (3, 1), (4, 2)):
        cap = batch_capture(x, b, top)
        want = np.array(ref.brute_batch_capture(rows, b, top))
        np.testing.assert_allclose(cap.capture_prob, want[:, 0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(cap.cost_ratio, want[:, 1], rtol=1e-12)
        np.testing.assert_allclose(cap.miss_cost, want[:, 2], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(want, ref.naive_batch_capture(rows, b, top), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_capped_lengths_without_signal_score_chance(seed):
    # independent uniform lengths clipped at 512: about half of them tie at the cap. Over 7 later samples of
    # 512 groups (k = 51 of 512, ~10%), recall's sd is about 1.3 points, the safe rate's about 2, capture over
    # 32 batches' about 2.5: 4 sd tolerances. The old group-order tie rule read 45% recall and 100% capture.
    rng = np.random.default_rng(seed)
    x = np.minimum(rng.integers(1, 1068, size=(512, 8)), 512)
    assert 0.45 < (x == 512).mean() < 0.6
    assert abs(top_k_recall(x, 0.1).mean() - 51 / 512) < 0.05
    assert abs(safe_rate(x, 0.1, 0.2).mean() - 102 / 512) < 0.08
    cap = batch_capture(x, 16, 3)
    assert abs(cap.capture_rate - 3 / 16) < 0.1 and cap.chance_rate == 3 / 16


def test_equal_lengths_score_exactly_chance_in_the_kernels():
    x = np.full((40, 5), 100)
    np.testing.assert_allclose(top_k_recall(x, 0.1), 4 / 40)
    np.testing.assert_allclose(safe_rate(x, 0.1, 0.2), 8 / 40)
    cap = batch_capture(x, 16, 3)      # batches of 16, 16 and 8
    np.testing.assert_allclose(cap.capture_prob, [3 / 16, 3 / 16, 3 / 8])
    assert cap.capture_rate == pytest.approx(cap.chance_rate)
    assert np.isnan(spearman_vs_probe(x)).all()


def test_spearman_matches_scipy_when_installed():
    if importlib.util.find_spec("scipy") is None:
        pytest.skip("scipy is not installed (the naive twin covers Spearman)")
    from scipy.stats import spearmanr

    x = _random_trace(11, 300, 6, 40)
    want = [spearmanr(x[:, 0], x[:, j]).statistic for j in range(1, 6)]
    np.testing.assert_allclose(spearman_vs_probe(x), want, rtol=1e-10)


def test_count_greater_rowwise_matches_broadcast():
    rng = np.random.default_rng(0)
    for rows, b, high in ((1, 1, 3), (9, 16, 5), (40, 7, 1000)):
        v = rng.integers(0, high, size=(rows, b))
        want = (v[:, None, :] > v[:, :, None]).sum(axis=2)
        np.testing.assert_array_equal(count_greater_rowwise(v), want)
        gt, eq = greater_equal_counts(v)
        np.testing.assert_array_equal(gt, want)
        np.testing.assert_array_equal(eq, (v[:, None, :] == v[:, :, None]).sum(axis=2))


def test_kernels_reject_bad_shapes():
    with pytest.raises(ValueError, match=r"at least 2 samples"):
        spearman_vs_probe(np.array([[1], [2]]))
    with pytest.raises(ValueError, match=r"\[G, N\]"):
        batch_capture(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="fraction"):
        top_k_recall(HAND, 0.0)


# -- the report ------------------------------------------------------------------------------------

def test_report_numbers_are_the_kernels():
    trace = synth_trace(groups=100, n=6, seed=1, tokens_per_s=20)
    cfg = AnalyzeConfig(top_k=0.2, safe_k=0.3, fn_length=400, batch_prompts=8, capture_top=2,
                        dispatch_batch_prompts=10, offload_fraction=0.3, cap_multiplier=1.25, cv_ddof=0)
    report = analyze_trace(trace, cfg)
    x = trace.matrix()
    assert report["trace"]["groups"] == 100 and report["trace"]["samples_per_group"] == 6
    assert report["trace"]["tokens"] == int(x.sum())
    assert report["cv"]["mean"] == pytest.approx(group_cv(x, 0).mean())
    assert report["cv"]["max"] == pytest.approx(group_cv(x, 0).max())
    assert report["spearman"]["per_sample"] == pytest.approx(spearman_vs_probe(x).tolist())
    assert report["spearman"]["mean_incl_self"] == pytest.approx((spearman_vs_probe(x).sum() + 1) / 6)
    assert report["top_k_recall"]["k"] == 20
    assert report["top_k_recall"]["mean"] == pytest.approx(top_k_recall(x, 0.2).mean())
    assert report["safe_rate"]["mean"] == pytest.approx(safe_rate(x, 0.2, 0.3).mean())
    assert report["false_negatives"]["group_rate"] == pytest.approx(false_negatives(x, 400).group_rate)
    cap = batch_capture(x, 8, 2)
    bc = report["batch_capture"]
    assert bc["batches"] == 13 and bc["ranked_batches"] == 13    # 100 = 12 x 8 + 4, and 4 > capture_top
    assert bc["capture_rate"] == pytest.approx(cap.capture_rate)
    assert bc["chance_rate"] == pytest.approx((12 * 2 / 8 + 2 / 4) / 13)
    missed = 1 - cap.capture_prob
    assert bc["cost_ratio_missed"]["batches"] == pytest.approx(missed.sum())
    if missed.sum():
        assert bc["cost_ratio_missed"]["mean"] == pytest.approx(cap.miss_cost.sum() / missed.sum())
        assert bc["cost_ratio_missed"]["max"] == pytest.approx(np.nanmax(cap.miss_max))
    assert report["top_k_recall"]["chance"] == 0.2 and report["safe_rate"]["chance"] == 0.3
    assert report["warnings"] == []
    d = dispatch_v25(x, 10, 0.3, 1.25)
    dv = report["dispatch_v25"]
    assert (dv["batch_prompts"], dv["heavy"], dv["fast_broke"]) == (10, d.heavy, d.fast_broke)
    assert dv["heavy_prompts_per_batch"] == 3
    assert dv["heavy_frac"] + dv["fast_frac"] == pytest.approx(1.0)
    assert report["trace"]["finish_reasons"]["stop"] + report["trace"]["finish_reasons"].get("length", 0) == 600
    assert report["trace"]["tokens_per_s_of_sample_time"] == pytest.approx(20.0)
    tables = report_tables(report)
    assert len(tables["per_sample"]) == 5
    assert [r["samples"] for r in tables["dispatch"]] == [d.heavy, d.fast, d.fast_ok, d.fast_broke]


def test_report_is_strict_json_with_nan_as_null():
    import json

    # every probe equal -> Spearman undefined
    trace = LengthTrace.from_matrix(np.array([[5, 1, 2], [5, 3, 4], [5, 6, 8]]))
    report = analyze_trace(trace)
    assert report["spearman"]["per_sample"] == [None, None]
    assert report["spearman"]["mean"] is None and report["spearman"]["mean_incl_self"] is None
    assert any("every probe is 5 tokens" in w for w in report["warnings"])
    json.loads(json.dumps(report, allow_nan=False))


RANKED = ("top_k_recall", "safe_rate")


def _na_rank_stats(report) -> bool:
    return (all(report[key]["mean"] is None and set(report[key]["per_sample"]) == {None} for key in RANKED)
            and report["spearman"]["mean"] is None and report["batch_capture"]["capture_rate"] is None
            and report["batch_capture"]["cost_ratio_missed"]["mean"] is None)


def test_degenerate_traces_say_na_with_a_warning():
    import json

    # all lengths equal: the kernels give chance; the report says there is nothing to rank
    equal = analyze_trace(LengthTrace.from_matrix(np.full((64, 4), 300)))
    assert _na_rank_stats(equal)
    assert any(w.startswith("every length is 300") for w in equal["warnings"])
    # one group
    one = analyze_trace(LengthTrace.from_matrix(np.array([[5, 9, 2]])), AnalyzeConfig(top_k=1.0, safe_k=1.0))
    assert _na_rank_stats(one) and one["warnings"][0].startswith("one group")
    # the top 10% of 9 groups is empty: n/a, not the single longest group
    small = analyze_trace(LengthTrace.from_matrix(np.arange(27).reshape(9, 3)))
    assert small["top_k_recall"]["k"] == 0 and small["top_k_recall"]["mean"] is None
    assert small["safe_rate"]["mean"] is None and small["spearman"]["mean"] == pytest.approx(1.0)
    assert any("floor(0.1 x 9 groups) = 0" in w and "needs 10 groups" in w for w in small["warnings"])
    # top 20% of 9 is 1 group, but the safe set of 10% is empty
    safe_only = analyze_trace(LengthTrace.from_matrix(np.arange(27).reshape(9, 3)), AnalyzeConfig(top_k=0.2,
                                                                                                  safe_k=0.1))
    assert safe_only["top_k_recall"]["mean"] == 1.0 and safe_only["safe_rate"]["mean"] is None
    # batches no larger than capture_top are captured whatever the probe
    tiny_batches = analyze_trace(LengthTrace.from_matrix(np.arange(60).reshape(20, 3)),
                                 AnalyzeConfig(batch_prompts=3, capture_top=3))
    assert tiny_batches["batch_capture"]["capture_rate"] is None
    assert any(w.startswith("batch capture is n/a") for w in tiny_batches["warnings"])
    for report in (equal, one, small, safe_only, tiny_batches):
        json.loads(json.dumps(report, allow_nan=False))


def test_responses_at_the_cap_are_counted_and_censor_false_negatives():
    x = np.array([[100, 512, 300], [512, 200, 512], [50, 60, 70], [400, 512, 80]])
    reasons = np.where(x == 512, "length", "stop")
    report = analyze_trace(LengthTrace.from_matrix(x, finish_reasons=reasons))
    assert report["trace"]["at_cap"] == {"basis": "finish_reason", "length": 512, "samples": 4, "share": 4 / 12}
    fn = report["false_negatives"]
    assert fn["group_rate"] is None and fn["sample_rate"] is None and fn["groups_below"] == 3
    assert any("false negatives at 512 are n/a" in w and "cut at 512 tokens" in w for w in report["warnings"])
    # below the cap the rate is measured
    assert analyze_trace(LengthTrace.from_matrix(x, finish_reasons=reasons),
                         AnalyzeConfig(fn_length=250))["false_negatives"]["group_rate"] == 0.5
    # without finish reasons the cap is the max length, and it censors only when many responses reach it
    plain = analyze_trace(LengthTrace.from_matrix(x))
    assert plain["trace"]["at_cap"]["basis"] == "max_length" and plain["false_negatives"]["group_rate"] is None
    few = x.copy()
    few[few == 512] = 500
    few[0, 1] = 512
    assert analyze_trace(LengthTrace.from_matrix(few))["false_negatives"]["group_rate"] == 0.0
    notes = report_notes(report)
    assert any("33% of responses end at the cap (512 tokens)" in n for n in notes)
    assert any(n.startswith("ref 0.5B MATH:") for n in notes)
    assert not any("at the cap" in n for n in report_notes(analyze_trace(LengthTrace.from_matrix(few))))


def test_report_needs_equal_groups_of_two_or_more():
    ragged = LengthTrace(prompt_ids=["a", "b"], prompt_lens=[1, 1], lengths=[1, 2, 3], offsets=[0, 2, 3])
    with pytest.raises(DataError, match="analysis needs the same number of samples"):
        analyze_trace(ragged)
    with pytest.raises(DataError, match="at least 2 samples per group"):
        analyze_trace(LengthTrace.from_matrix(np.array([[1], [2]])))


def test_write_plots_writes_pngs(tmp_path):
    x = synth_trace(groups=64, n=4, seed=2).matrix()
    x[0, 1] = 0  # an empty response must not break the log axes
    paths = write_plots(x, tmp_path / "plots", title="t")
    assert [p.name for p in paths] == ["lengths_hist.png", "probe_vs_later.png", "cv_hist.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    assert not list((tmp_path / "plots").glob(".*"))


def test_importing_analysis_does_not_import_matplotlib():
    code = "import sys, pdsr_sdk.analysis, pdsr_sdk.traces; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
