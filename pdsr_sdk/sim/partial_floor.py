"""The least step a partial-rollout stream of equal steps can take under a partial-token budget (pure numbers).

The work bound (:func:`~pdsr_sdk.sim.cost.sample_work`) prices every token at a full engine's share of a step. A
budget on partial tokens (tokens of responses that crossed a weight update, made under the older version) adds a
cost it leaves out: of a response of ``L`` tokens, at least ``x >= L - p`` tokens (``p`` its partial ones) are
made within the last step of ``T`` seconds it runs in (its consuming step, or an earlier one where it finished
whole while its group waited), so the steps that make them average at most ``T / x``
seconds. An engine whose step costs ``tau`` runs at most ``(tau - c0) / c1`` requests (the step model of
:mod:`~pdsr_sdk.sim.cost`, attention left out), so each of those tokens costs at least ``c1 tau / (tau - c0)``
engine-seconds (the step shared by its requests; convex and falling in ``tau``, so by Jensen the average step
``T / x`` prices them). Above the ``c0 / max_seqs + c1`` the work bound charged, that is::

    g(x) = c1 c0 x^2 / (T - c0 x) - c0 x / max_seqs     for x > T / (c0 + c1 max_seqs), else 0

(at most ``T / (c0 + c1)`` tokens fit: a request alone). ``g`` is convex and the same for every response, so the
least extra for a budget is water-filling: each response makes ``min(u, x*)`` tokens in its last step, ``u`` its
length capped by what fits, ``x*`` set so the partial tokens just fit the budget. In a steady state the steps make
what they consume, so equal steps of ``T`` on ``engines`` engines need
``engines * T >= work + extra(T)`` per step; the floor is the least such ``T``.

What it assumes: equal steps (a response consumed in a longer step could be made more cheaply), and a token's
version is the one it is made under (pdsr's streams count a segment's tokens by the version it started under,
which makes more of them partial, so the floor stays below them). Every function has a naive twin
(``*_naive``, plain float64 loops) that tests hold it to.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable

import numpy as np


def extra_cost(x, step_s: float, *, c0: float, c1: float, max_seqs: int) -> np.ndarray:
    """Engine-seconds above the work bound's price that ``x`` tokens made within one step of ``step_s`` seconds
    cost at least (``g`` of the module docstring, elementwise; ``x`` at most ``step_s / (c0 + c1)``)."""
    x = np.asarray(x, dtype=np.float64)
    full = step_s / (c0 + c1 * max_seqs)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = c1 * c0 * x * x / (step_s - c0 * x) - c0 * x / max_seqs
    return np.where(x > full, g, 0.0)


def least_extra(lengths, step_s: float, budget: float, *, c0: float, c1: float, max_seqs: int) -> float:
    """The least extra engine-seconds (:func:`extra_cost`) with which responses of ``lengths`` tokens, each consumed
    in a step of ``step_s`` seconds, keep their partial tokens within ``budget`` of all their tokens; ``inf`` when
    no split does (too few of their tokens fit in one step)."""
    u = np.minimum(np.asarray(lengths, dtype=np.float64), step_s / (c0 + c1))
    need = (1.0 - budget) * float(np.sum(lengths))   # tokens made within their consuming step, at least
    if need <= 0.0:
        return 0.0
    if u.sum() < need * (1.0 - 1e-12):
        return math.inf
    # water-filling: the level x* with sum(min(u, x*)) = need
    u_sorted = np.sort(u)
    below = np.concatenate(([0.0], np.cumsum(u_sorted)))   # sum of the k smallest
    n = len(u_sorted)
    # with the k smallest below the level and the other n - k at it, the level is (need - their sum) / (n - k);
    # the right k is the first whose level does not exceed the k-th smallest
    candidates = (need - below[:n]) / (n - np.arange(n))
    fits = np.nonzero(candidates <= u_sorted)[0]
    level = candidates[fits[0]] if fits.size else u_sorted[-1]
    return float(np.sum(extra_cost(np.minimum(u, level), step_s, c0=c0, c1=c1, max_seqs=max_seqs)))


def least_extra_naive(lengths, step_s: float, budget: float, *, c0: float, c1: float, max_seqs: int,
                      unit: float = 1.0) -> float:
    """Greedy twin of :func:`least_extra`: the tokens each response makes in its last step grow ``unit`` at a time,
    each unit to the response whose cost grows least (optimal for convex costs), until the budget holds."""
    total = float(sum(lengths))
    need = (1.0 - budget) * total
    cap = step_s / (c0 + c1)
    x = [0.0] * len(lengths)
    u = [min(float(n), cap) for n in lengths]
    if sum(u) < need * (1.0 - 1e-12):
        return math.inf

    def g(v: float) -> float:
        if v <= step_s / (c0 + c1 * max_seqs):
            return 0.0
        return c1 * c0 * v * v / (step_s - c0 * v) - c0 * v / max_seqs

    heap = [(g(min(unit, u[i])) - g(0.0), i) for i in range(len(u)) if u[i] > 0]
    heapq.heapify(heap)
    made = 0.0
    while made < need - 1e-9 and heap:
        _, i = heapq.heappop(heap)
        step = min(unit, u[i] - x[i], need - made)
        x[i] += step
        made += step
        if x[i] < u[i]:
            nxt = min(x[i] + unit, u[i])
            heapq.heappush(heap, (g(nxt) - g(x[i]), i))
    return sum(g(v) for v in x)


def partial_floor(lengths, work_s: float, *, steps: int, engines: int, budget: float, c0: float, c1: float,
                  max_seqs: int, rel_tol: float = 1e-6) -> float:
    """The least equal step (seconds) in which ``engines`` engines make, step after step, the consumed responses
    of ``lengths`` tokens (consumed over ``steps`` steps; ``work_s`` their work bound per step, the engine time at
    full occupancy / engines) with at most ``budget`` of their tokens partial."""
    lengths = np.asarray(lengths, dtype=np.float64)

    def fits(t: float) -> bool:
        extra = least_extra(lengths, t, budget, c0=c0, c1=c1, max_seqs=max_seqs)
        return engines * t >= engines * work_s + extra / steps

    return least_fitting(fits, work_s, rel_tol)


def least_fitting(fits: Callable[[float], bool], lo: float, rel_tol: float) -> float:
    """The least step from ``lo`` up at which ``fits`` (false below some step, true from it on) holds, to within
    ``rel_tol``: doubling, then bisection."""
    if fits(lo):
        return lo
    hi = max(2.0 * lo, 1e-9)
    while not fits(hi):
        hi *= 2.0
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def partial_floor_naive(lengths, work_s: float, *, steps: int, engines: int, budget: float, c0: float, c1: float,
                        max_seqs: int, grid: int = 4000, unit: float = 1.0) -> float:
    """Scan twin of :func:`partial_floor`: the first of ``grid`` steps from ``work_s`` up to a full engine's time
    for the longest response (where nothing costs extra) at which the greedy extra fits."""
    top = max(work_s, (c0 + c1 * max_seqs) * max(lengths))
    for j in range(grid + 1):
        t = work_s + (top - work_s) * j / grid
        extra = least_extra_naive(lengths, t, budget, c0=c0, c1=c1, max_seqs=max_seqs, unit=unit)
        if engines * t >= engines * work_s + extra / steps:
            return t
    return top
