"""The statistics kernels against naive float64 twins on random traces, against every tie order on tiny ones,
against chance where lengths carry no signal, and against scipy."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from pdsr_sdk.analysis import (
    average_ranks,
    batch_capture,
    dispatch_v25,
    false_negatives,
    group_cv,
    safe_rate,
    spearman_vs_probe,
    top_k_count,
    top_k_recall,
)
from pdsr_sdk.analysis import reference as ref
from pdsr_sdk.analysis.stats import count_greater_rowwise, greater_equal_counts


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
