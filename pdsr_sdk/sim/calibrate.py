"""Fit the simulator's cost model per pool from the segment timings of ``pdsr rollout`` runs.

Data: every span of a trajectories file's ``segments`` column (engine,
``num_tokens`` n, ``submit_time_s`` a, ``end_time_s`` b, start context =
prompt + ``start_token``). When the span records ``first_token_time_s`` (real
engines do), it starts there with n - 1 decode steps: the time before (the
request's trip to the engine, any wait in its queue, the prefill step) is not
decode time. From all spans of one engine we rebuild its batch over time:
the span endpoints cut its timeline into elementary intervals in which the
set of running requests is fixed (R_i of them), context tokens C_i grow with
the steps, and Q_i prefill tokens join at the interval's start (the whole
context of a new request; only the uncached tail of a continuation on the
same engine; past the prompt's whole blocks for a request that joins while
another request of its prompt runs there, as vLLM's prefix caching and the
simulator's ``prompt_cache`` have it).

Model: a span's duration is the time of the n steps it took part in::

    b - a = sum_i [ D_i (c0 + c1 R_i + c2 C_i) + p Q_i ]    over its intervals i, sum_i D_i = n

where D_i are its steps in interval i. D is not observed, so the fit
alternates: (1) with the current coefficients, estimate each interval's step
count as (duration - prefill) / step time, share the span's n tokens over its
intervals in those proportions (first pass: in proportion to time); (2)
weighted non-negative least squares of span durations on the features
``[n, sum D R, sum D C, sum Q]`` (weight 1/n: a span of n steps has n
independent step-time errors), solved exactly by trying every support of the
four coefficients. Passes stop when the weighted residual stops improving
(noisy timings can make re-estimated step counts worse) and the best pass is
kept. On traces the simulator itself produced the coefficients come back
within a few percent (tests) when the spans' first-token times are left out:
timed from its first token, a span no longer holds its prefill step, and the
prefill price is then fitted only from requests that join during it.

Robustness: spans far from the fit (more than 5 robust standard deviations;
an engine's warm-up steps, a stall of the machine) are left out of the
regression and the fit is redone; the count is reported.

Assumptions: requests join at step boundaries, no preemption (KV not full),
and the engine is idle outside spans (scheduling overhead between a segment's
end and the next submit is charged to nobody).
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pdsr_sdk.errors import DataError
from pdsr_sdk.sim.cost import cached_prefix, uncached_tokens

COEFFS = ("c0_s", "c1_s_per_seq", "c2_s_per_token", "prefill_s_per_token")


@dataclass
class Span:
    engine: str          # unique per run: "<file index>/<engine name>"
    pool: str
    start: float
    end: float
    tokens: int
    context: int         # prompt + tokens before this span
    prefill: int         # uncached tokens prefilled when it joined


@dataclass
class PoolFit:
    pool: str
    coefficients: dict[str, float]
    spans: int
    engines: int
    r2: float
    median_rel_error: float
    max_num_seqs: int | None = None
    outliers: int = 0

    def profile(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.coefficients)
        if self.max_num_seqs is not None:
            out["max_num_seqs"] = self.max_num_seqs
        return out


def read_spans(paths, *, block_size: int = 16) -> list[Span]:
    """Every timed span of every trajectories file (engines namespaced per file)."""
    import pyarrow.parquet as pq

    spans: list[Span] = []
    for fi, path in enumerate(paths):
        path = Path(path)
        if not path.exists():
            raise DataError(f"{path}: trajectories file does not exist")
        try:
            table = _read_table(path, pq)
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types
            raise DataError(f"{path}: cannot read trajectories: {exc}") from None
        missing = [c for c in ("prompt_length", "segments") if c not in table.column_names]
        if missing:
            raise DataError(f"{path}: missing column(s) {', '.join(missing)}; calibrate needs a trajectories file "
                            f"written by `pdsr rollout` (with its 'segments' timings)")
        plens = table["prompt_length"].to_pylist()
        prompts = table["prompt_id"].to_pylist() if "prompt_id" in table.column_names else [None] * len(plens)
        by_prompt: dict[tuple[str, object], list[tuple[float, int, int, int]]] = {}   # (engine, prompt) -> its spans
        for row, (plen, segs) in enumerate(zip(plens, table["segments"].to_pylist())):
            prev = None
            for k, seg in enumerate(segs or []):
                try:
                    engine, pool = seg["engine"], str(seg["pool"]).split("<-")[0]
                    a, b, n, start = seg["submit_time_s"], seg["end_time_s"], seg["num_tokens"], seg["start_token"]
                except (KeyError, TypeError):
                    raise DataError(f"{path}: row {row}: segments[{k}] lacks engine/pool/submit_time_s/end_time_s/"
                                    f"num_tokens/start_token") from None
                context = int(plen) + int(start)
                cont = (prev is not None and prev["engine"] == engine and prev["end_time_s"] is not None
                        and abs(prev["end_time_s"] - a) < 1e-6 and prev["start_token"] + prev["num_tokens"] == start)
                prev = seg
                first = seg.get("first_token_time_s")
                if first is not None and n is not None:
                    # The span really ran from its first token on (before: a wait in the engine's
                    # queue, then the prefill step that sampled the first token): n - 1 decode steps.
                    a, n, context = first, n - 1, context + 1
                if b is None or n is None or n <= 0 or not (b > a):
                    continue
                prefill = uncached_tokens(context, context, block_size) if cont else context
                if prompts[row] is not None:
                    by_prompt.setdefault((engine, prompts[row]), []).append((float(a), row, len(spans), int(plen)))
                spans.append(Span(f"{fi}/{engine}", pool, float(a), float(b), int(n), context, int(prefill)))
        _share_prompts(spans, by_prompt, block_size)
    return spans


def _share_prompts(spans: list[Span], by_prompt: dict, block: int) -> None:
    """A span that joined while another span of its prompt ran on its engine found the prompt's whole blocks
    cached: its prefill is at most what lies past them (``by_prompt``: (engine, prompt) -> (start, row, span
    index, prompt length); earlier joins, by start then row, count as running)."""
    for members in by_prompt.values():
        if len(members) < 2:
            continue
        members.sort()
        for i, (start, row, k, plen) in enumerate(members):
            if any(spans[j].end > start and r != row for _, r, j, _ in members[:i]):
                sp = spans[k]
                sp.prefill = min(sp.prefill, uncached_tokens(sp.context, cached_prefix(plen, block), block))


def _read_table(path: Path, pq):
    import pyarrow as pa

    with path.open("rb") as fh:
        head = fh.read(8)
    if head.startswith(b"PAR1"):
        names = pq.read_schema(path).names
        return pq.read_table(path, columns=[c for c in ("prompt_id", "prompt_length", "segments") if c in names])
    with pa.memory_map(str(path)) as source:
        reader = pa.ipc.open_file(source) if head.startswith(b"ARROW1") else pa.ipc.open_stream(source)
        return reader.read_all()


@dataclass
class _Engine:
    """One engine's spans cut into elementary intervals."""

    spans: list[Span]
    edges: np.ndarray            # breakpoints [I + 1]
    running: np.ndarray          # R_i [I]
    joins: np.ndarray            # Q_i [I]
    members: list[np.ndarray]    # per span, the interval indices it covers
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
    return _Engine(spans, times, running, joins, members)


