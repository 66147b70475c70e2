"""The step-count floor: the least equal step of a partial-rollout stream, from the engine steps its responses need
(pure numbers).

:mod:`~pdsr_sdk.sim.partial_floor` prices a token made in a short step by the requests such a step can hold,
counting only the per-request cost ``c1``; so it lets a long response's steps be shared by as many requests as that
allows, whether or not the stream has that much work, and it leaves attention out. This floor counts the steps
instead. The step model is that of :mod:`~pdsr_sdk.sim.cost`: a step costs ``c0`` plus ``w = c1 + c2 * context``
for each request it runs (plus prefill), and makes one token for each.

- Split each step's ``c0`` over its requests in proportion to their ``w``. A response that makes its last ``x``
  tokens within the last step it runs in (the one that consumes it, or an earlier one where it finished whole while
  its group waited: then ``x`` is all of it, and none is partial) ran ``x`` steps of its own, one after another,
  within that step's ``T`` seconds; by Cauchy-Schwarz its share of their ``c0`` is at least
  ``c0 (sum sqrt(w_j))^2 / (T - c0 x)`` over those tokens ``j`` (``Z(x)`` engine steps; infinite where the ``x``
  tokens alone do not fit in ``T``). ``Z`` grows with ``x``: a long response made in one short step costs steps, and
  more where its context is long.
- The shares add up to the ``c0`` of every step run, and every step runs at most ``max_seqs`` requests and holds at
  most ``kv_tokens`` tokens in its KV cache, so in a steady state of equal steps
  ``engines * T >= V + c0 * max(N / max_seqs, C / kv_tokens, sum Z / steps)`` per step: ``V`` the consumed tokens'
  variable work (the work bound less its ``c0``), ``N`` their tokens, ``C`` the generated context their steps hold
  (a prompt's blocks may be shared by its samples, so prompts do not count). Where long responses fill the cache (a
  KV-bound workload) the middle term alone lifts the floor above the work bound.
- Under a budget on partial tokens the responses make at least ``(1 - budget)`` of their tokens in the last step
  each runs in (the tokens before it are partial where the response crossed an update, and pdsr counts at least
  those). The least ``sum Z`` over such splits is bounded below by its Lagrangian dual, each response's ``x`` taken
  on a grid of cells (``Z`` at a cell's start, the tokens at its end): a lower bound however ``Z`` curves.

The floor is the least ``T`` that satisfies it. Like the partial-budget floor it assumes equal steps and counts a
token under the version it is made in, and it holds for any placement, migration or order (no speculation: one
token a request a step). Every function has a naive twin (``*_naive``, plain float64 loops).
"""

from __future__ import annotations

import math

import numpy as np

from pdsr_sdk.sim.partial_floor import least_fitting

#: cells per response on which its in-step tokens are taken (the bound loosens by at most a cell's tokens each)
GRID = 64


def tail_sums(lengths, prompt_lens, *, c1: float, c2: float, grid: int = GRID) -> tuple[np.ndarray, np.ndarray,
                                                                                         np.ndarray]:
    """Per response (rows) at ``grid + 1`` points ``x_g = floor(L g / grid)``: ``x_g``, the sum of ``sqrt(w_j)``
    over its last ``x_g`` tokens and the sum of ``w_j`` (``w_j = c1 + c2 (prompt + j)``, token ``j`` from 0)."""
    n = np.asarray(lengths, dtype=np.int64)
    end = np.asarray(prompt_lens, dtype=np.int64) + n
    top = int(end.max(initial=0)) + 1
    w = c1 + c2 * np.arange(top, dtype=np.float64)
    root = np.concatenate(([0.0], np.cumsum(np.sqrt(w))))
    lin = np.concatenate(([0.0], np.cumsum(w)))
    x = (n[:, None] * np.arange(grid + 1)[None, :]) // grid
    start = end[:, None] - x
    e = end[:, None]
    return x.astype(np.float64), root[e] - root[start], lin[e] - lin[start]


def cell_steps(x: np.ndarray, root: np.ndarray, var: np.ndarray, step_s: float, c0: float) -> np.ndarray:
    """``Z(x_g)`` at every grid point: the least engine steps of ``c0`` the last ``x_g`` tokens are charged when made
    in one step of ``step_s`` seconds (inf where they do not fit alone)."""
    room = step_s - c0 * x
    with np.errstate(divide="ignore", invalid="ignore"):
        z = root * root / room
    return np.where((x == 0), 0.0, np.where((room > 0) & (c0 * x + var <= step_s), z, np.inf))


def _phi(lam: float, z: np.ndarray, x: np.ndarray, need: float) -> float:
    # each response's least Z - lam x over its cells (Z at a cell's start, x at its end), or x = 0
    v = np.min(z[:, :-1] - lam * x[:, 1:], axis=1)
    return lam * need + float(np.minimum(v, 0.0).sum())


def least_steps(z: np.ndarray, x: np.ndarray, need: float, *, iters: int = 60) -> float:
    """A lower bound on the least ``sum Z`` over splits making at least ``need`` tokens: the dual ``max_lam
    lam * need + sum_i min_cell (Z - lam x)``, concave in ``lam`` (golden-section search); inf where even every
    response's most tokens that fit fall short of ``need``."""
    if need <= 0:
        return 0.0
    # the most tokens a response may make: the end of its last cell that starts where it fits
    most = np.where(np.isfinite(z[:, :-1]), x[:, 1:], 0.0).max(axis=1).sum()
    if most < need * (1 - 1e-12):
        return math.inf
    hi = 1.0
    while _phi(2 * hi, z, x, need) > _phi(hi, z, x, need) and hi < 1e15:
        hi *= 2
    lo, hi = 0.0, 2 * hi
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = _phi(a, z, x, need), _phi(b, z, x, need)
    for _ in range(iters):
        if fa < fb:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = _phi(b, z, x, need)
        else:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = _phi(a, z, x, need)
    return max(fa, fb, _phi(0.0, z, x, need))


