"""LengthHistory (v3's finished lengths): every read held to a plain loop over the window."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from pdsr_sdk.policies.length_history import LengthHistory, cap_runner_threshold


def residual_loop(lengths, generated, cap):
    longer = [x for x in lengths if x > generated]
    if not longer:
        return max(1.0, float(cap - generated))
    return sum(longer) / len(longer) - generated


def quantile_loop(lengths, q):
    if not lengths:
        return math.inf
    ordered = sorted(lengths)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def cap_runner_threshold_loop(lengths, cap, share):
    """Try every finished length below the cap, shortest first, counting the samples past it."""
    n_cap = sum(1 for x in lengths if x >= cap)
    if n_cap in (0, len(lengths)):
        return float("inf")
    for x in sorted(set(lengths)):
        above = sum(1 for y in lengths if y > x)
        if x < cap and above and n_cap / above >= share - 1e-12:
            return float(x)
    return float("inf")


@pytest.mark.parametrize("seed", range(12))
def test_reads_match_a_loop_over_the_window(seed):
    """Random lengths through a small window (so old ones leave it); after each refresh every read equals the
    loop's over the window as it was then, and between refreshes the reads keep that snapshot."""
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(20, 400))
    window = int(rng.integers(1, 50))
    h = LengthHistory(window)
    mirror: deque[int] = deque(maxlen=window)
    snapshot: list[int] = []
    for step in range(300):
        n = int(min(cap, rng.lognormal(math.log(cap / 4), 1.0)))
        h.add(n)
        mirror.append(n)
        assert len(h) == len(mirror) and h.full == (len(mirror) == window)
        assert h.mean() == pytest.approx(sum(mirror) / len(mirror), rel=1e-12)
        if step % 7 == 0:
            h.refresh()
            snapshot = list(mirror)
        for generated in (0, int(rng.integers(0, cap + 1)), cap):
            assert h.residual(generated, cap) == pytest.approx(residual_loop(snapshot, generated, cap), rel=1e-12)
        for q in (0.0, 0.5, 0.97, 0.995, 1.0):
            assert h.quantile(q) == quantile_loop(snapshot, q)
        share = float(rng.choice([0.25, 0.5, 1.0]))
        assert h.cap_runner_threshold(cap, share) == cap_runner_threshold_loop(snapshot, cap, share)
    assert h.seen == 300


def test_an_empty_history_reads_as_knowing_nothing():
    h = LengthHistory(8)
    assert h.mean() == 0.0 and h.quantile(0.97) == math.inf
    assert h.residual(10, 100) == 90.0                                  # the cap, less what it has
    assert h.residual(100, 100) == 1.0                                  # never less than a token
    assert h.cap_runner_threshold(100, 0.5) == math.inf


@pytest.mark.parametrize("seed", range(40))
def test_cap_runner_threshold_matches_a_direct_count(seed):
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(5, 40))
    lengths = sorted(int(x) for x in rng.integers(1, cap + 1, size=int(rng.integers(1, 60))))
    share = float(rng.choice([0.1, 0.25, 0.5, 0.7, 1.0]))
    assert cap_runner_threshold(lengths, cap, share) == cap_runner_threshold_loop(lengths, cap, share)


def test_cap_runner_threshold_by_hand():
    # 4 of 10 at the cap: past 30, 4 of 6 ran to it (0.67); past 20, 4 of 7 (0.57); past 10, 4 of 8 (0.5);
    # past 5, 4 of 9 (0.44)
    lengths = [5, 10, 20, 30, 40, 50, 100, 100, 100, 100]
    assert cap_runner_threshold(lengths, 100, 0.5) == 10
    assert cap_runner_threshold(lengths, 100, 0.6) == 30
    assert cap_runner_threshold(lengths, 100, 1.0) == 50
    assert cap_runner_threshold(lengths[:6], 100, 0.5) == math.inf      # nothing ran to the cap
    assert cap_runner_threshold([100, 100], 100, 0.5) == math.inf      # nothing finished short of it
