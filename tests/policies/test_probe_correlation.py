"""ProbeCorrelation (v3's rank switch): the running-sum correlation held to a two-pass float64 one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdsr_sdk.policies.probe_correlation import ProbeCorrelation, window_correlations


def two_pass(pairs):
    """Pearson correlation of the logged pairs, means first, in float64 loops; 0 without spread."""
    if not pairs:
        return 0.0
    xs = [math.log1p(p) for p, _ in pairs]
    ys = [math.log1p(y) for _, y in pairs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    vx = sum((x - mx) ** 2 for x in xs)
    vy = sum((y - my) ** 2 for y in ys)
    if vx <= 1e-12 or vy <= 1e-12:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / math.sqrt(vx * vy)


@pytest.mark.parametrize("rho", [-0.6, 0.0, 0.3, 0.9])
@pytest.mark.parametrize("window", [16, 200])
def test_window_correlation_matches_two_passes(rho, window):
    """Correlated log-normal pairs through a window much shorter than the stream (old pairs leave it); the
    running sums agree with a fresh two-pass computation over the window at every step."""
    rng = np.random.default_rng([window, int(round(100 * (rho + 1)))])
    corr = ProbeCorrelation(window)
    seen = []
    for _ in range(3 * window + 17):
        a, b = rng.standard_normal(2)
        probe = int(math.exp(5 + a))
        sibling = int(math.exp(5 + rho * a + math.sqrt(1 - rho * rho) * b))
        corr.add(probe, sibling)
        seen.append((probe, sibling))
        assert len(corr) == min(len(seen), window)
        assert corr.value() == pytest.approx(two_pass(seen[-window:]), abs=1e-9)
    if rho:
        assert abs(corr.value() - rho) < (0.35 if window == 16 else 0.15)


def test_no_spread_reads_as_no_signal():
    corr = ProbeCorrelation(8)
    assert corr.value() == 0.0
    for length in (10, 50, 300):
        corr.add(100, length)          # every probe the same: nothing to predict from
    assert corr.value() == 0.0


@pytest.mark.parametrize("window, min_pairs", [(16, 4), (64, 64), (1024, 2)])
def test_window_correlations_are_the_windows_read_after_each_group(window, min_pairs):
    """What `pdsr analyze` reports of v3's ranking: after each group, the two-pass correlation of the last
    ``window`` (log1p probe, log1p sibling) pairs, once ``min_pairs`` are held."""
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 3000, size=(40, 6))
    got = window_correlations(lengths, window, min_pairs)
    pairs = [(math.log1p(row[0]), math.log1p(x)) for row in lengths for x in row[1:]]
    want = []
    for g in range(len(lengths)):
        held = pairs[:(g + 1) * 5][-window:]
        if len(held) >= min_pairs:
            xs, ys = np.array(held, dtype=np.float64).T
            want.append(float(np.corrcoef(xs, ys)[0, 1]))
    assert got == pytest.approx(want, abs=1e-6)   # running sums against two passes