def _features(eng: _Engine, theta: np.ndarray | None) -> np.ndarray:
    """Per span ``[n, sum D R, sum D C, sum Q]`` with step counts D from ``theta`` (None: uniform in time)."""
    y = np.diff(eng.edges)
    if theta is None:
        rate = y
    else:
        c0, c1, c2, p = theta
        rate = np.maximum(y - p * eng.joins, 1e-12 * y) / (c0 + c1 * eng.running + c2 * eng.ctx)
    ctx = np.zeros_like(y)
    weights = []
    for s, idx in zip(eng.spans, eng.members):
        w = rate[idx]
        total = w.sum()
        w = s.tokens * w / total if total > 0 else np.full(len(idx), s.tokens / max(len(idx), 1))
        weights.append(w)
        # mean context of this request over the interval's steps
        ctx[idx] += s.context + (np.cumsum(w) - w) + 0.5 * np.maximum(w - 1.0, 0.0)
    eng.ctx = ctx
    rows = [(s.tokens, float(w @ eng.running[idx]), float(w @ ctx[idx]), float(eng.joins[idx].sum()))
            for s, idx, w in zip(eng.spans, eng.members, weights)]
    return np.array(rows, dtype=np.float64)


def nnls_small(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a few columns: the best feasible fit over every support."""
    k = x.shape[1]
    best, best_res = np.zeros(k), float(y @ y)
    for size in range(1, k + 1):
        for support in itertools.combinations(range(k), size):
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


def fit_pool(spans: list[Span], *, iterations: int = 8, outlier_mads: float = 5.0
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Coefficients [c0, c1, c2, p] for one pool's spans; also the features, durations and the inlier mask.

    Spans whose weighted residual is more than ``outlier_mads`` robust standard deviations (1.4826 x MAD)
    from the fit are dropped from the regression and the fit is redone, until the set is stable (4 fits
    at most): a stall of the machine or an engine's first, warm-up steps would otherwise pull every
    coefficient. They still count as running requests of their engine.
    """
    by_engine: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        by_engine[s.engine].append(s)
    engines = [_cut(v) for v in by_engine.values()]
    y = np.array([s.end - s.start for eng in engines for s in eng.spans])
    n = np.array([s.tokens for eng in engines for s in eng.spans], dtype=np.float64)
    keep = np.ones(len(y), dtype=bool)
    for _ in range(4):
        theta, x = _fit_passes(engines, y, n, keep, iterations)
        e = (y - x @ theta) / np.sqrt(n)
        mad = 1.4826 * float(np.median(np.abs(e[keep] - np.median(e[keep]))))
        # (a floor of 2% of a typical span's scaled duration: near-perfect data has no outliers)
        new_keep = np.abs(e) <= outlier_mads * mad + 0.02 * float(np.median(y / np.sqrt(n)))
        if (new_keep == keep).all() or new_keep.sum() < 4:
            break
        keep = new_keep   # judged afresh against each fit: a span flagged by a skewed first fit may return
    return theta, x, y, keep


def _fit_passes(engines: list[_Engine], y: np.ndarray, n: np.ndarray, keep: np.ndarray,
                iterations: int) -> tuple[np.ndarray, np.ndarray]:
    scale = np.where(keep, 1.0 / np.sqrt(n), 0.0)
    theta = None
    best = None
    for _ in range(iterations):
        x = np.vstack([_features(eng, theta) for eng in engines])
        # columns differ by orders of magnitude: normalise them for a well-conditioned solve
        norm = np.linalg.norm(x * scale[:, None], axis=0)
        norm[norm == 0] = 1.0
        coef = nnls_small(x * scale[:, None] / norm, y * scale) / norm
        if coef[0] <= 0:   # the step time must stay positive; fall back to the mean step time
            coef[0] = max(float(y[keep].sum() / n[keep].sum()), 1e-9)
        loss = float((((y - x @ coef) * scale) ** 2).sum())
        if best is not None and loss >= best[0] * (1 - 1e-9):
            break   # noisy timings can make the re-estimated steps worse: keep the best pass
        best = (loss, coef, x)
        theta = coef
    return best[1], best[2]


def calibrate(paths, *, block_size: int = 16, iterations: int = 8, min_spans: int = 8,
              per_pool: bool = True) -> dict[str, PoolFit]:
    """Fit each pool's coefficients from the trajectories ``paths``; pools with too few spans are skipped.

    ``per_pool=False`` fits one set of coefficients to every span (engines of the same hardware and
    model: more data per coefficient) and reports it for each pool.
    """
    spans = read_spans(paths, block_size=block_size)
    if not spans:
        raise DataError(f"{', '.join(map(str, paths))}: no timed segments to fit (need end_time_s and tokens)")
    pools: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        pools[s.pool].append(s)
    seqs = _max_num_seqs(paths)
    shared = None if per_pool or len(spans) < min_spans else fit_pool(spans, iterations=iterations)[0]
    fits = {}
    for pool, ps in sorted(pools.items()):
        if len(ps) < min_spans and shared is None:
            continue
        theta, x, y, keep = fit_pool(ps, iterations=iterations)
        if shared is not None:   # the shared coefficients, with this pool's features for the diagnostics
            theta = shared
        pred, y, x = (x @ theta)[keep], y[keep], x[keep]
        ss_res = float(((y - pred) ** 2).sum())
        ss_tot = float(((y - y.mean()) ** 2).sum())
        fits[pool] = PoolFit(
            pool=pool, coefficients={k: float(v) for k, v in zip(COEFFS, theta)}, spans=len(ps),
            engines=len({s.engine for s in ps}), r2=1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan,
            median_rel_error=float(np.median(np.abs(pred - y) / y)), max_num_seqs=seqs.get(pool),
            outliers=int((~keep).sum()))
    if not fits:
        raise DataError(f"{', '.join(map(str, paths))}: no pool has {min_spans} or more timed segments to fit")
    return fits


def _max_num_seqs(paths) -> dict[str, int]:
    """max_num_seqs per pool from the runs' summary JSON files (``<out>.summary.json``), when they agree."""
    seen: dict[str, set[int]] = defaultdict(set)
    for path in paths:
        summary = Path(path).with_name(Path(path).stem + ".summary.json")
        try:
            engines = json.loads(summary.read_text()).get("engines") or []
        except (OSError, ValueError):
            continue
        for e in engines:
            if isinstance(e, dict) and "pool" in e and isinstance(e.get("max_num_seqs"), int):
                seen[e["pool"]].add(e["max_num_seqs"])
    return {pool: next(iter(v)) for pool, v in seen.items() if len(v) == 1}


def profile_yaml(fits: dict[str, PoolFit], sources) -> str:
    """The profile file text (``{pool: {coefficients...}}``) with the fit's diagnostics as comments."""
    import yaml

    lines = [f"# engine profiles fitted by `pdsr simulate calibrate` from: {', '.join(map(str, sources))}"]
    for f in fits.values():
        lines.append(f"# {f.pool}: {f.spans} spans on {f.engines} engine(s) ({f.outliers} outliers left out), "
                     f"R^2 {f.r2:.4f}, median |error| of span durations {100 * f.median_rel_error:.1f}%")
    body = yaml.safe_dump({pool: f.profile() for pool, f in fits.items()}, sort_keys=False)
    return "\n".join(lines) + "\n" + body
