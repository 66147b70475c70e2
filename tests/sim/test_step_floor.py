"""The step-count floor (pdsr_sdk.sim.step_floor) against its naive twins (token-by-token sums, the dual maximised
at every breakpoint, a scan over step lengths), against the exact least split of tiny cases (the dual must stay
below it), and against simulated streams (no run within a budget may beat the floor at that budget)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdsr_sdk.sim.step_floor import (cell_steps, cell_steps_naive, least_steps, least_steps_naive, step_floor,
                                     step_floor_naive, tail_sums)

COST = dict(c0=5e-3, c1=5e-5, c2=1e-5)


def draw(seed: int, n: int = 12, top: int = 80) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, top, n), rng.integers(0, 30, n)


def cells(lengths, prompts, step_s, grid):
    x, root, var = tail_sums(lengths, prompts, c1=COST["c1"], c2=COST["c2"], grid=grid)
    return x, cell_steps(x, root, var, step_s, COST["c0"])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("grid", [1, 7, 64])
@pytest.mark.parametrize("step_s", [0.05, 0.3, 1.0])
def test_cells_match_the_token_by_token_sums(seed, grid, step_s):
    lengths, prompts = draw(seed)
    x, z = cells(lengths, prompts, step_s, grid)
    xs, zs = cell_steps_naive(lengths, prompts, step_s, **COST, grid=grid)
    assert x.tolist() == xs
    assert np.array_equal(np.isinf(z), np.isinf(np.asarray(zs)))
    finite = np.isfinite(z)
    assert np.allclose(z[finite], np.asarray(zs)[finite], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("share", [0.0, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("step_s", [0.3, 0.6, 2.0])
def test_the_dual_matches_its_exact_maximum(seed, share, step_s):
    lengths, prompts = draw(seed)
    x, z = cells(lengths, prompts, step_s, 8)
    xs, zs = cell_steps_naive(lengths, prompts, step_s, **COST, grid=8)
    need = share * float(lengths.sum())
    fast, slow = least_steps(z, x, need), least_steps_naive(xs, zs, need)
    if math.isinf(slow):
        assert math.isinf(fast)
    else:
        assert fast == pytest.approx(slow, rel=1e-6, abs=1e-9)


def exact_least(lengths, prompts, step_s: float, need: int) -> float:
    """The least sum of Z over every integer split making at least ``need`` tokens (knapsack by tokens)."""
    best = [0.0] + [math.inf] * need
    for n, p in zip(lengths, prompts):
        costs = []
        for x in range(int(n) + 1):
            w = [COST["c1"] + COST["c2"] * (p + j) for j in range(int(n) - x, int(n))]
            room = step_s - COST["c0"] * x
            fits = x == 0 or (room > 0 and COST["c0"] * x + sum(w) <= step_s)
            costs.append(sum(math.sqrt(v) for v in w) ** 2 / room if x and fits else (0.0 if x == 0 else math.inf))
        nxt = [math.inf] * (need + 1)
        for made, c in enumerate(best):
            if math.isinf(c):
                continue
            for x, cx in enumerate(costs):
                k = min(need, made + x)
                nxt[k] = min(nxt[k], c + cx)
        best = nxt
    return best[need]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("grid", [1, 3, 64])
def test_the_dual_never_exceeds_the_least_split(seed, grid):
    lengths, prompts = draw(seed, n=4, top=14)
    for step_s in (0.04, 0.08, 0.2):
        for share in (0.5, 0.8, 1.0):
            need = math.ceil(share * int(lengths.sum()))
            x, z = cells(lengths, prompts, step_s, grid)
            exact = exact_least(lengths, prompts, step_s, need)
            bound = least_steps(z, x, float(need))
            assert bound <= exact * (1 + 1e-9) + 1e-12 or math.isinf(exact)
            if math.isinf(bound):
                assert math.isinf(exact)


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("budget", [0.0, 0.1, 0.4])
@pytest.mark.parametrize("kv_tokens", [None, 200])
def test_step_floor_matches_the_scan(seed, budget, kv_tokens):
    lengths, prompts = draw(seed, n=10, top=60)
    kw = dict(steps=2, engines=2, budget=budget, max_seqs=16, grid=4, kv_tokens=kv_tokens, **COST)
    fast = step_floor(lengths, prompts, 0.05, rel_tol=1e-6, **kw)
    scan, top = 200, 1.0
    slow = step_floor_naive(lengths.tolist(), prompts.tolist(), 0.05, scan=scan, top=top, **kw)
    cell = (top - 0.05) / scan
    assert slow - cell - 1e-6 <= fast <= slow + 1e-6


def test_the_floor_is_the_work_bound_without_a_budget_and_rises_as_it_tightens():
    lengths, prompts = draw(7, n=200, top=2000)
    kw = dict(steps=4, engines=8, max_seqs=64, **COST)
    floors = [step_floor(lengths, prompts, 0.5, budget=b, **kw) for b in (1.0, 0.5, 0.2, 0.1, 0.05, 0.0)]
    assert floors[0] == 0.5
    assert all(a <= b * (1 + 1e-3) for a, b in zip(floors, floors[1:])) and floors[-1] > 1.5 * floors[0]


def test_a_kv_cache_that_binds_raises_the_floor_even_without_a_budget():
    lengths, prompts = draw(7, n=200, top=2000)
    kw = dict(steps=4, engines=8, max_seqs=64, budget=1.0, **COST)
    free = step_floor(lengths, prompts, 0.5, **kw)
    held = [step_floor(lengths, prompts, 0.5, kv_tokens=kv, **kw) for kv in (1e9, 64 * 100, 64 * 50)]
    assert free == held[0] == 0.5 < held[1] < held[2]


def test_long_contexts_raise_the_floor():
    lengths, _ = draw(7, n=200, top=2000)
    kw = dict(steps=4, engines=8, max_seqs=64, budget=0.1, c0=COST["c0"], c1=COST["c1"])
    short = step_floor(lengths, np.zeros_like(lengths), 0.5, c2=0.0, **kw)
    long = step_floor(lengths, np.full_like(lengths, 4000), 0.5, c2=COST["c2"], **kw)
    assert long > short


@pytest.mark.parametrize("kv_cache_tokens", [1 << 22, 24576])   # ... and one that holds some 20 of its contexts
@pytest.mark.parametrize("over_provision", [0.25, 0.5, 1.0])
def test_no_simulated_stream_beats_the_floor_at_its_own_partial_share(over_provision, kv_cache_tokens):
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.bounds import bound_coefficients
    from pdsr_sdk.sim.steps import simulate_steps
    from pdsr_sdk.traces import workload

    k, b = 6, 16
    trace = workload("heavy").trace(groups=(k + 1) * b, n=8, seed=3)
    prof = dict(max_num_seqs=256, kv_cache_tokens=kv_cache_tokens, max_model_len=8192)   # short steps: runaways
    for policy in ("v3", "baseline"):
        cfg = SimulateConfig(policy=policy, fast=1, heavy=1, steps=k, step_groups=b, over_provision=over_provision,
                             max_staleness=2, kv_on_update="keep", timeline=False,
                             profiles={"fast": prof, "heavy": prof})
        report = simulate_steps(trace, cfg)
        run = next(r for r in report.runs if r.over_provision == over_provision)
        co = bound_coefficients(cfg)
        prompts = np.repeat(np.asarray(trace.prompt_lens), np.diff(np.asarray(trace.offsets)))
        floor = step_floor(np.asarray(trace.lengths), prompts, run.work_bound_s, steps=k + 1, engines=2,
                           budget=max(run.partial_share, 1e-9), c0=co["c0"], c1=co["c1"], c2=co["c2"],
                           max_seqs=int(co["max_seqs"]), kv_tokens=kv_cache_tokens)
        assert floor > run.work_bound_s   # the budget binds here ...
        assert run.steady_step_s >= floor  # ... and still no schedule beats it
