"""Statistics of length traces on hand-computed examples: CV, Spearman, top-k recall and the safe rate with
ties, false negatives, batch capture, the v2.5 dispatch and its cap; and the shapes the kernels refuse."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdsr_sdk.analysis import (
    average_ranks,
    batch_capture,
    dispatch_v25,
    false_negatives,
    group_cv,
    offload_count,
    safe_rate,
    spearman_vs_probe,
    top_k_count,
    top_k_recall,
)
from pdsr_sdk.analysis.stats import cap_tokens, top_k_prob


# 4 groups x 3 samples; column 0 is the probe.
HAND = np.array([
    [10, 12, 30],
    [20, 25, 15],
    [30, 28, 40],
    [40, 50, 20],
])


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
    assert offload_count(0.2, 16) == 3        # floor(3.2)
    assert offload_count(0.2, 15) == 3
    assert offload_count(0.2, 4) == 1         # floor(0.8), raised to 1
    assert offload_count(0.55, 100) == 55     # 0.55 * 100 = 55.00000000000001 in floats: still 55
    assert offload_count(0.2, 128) == 25      # seed 002: 1450 heavy prompts in 58 batches of 128
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
    # B=2, offload floor(0.5*2) = 1 prompt per batch, cap = floor(1.2 * L_cut).
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
    # a product past int64 is held at NO_CAP, not wrapped to a negative cap
    assert cap_tokens(1e17, np.array([0, 100, 2**40])).tolist() == [0, 2**62, 2**62]
    assert cap_tokens(float("inf"), 7) == 2**62
    # a fast sample of exactly 115 tokens does not break a cap of 1.15 x 100; 116 does
    x = np.array([[100, 100], [50, 115], [50, 116]])
    d = dispatch_v25(x, batch_prompts=3, offload_fraction=0.3, cap_multiplier=1.15)
    assert (d.heavy, d.fast_broke) == (2, 1)


def test_huge_settings_mean_no_cap_and_a_whole_batch(tmp_path):
    # a cap multiplier whose product passes int64 is no cap: nothing breaks, nothing is wasted (the product was
    # converted to int64 and wrapped to a negative cap, and every fast sample broke)
    for mult in (1e17, 1e300):
        d = dispatch_v25(HAND, batch_prompts=2, offload_fraction=0.5, cap_multiplier=mult)
        assert (d.fast_broke, d.fast_prompts_broke, d.wasted_tokens) == (0, 0, 0)
        assert (d.cap > HAND.max()).all()
    # a top past any batch holds every group: every batch is captured and none is ranked, as with top = B
    # (an int past int64 raised OverflowError)
    for top in (2, 10**20):
        cap = batch_capture(HAND, batch_prompts=2, capture_top=top)
        assert (cap.capture_prob == 1).all() and not cap.ranked.any()
    # through the CLI: a report, not a traceback; an infinite multiplier is an error naming the flag
    from cli_checks import failed, invoke
    from pdsr_sdk.traces import synth_trace, write_trace_jsonl

    trace = tmp_path / "t.jsonl"
    write_trace_jsonl(synth_trace(groups=40, n=4, seed=0), trace)
    result = invoke("analyze", trace, "--no-plots", "--json", tmp_path / "a.json", "--capture-top", 10**20)
    assert result.exit_code == 0 and "batch capture is n/a" in result.output
    failed(invoke("analyze", trace, "--no-plots", "--json", tmp_path / "b.json", "--cap-multiplier", "inf"),
           "--cap-multiplier")
    assert not (tmp_path / "b.json").exists()


def test_dispatch_v25_shorter_last_batch_and_ties():
    x = np.array([[9, 9], [9, 100], [1, 1], [4, 4], [2, 50]])
    # B=4: batch 0 probes 9,9,1,4 -> floor(0.25*4)=1 heavy: group 0 (tie broken by order), L_cut 9,
    # cap floor(1.5*9)=13: group 1 sample 100 breaks. Last batch (group 4 alone): floor(0.25*1)=0, raised to 1 heavy.
    d = dispatch_v25(x, batch_prompts=4, offload_fraction=0.25, cap_multiplier=1.5)
    assert d.l_cut.tolist() == [9, 2] and d.cap.tolist() == [13, 3]
    assert (d.heavy, d.fast, d.fast_broke, d.wasted_tokens) == (4, 6, 1, 13)
    assert (d.fast_prompts, d.fast_prompts_broke) == (3, 1)


def test_kernels_reject_bad_shapes():
    with pytest.raises(ValueError, match=r"at least 2 samples"):
        spearman_vs_probe(np.array([[1], [2]]))
    with pytest.raises(ValueError, match=r"\[G, N\]"):
        batch_capture(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="fraction"):
        top_k_recall(HAND, 0.0)
