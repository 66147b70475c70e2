"""The regression behind calibrate: one pool's spans cut into each engine's intervals of a fixed batch, and
their coefficients fitted by non-negative least squares, alternating with re-estimated step counts and leaving
out spans far from the fit (the model is in :mod:`pdsr_sdk.sim.calibrate`'s docstring)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from pdsr_sdk.sim.calibrate_spans import Span

#: the verify price is fitted only where drafted tokens are at least this share of a pool's steps: below it the
#: timings cannot tell it from noise (a CPU run of the random tiny model drafted 30 tokens in 110k steps, and a
#: fifth coefficient then moved c0 by 40%)
MIN_DRAFT_SHARE = 0.01


@dataclass
class _Engine:
    """One engine's spans cut into elementary intervals."""

    spans: list[Span]
    edges: np.ndarray            # breakpoints [I + 1]
    running: np.ndarray          # R_i [I]
    joins: np.ndarray            # Q_i [I]
    members: list[np.ndarray]    # per span, the interval indices it covers
    drafts: np.ndarray           # V_i: drafted tokens a step checks (speculation; from the previous pass)
    ctx: np.ndarray | None = None  # C_i: context tokens in the batch (from the previous pass)


def _cut(spans: list[Span]) -> _Engine:
    times = np.unique(np.array([t for s in spans for t in (s.start, s.end)]))
    lo = np.searchsorted(times, [s.start for s in spans])
    hi = np.searchsorted(times, [s.end for s in spans])
    n_int = len(times) - 1
    running = np.zeros(n_int + 1)
    np.add.at(running, lo, 1)
    np.add.at(running, hi, -1)
    running = np.cumsum(running)[:n_int]
    joins = np.zeros(n_int)
    np.add.at(joins, lo, [s.prefill for s in spans])
    members = [np.arange(a, b) for a, b in zip(lo, hi)]
    return _Engine(spans, times, running, joins, members, np.zeros(n_int))


def _features(eng: _Engine, theta: np.ndarray | None, verify: bool = False,
              max_batch: int | None = None) -> np.ndarray:
    """Per span ``[steps, sum D R, sum D C, sum Q]`` with step counts D from ``theta`` (None: uniform in time);
    with ``verify``, a fifth column ``sum D V``, V the drafted tokens a step of the interval checks: each
    running span's drafted tokens spread evenly over its steps in intervals where drafting ran (at most
    ``max_batch`` running; None: every interval)."""
    y = np.diff(eng.edges)
    if theta is None:
        rate = y
    else:
        c0, c1, c2, p = theta[:4]
        v = theta[4] if verify else 0.0
        rate = np.maximum(y - p * eng.joins, 1e-12 * y) / (c0 + c1 * eng.running + c2 * eng.ctx + v * eng.drafts)
    ctx = np.zeros_like(y)
    drafts = np.zeros_like(y)
    can_draft = eng.running <= max_batch if max_batch is not None else np.ones(len(y), dtype=bool)
    weights = []
    for s, idx in zip(eng.spans, eng.members):
        w = rate[idx]
        total = w.sum()
        w = s.steps * w / total if total > 0 else np.full(len(idx), s.steps / max(len(idx), 1))
        weights.append(w)
        # mean context of this request over the interval's steps (a step adds tokens / steps of them)
        g = s.tokens / s.steps
        ctx[idx] += s.context + g * (np.cumsum(w) - w) + 0.5 * g * np.maximum(w - 1.0, 0.0)
        if verify and s.drafted > 0:
            mask = can_draft[idx]
            drafting_steps = float(w[mask].sum())
            if drafting_steps <= 0:   # it drafted where the batch says it could not: spread it over all
                mask, drafting_steps = np.ones(len(idx), dtype=bool), float(w.sum())
            drafts[idx[mask]] += s.drafted / drafting_steps
            s.drafting_steps = drafting_steps
    eng.ctx = ctx
    eng.drafts = drafts
    rows = [(s.steps, float(w @ eng.running[idx]), float(w @ ctx[idx]), float(eng.joins[idx].sum()))
            + ((float(w @ drafts[idx]),) if verify else ())
            for s, idx, w in zip(eng.spans, eng.members, weights)]
    return np.array(rows, dtype=np.float64)


