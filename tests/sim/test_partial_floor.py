"""The partial-budget floor (pdsr_sdk.sim.partial_floor) against its naive twins: a greedy allocation one token at
a time, and a scan over step lengths."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdsr_sdk.sim.partial_floor import (extra_cost, least_extra, least_extra_naive, partial_floor,
                                        partial_floor_naive)

COST = dict(c0=5e-3, c1=5e-5, max_seqs=64)


def draw(seed: int, n: int = 40, top: int = 400) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(1, top, n)


def test_a_token_costs_extra_only_past_a_full_engines_step():
    t = 1.0
    full = t / (COST["c0"] + COST["c1"] * COST["max_seqs"])   # a step of t / x seconds is a full engine's
    assert extra_cost([0.0, full * 0.5, full], t, **COST).tolist() == [0.0, 0.0, 0.0]
    just = float(extra_cost(full * (1 + 1e-9), t, **COST))
    assert 0.0 <= just < 1e-9   # continuous where it starts
    alone = t / (COST["c0"] + COST["c1"])   # one request alone: its step is all its own
    assert float(extra_cost(alone, t, **COST)) == pytest.approx(alone * (COST["c0"] - COST["c0"] / COST["max_seqs"]))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("step_s", [0.8, 1.2, 2.0, 4.0])
@pytest.mark.parametrize("budget", [0.0, 0.1, 0.3, 0.6])
def test_least_extra_matches_the_greedy_allocation(seed, step_s, budget):
    lengths = draw(seed)
    fast = least_extra(lengths, step_s, budget, **COST)
    slow = least_extra_naive(lengths, step_s, budget, **COST, unit=0.25)
    if math.isinf(slow):
        assert math.isinf(fast)
    else:
        assert fast == pytest.approx(slow, rel=2e-3, abs=1e-6)


def test_least_extra_falls_with_the_budget_and_the_step():
    lengths = draw(5)
    by_budget = [least_extra(lengths, 1.5, b, **COST) for b in (0.0, 0.05, 0.1, 0.2, 0.4, 1.0)]
    assert all(a >= b for a, b in zip(by_budget, by_budget[1:])) and by_budget[-1] == 0.0 and by_budget[0] > 0
    by_step = [least_extra(lengths, t, 0.1, **COST) for t in (1.2, 1.5, 2.0, 3.0, 30.0)]
    assert all(a >= b for a, b in zip(by_step, by_step[1:])) and by_step[-1] == 0.0


def test_no_split_fits_when_too_few_tokens_fit_in_a_step():
    lengths = [1000, 1000]
    # alone, a request makes step_s / (c0 + c1) tokens a step: 0.5 s makes 98, far below 90% of 2,000
    assert least_extra(lengths, 0.5, 0.1, **COST) == math.inf
    assert least_extra_naive(lengths, 0.5, 0.1, **COST) == math.inf


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("budget", [0.0, 0.1, 0.3])
def test_partial_floor_matches_the_scan(seed, budget):
    lengths = draw(seed)
    kw = dict(steps=2, engines=2, budget=budget, **COST)
    fast = partial_floor(lengths, 0.2, **kw)
    grid = 300
    slow = partial_floor_naive(lengths, 0.2, **kw, grid=grid, unit=0.25)
    cell = ((COST["c0"] + COST["c1"] * COST["max_seqs"]) * max(lengths) - 0.2) / grid
    assert slow - cell - 1e-3 * slow <= fast <= slow + 1e-3 * slow


def test_the_floor_is_the_work_bound_without_a_budget_and_rises_as_it_tightens():
    lengths = draw(7, n=200, top=2000)
    kw = dict(steps=4, engines=8, **COST)
    floors = [partial_floor(lengths, 0.5, budget=b, **kw) for b in (1.0, 0.5, 0.2, 0.1, 0.05, 0.0)]
    assert floors[0] == 0.5
    assert all(a <= b for a, b in zip(floors, floors[1:])) and floors[-1] > floors[0]
