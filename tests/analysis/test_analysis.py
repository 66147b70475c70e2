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
    report_tables,
    safe_rate,
    spearman_vs_probe,
    top_k_count,
    top_k_recall,
    write_plots,
)
from pdsr_sdk.analysis import reference as ref
from pdsr_sdk.analysis.stats import cap_tokens, count_greater_rowwise, top_k_mask
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


def test_top_k_ties_break_by_group_order():
    x = np.array([[5], [7], [7], [7], [1]])
    assert top_k_mask(x, 2)[:, 0].tolist() == [False, True, True, False, False]


def test_top_k_count_and_offload_count_round_as_documented():
    assert top_k_count(7424, 0.1) == 742      # the seed's "Top 742"
    assert top_k_count(90, 0.7) == 63         # 0.7 * 90 = 62.99999999999999 in floats: still 63
    assert top_k_count(5, 0.1) == 1           # never empty
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
    assert cap.captured.tolist() == [False, True]
    assert cap.longest.tolist() == [30, 50] and cap.probe_of_longest.tolist() == [10, 40]
    np.testing.assert_allclose(cap.cost_ratio, [3.0, 1.25])
    assert cap.capture_rate == 0.5
    # top 2 of a batch of 2 captures everything
    assert batch_capture(HAND, 2, 2).captured.all()


def test_batch_capture_ties_and_short_last_batch():
    x = np.array([
        [5, 9],   # holds the longest (9), probe ranked 2nd
        [8, 9],   # also holds 9, probe ranked 1st -> captured with top 1
        [1, 2],
        [0, 50],  # a last batch of one: always captured; probe 0 counts as 1
    ])
    cap = batch_capture(x, batch_prompts=3, capture_top=1)
    assert cap.captured.tolist() == [True, True]
    np.testing.assert_allclose(cap.cost_ratio, [9 / 8, 50.0])
    # equal probes tie in their favour: both are "top 1"
    tie = np.array([[7, 1], [7, 30], [3, 2]])
    assert batch_capture(tie, 3, 1).captured.tolist() == [True]


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
        want_captured, want_ratio = ref.naive_batch_capture(rows, b, top)
        assert cap.captured.tolist() == want_captured
        np.testing.assert_allclose(cap.cost_ratio, want_ratio)
    for b, frac, mult in ((16, 0.2, 1.5), (5, 0.2, 1.5), (7, 0.3, 1.1), (15, 0.2, 1.15), (100, 0.55, 1.5)):
        d = dispatch_v25(x, b, frac, mult)
        want = ref.naive_dispatch_v25(rows, b, frac, mult)
        assert (d.heavy, d.fast, d.fast_broke, d.wasted_tokens, d.fast_prompts_broke) == want


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
    assert report["batch_capture"]["batches"] == 13
    assert report["batch_capture"]["capture_rate"] == pytest.approx(cap.capture_rate)
    missed = cap.cost_ratio[~cap.captured]
    assert report["batch_capture"]["cost_ratio_missed"]["batches"] == missed.size
    if missed.size:
        assert report["batch_capture"]["cost_ratio_missed"]["max"] == pytest.approx(missed.max())
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
    assert report["spearman"]["mean"] is None
    json.loads(json.dumps(report, allow_nan=False))


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