def nnls_small(x: np.ndarray, y: np.ndarray, required: tuple[int, ...] = ()) -> np.ndarray:
    """Exact non-negative least squares for a few columns: the best feasible fit over every support (that
    holds the ``required`` columns)."""
    k = x.shape[1]
    best, best_res = np.zeros(k), float(y @ y)
    for size in range(1, k + 1):
        for support in itertools.combinations(range(k), size):
            if not set(required) <= set(support):
                continue
            cols = list(support)
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if (coef < 0).any():
                continue
            res = y - x[:, cols] @ coef
            r = float(res @ res)
            if r < best_res - 1e-15 * max(best_res, 1e-300):
                best_res, best = r, np.zeros(k)
                best[cols] = coef
    return best


def fit_pool(spans: list[Span], *, iterations: int = 8, outlier_mads: float = 5.0, max_batch: int | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Coefficients [c0, c1, c2, p] for one pool's spans (and ``verify_s_per_token`` fifth, where a span
    drafted, only while at most ``max_batch`` requests ran); also the features, durations and the inlier mask.

    Spans whose weighted residual is more than ``outlier_mads`` robust standard deviations (1.4826 x MAD)
    from the fit are dropped from the regression and the fit is redone, until the set is stable (4 fits
    at most): a stall of the machine or an engine's first, warm-up steps would otherwise pull every
    coefficient. They still count as running requests of their engine.
    """
    by_engine: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        by_engine[s.engine].append(s)
    engines = [_cut(v) for v in by_engine.values()]
    verify = sum(s.drafted for s in spans) >= MIN_DRAFT_SHARE * sum(s.steps for s in spans)
    y = np.array([s.end - s.start for eng in engines for s in eng.spans])
    n = np.array([s.steps for eng in engines for s in eng.spans], dtype=np.float64)
    # a span whose speculation counts were estimated still runs in its engine's batch, but is not fitted
    keep = np.array([s.counted for eng in engines for s in eng.spans], dtype=bool)
    counted = keep.copy()
    for _ in range(4):
        theta, x = _fit_passes(engines, y, n, keep, iterations, verify, max_batch)
        e = (y - x @ theta) / np.sqrt(n)
        mad = 1.4826 * float(np.median(np.abs(e[keep] - np.median(e[keep]))))
        # (a floor of 2% of a typical span's scaled duration: near-perfect data has no outliers)
        new_keep = counted & (np.abs(e) <= outlier_mads * mad + 0.02 * float(np.median(y / np.sqrt(n))))
        if (new_keep == keep).all() or new_keep.sum() < 4:
            break
        keep = new_keep   # judged afresh against each fit: a span flagged by a skewed first fit may return
    return theta, x, y, keep


def _fit_passes(engines: list[_Engine], y: np.ndarray, n: np.ndarray, keep: np.ndarray,
                iterations: int, verify: bool = False, max_batch: int | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    scale = np.where(keep, 1.0 / np.sqrt(n), 0.0)
    theta = None
    best = None
    for _ in range(iterations):
        x = np.vstack([_features(eng, theta, verify, max_batch) for eng in engines])
        # columns differ by orders of magnitude: normalise them for a well-conditioned solve
        norm = np.linalg.norm(x * scale[:, None], axis=0)
        norm[norm == 0] = 1.0
        coef = nnls_small(x * scale[:, None] / norm, y * scale) / norm
        if coef[0] <= 0:   # the step time must stay positive; fall back to the mean step time
            mean = max(float(y[keep].sum() / n[keep].sum()), 1e-9)
            # (with speculation a step may be priced by its running and drafted tokens alone, as on a CPU,
            # where compute grows with both: then only a trace of c0, not a second price on top)
            coef[0] = mean * (1e-6 if verify and coef[1:].any() else 1.0)
        loss = float((((y - x @ coef) * scale) ** 2).sum())
        if best is not None and loss >= best[0] * (1 - 1e-9):
            break   # noisy timings can make the re-estimated steps worse: keep the best pass
        best = (loss, coef, x)
        theta = coef
    return best[1], best[2]