def generated_context(lengths) -> float:
    """The generated tokens the KV cache holds over the steps making ``lengths``, in all: ``j`` while token ``j``
    (from 0) is made."""
    n = np.asarray(lengths, dtype=np.float64)
    return float(np.sum(n * (n - 1) / 2))


def step_floor(lengths, prompt_lens, work_s: float, *, steps: int, engines: int, budget: float, c0: float,
               c1: float, c2: float, max_seqs: int, kv_tokens: float | None = None, grid: int = GRID,
               rel_tol: float = 1e-4) -> float:
    """The least equal step (seconds) in which ``engines`` engines make, step after step, the consumed responses of
    ``lengths`` tokens (prompts of ``prompt_lens``; consumed over ``steps`` steps; ``work_s`` their work bound per
    step, :func:`~pdsr_sdk.sim.cost.sample_work` summed / engines / steps) with at most ``budget`` of their tokens
    partial; ``kv_tokens``: an engine's KV-cache capacity in tokens (None: no bound from it)."""
    n = np.asarray(lengths, dtype=np.float64)
    tokens = float(n.sum()) / steps
    var = engines * work_s - c0 * tokens / max_seqs
    least = max(tokens / max_seqs, generated_context(lengths) / steps / kv_tokens if kv_tokens else 0.0)
    need = (1.0 - budget) * float(n.sum())
    x, root, lin = tail_sums(lengths, prompt_lens, c1=c1, c2=c2, grid=grid)

    def fits(t: float) -> bool:
        z = least_steps(cell_steps(x, root, lin, t, c0), x, need)
        return engines * t >= var + c0 * max(least, z / steps) * (1 - 1e-12)

    return least_fitting(fits, work_s, rel_tol)


# -- naive twins ------------------------------------------------------------------------------------------

def cell_steps_naive(lengths, prompt_lens, step_s: float, *, c0: float, c1: float, c2: float,
                     grid: int = GRID) -> tuple[list[list[float]], list[list[float]]]:
    """(grid points, ``Z`` at each) per response, token by token."""
    xs, zs = [], []
    for n, p in zip(lengths, prompt_lens):
        row_x, row_z = [], []
        for g in range(grid + 1):
            x = (int(n) * g) // grid
            root = sum(math.sqrt(c1 + c2 * (p + j)) for j in range(int(n) - x, int(n)))
            alone = sum(c0 + c1 + c2 * (p + j) for j in range(int(n) - x, int(n)))
            if x == 0:
                z = 0.0
            elif step_s - c0 * x > 0 and alone <= step_s:
                z = root * root / (step_s - c0 * x)
            else:
                z = math.inf
            row_x.append(float(x))
            row_z.append(z)
        xs.append(row_x)
        zs.append(row_z)
    return xs, zs


def least_steps_naive(xs: list[list[float]], zs: list[list[float]], need: float) -> float:
    """The dual of :func:`least_steps` maximised exactly: it is concave and piecewise linear in ``lam``, so its
    maximum is at 0 or where some response's best cell changes; every such ``lam`` is tried."""
    if need <= 0:
        return 0.0
    # a response's options: (Z at a cell's start, tokens at its end), and x = 0 at no cost
    options = [[(rz[g], rx[g + 1]) for g in range(len(rx) - 1) if math.isfinite(rz[g])] + [(0.0, 0.0)]
               for rx, rz in zip(xs, zs)]
    if sum(max(x for _, x in opts) for opts in options) < need * (1 - 1e-12):
        return math.inf
    lams = {0.0}
    for opts in options:
        for za, xa in opts:
            for zb, xb in opts:
                if xb > xa and zb > za:
                    lams.add((zb - za) / (xb - xa))

    def phi(lam: float) -> float:
        return lam * need + sum(min(z - lam * x for z, x in opts) for opts in options)

    return max(phi(lam) for lam in lams)


def step_floor_naive(lengths, prompt_lens, work_s: float, *, steps: int, engines: int, budget: float, c0: float,
                     c1: float, c2: float, max_seqs: int, kv_tokens: float | None = None, grid: int = GRID,
                     scan: int = 400, top: float | None = None) -> float:
    """Scan twin of :func:`step_floor`: the first of ``scan`` steps from ``work_s`` up to ``top`` (default: the
    longest response alone on an engine) that fits."""
    tokens = sum(lengths) / steps
    var = engines * work_s - c0 * tokens / max_seqs
    context = sum(j for n in lengths for j in range(int(n)))
    least = max(tokens / max_seqs, context / steps / kv_tokens if kv_tokens else 0.0)
    need = (1.0 - budget) * sum(lengths)
    if top is None:
        top = max(sum(c0 + c1 + c2 * (p + j) for j in range(int(n))) for n, p in zip(lengths, prompt_lens))
        top = max(top, work_s)
    for k in range(scan + 1):
        t = work_s + (top - work_s) * k / scan
        xs, zs = cell_steps_naive(lengths, prompt_lens, t, c0=c0, c1=c1, c2=c2, grid=grid)
        z = least_steps_naive(xs, zs, need)
        if engines * t >= var + c0 * max(least, z / steps) * (1 - 1e-12):
            return t
    return top
