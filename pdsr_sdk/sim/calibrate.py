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
#: running requests at which a fitted verify cost is written as the profile's [running, factor] pairs
VERIFY_SIZES = (1, 8, 32, 128, 256)
#: the verify price is fitted only where drafted tokens are at least this share of a pool's steps: below it the
#: timings cannot tell it from noise (a CPU run of the random tiny model drafted 30 tokens in 110k steps, and a
#: fifth coefficient then moved c0 by 40%)
MIN_DRAFT_SHARE = 0.01


@dataclass
class Span:
    engine: str          # unique per run: "<file index>/<engine name>"
    pool: str
    start: float
    end: float
    tokens: int
    context: int         # prompt + tokens before this span
    prefill: int         # uncached tokens prefilled when it joined
    steps: float = 0.0   # the steps it took: tokens, less the drafted tokens accepted with speculation
    drafted: float = 0.0  # drafted tokens its verify steps checked (speculation)
    #: speculation's counts: True when the engine reported them, False for a span of a speculative run that
    #: has none (vLLM reports none for an aborted request; they are estimated from the pool's other spans)
    counted: bool = True
    drafting_steps: float = 0.0   # of its steps, those in intervals where drafting ran (the fit's estimate)

    def __post_init__(self) -> None:
        if not self.steps:
            self.steps = float(self.tokens)


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
    #: from a run with speculation: seconds per drafted token checked, and the profile's ``speculation`` section
    verify_s_per_token: float | None = None
    speculation: dict[str, Any] | None = None

    def profile(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.coefficients)
        if self.max_num_seqs is not None:
            out["max_num_seqs"] = self.max_num_seqs
        if self.speculation is not None:
            out["speculation"] = self.speculation
        return out


def read_spans(paths, *, block_size: int = 16) -> list[Span]:
    """Every timed span of every trajectories file (engines namespaced per file)."""
    import pyarrow.parquet as pq

    spans: list[Span] = []
    first_span = 0
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
                drafted, accepted = seg.get("drafted_tokens"), seg.get("accepted_tokens")
                counted = drafted is not None and accepted is not None
                steps = n - min(int(accepted), n - 1) if counted else n   # (a verify step yields its own token)
                spans.append(Span(f"{fi}/{engine}", pool, float(a), float(b), int(n), context, int(prefill),
                                  float(steps), float(drafted or 0), counted))
        _share_prompts(spans, by_prompt, block_size)
        _estimate_uncounted(spans[first_span:])
        first_span = len(spans)
    return spans


def _estimate_uncounted(spans: list[Span]) -> None:
    """A run without speculation has no counts: every span is plain. In a run with it, a span without counts
    (an aborted request) gets the run's mean steps per token and drafted tokens per step."""
    counted = [s for s in spans if s.counted]
    if not counted:
        for s in spans:
            s.counted = True
        return
    per_token = sum(s.steps for s in counted) / sum(s.tokens for s in counted)
    per_step = sum(s.drafted for s in counted) / sum(s.steps for s in counted)
    for s in spans:
        if not s.counted:
            s.steps = max(1.0, s.tokens * per_token)
            s.drafted = s.steps * per_step


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


def calibrate(paths, *, block_size: int = 16, iterations: int = 8, min_spans: int = 8,
              per_pool: bool = True, speculation_max_batch: int | None = None) -> dict[str, PoolFit]:
    """Fit each pool's coefficients from the trajectories ``paths``; pools with too few spans are skipped.

    ``per_pool=False`` fits one set of coefficients to every span (engines of the same hardware and
    model: more data per coefficient) and reports it for each pool. From a run with speculation (spans
    with drafted tokens) a fifth coefficient is fitted, seconds per drafted token a step checks, and the
    profile gets a ``speculation`` section; ``speculation_max_batch`` is the batch size up to which the run
    drafted (None: the runs' summaries say, else drafting is taken to run at every batch size).
    """
    spans = read_spans(paths, block_size=block_size)
    if not spans:
        raise DataError(f"{', '.join(map(str, paths))}: no timed segments to fit (need end_time_s and tokens)")
    pools: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        pools[s.pool].append(s)
    seqs = _max_num_seqs(paths)
    spec = _speculative_settings(paths)
    mb = speculation_max_batch if speculation_max_batch is not None else spec.get("max_batch_size")
    k = int(spec.get("num_speculative_tokens") or 4)
    shared = (None if per_pool or len(spans) < min_spans
              else fit_pool(spans, iterations=iterations, max_batch=mb)[0])
    fits = {}
    for pool, ps in sorted(pools.items()):
        if len(ps) < min_spans and shared is None:
            continue
        theta, x, y, keep = fit_pool(ps, iterations=iterations, max_batch=mb)
        if shared is not None:   # the shared coefficients, with this pool's features for the diagnostics
            theta = shared
        pred, y, x = (x @ theta)[keep], y[keep], x[keep]
        ss_res = float(((y - pred) ** 2).sum())
        ss_tot = float(((y - y.mean()) ** 2).sum())
        coefficients = {k: float(v) for k, v in zip(COEFFS, theta)}
        verify = float(theta[4]) if len(theta) > 4 else None
        fits[pool] = PoolFit(
            pool=pool, coefficients=coefficients, spans=len(ps),
            engines=len({s.engine for s in ps}), r2=1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan,
            median_rel_error=float(np.median(np.abs(pred - y) / y)), max_num_seqs=seqs.get(pool),
            outliers=int((~keep).sum()) - sum(not s.counted for s in ps), verify_s_per_token=verify,
            speculation=None if verify is None else speculation_section(ps, coefficients, verify,
                                                                        seqs.get(pool) or 256, k, mb))
    if not fits:
        raise DataError(f"{', '.join(map(str, paths))}: no pool has {min_spans} or more timed segments to fit")
    return fits


def speculation_section(spans: list[Span], coefficients: dict[str, float], verify_s_per_token: float,
                        max_num_seqs: int, k: int = 4, max_batch: int | None = None) -> dict[str, Any]:
    """A profile's ``speculation`` section from a speculative run's spans and fitted costs.

    ``tokens_per_step`` and ``draft_load`` are those of the steps that drafted (the fit's estimate of each span's
    steps where drafting ran): (steps + accepted) / steps and drafted / (steps x k);
    ``verify_cost`` is a step's cost with every request checking k drafted tokens over a plain step's,
    1 + v R k / (c0 + c1 R + c2 R c), at the run's mean context c per request, for running counts R up to
    ``max_num_seqs``. The simulator scales that excess by draft_load, so the product, the run's drafted tokens
    per step, is what counts and the nominal k cancels. ``max_batch``: the batch size up to which the run
    drafted (None: left to the simulator's default)."""
    drafting = [s for s in spans if s.counted and s.drafted > 0 and s.drafting_steps > 0]
    steps = sum(s.drafting_steps for s in drafting)
    accepted = sum(s.tokens - s.steps for s in drafting)
    c0, c1, c2 = coefficients["c0_s"], coefficients["c1_s_per_seq"], coefficients["c2_s_per_token"]
    all_steps = sum(s.steps for s in spans)
    ctx = sum(s.steps * (s.context + 0.5 * s.tokens) for s in spans) / all_steps if all_steps else 0.0
    sizes = [r for r in VERIFY_SIZES if r <= max_num_seqs] or [1]
    cost = [[r, round(1.0 + verify_s_per_token * r * k / (c0 + c1 * r + c2 * r * ctx), 4)] for r in sizes]
    return {"tokens_per_step": round(max(1.0, (steps + accepted) / steps), 4) if steps else 1.0,
            "draft_load": round(min(1.0, sum(s.drafted for s in drafting) / (steps * k)), 4) if steps else 0.0,
            "verify_cost": cost, "num_speculative_tokens": k,
            **({"max_batch": int(max_batch)} if max_batch is not None else {})}


def _speculative_settings(paths) -> dict[str, Any]:
    """The runs' speculative settings (``max_batch_size``, ``num_speculative_tokens``) from their summary JSON
    files, where every summary that names them agrees; {} otherwise."""
    seen = [s for s in (summary.get("speculative_settings") for summary in _summaries(paths)) if isinstance(s, dict)]
    return seen[0] if seen and all(s == seen[0] for s in seen) else {}


def _summaries(paths):
    """The runs' summary JSON files (``<out>.summary.json``) that exist and read as objects."""
    for path in paths:
        try:
            summary = json.loads(Path(path).with_name(Path(path).stem + ".summary.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(summary, dict):
            yield summary


def _max_num_seqs(paths) -> dict[str, int]:
    """max_num_seqs per pool from the runs' summary JSON files (``<out>.summary.json``), when they agree."""
    seen: dict[str, set[int]] = defaultdict(set)
    for summary in _summaries(paths):
        for e in summary.get("engines") or []:
            if isinstance(e, dict) and "pool" in e and isinstance(e.get("max_num_seqs"), int):
                seen[e["pool"]].add(e["max_num_seqs"])
    return {pool: next(iter(v)) for pool, v in seen.items() if len(v) == 1}


def profile_yaml(fits: dict[str, PoolFit], sources) -> str:
    """The profile file text (``{pool: {coefficients...}}``) with the fit's diagnostics as comments."""
    import yaml

    lines = [f"# engine profiles fitted by `pdsr simulate calibrate` from: {', '.join(map(str, sources))}"]
    for f in fits.values():
        lines.append(f"# {f.pool}: {f.spans} spans on {f.engines} engine(s) ({f.outliers} outliers left out), "
                     f"R^2 {f.r2:.4f}, median |error| of span durations {100 * f.median_rel_error:.1f}%"
                     + ("" if f.verify_s_per_token is None else
                        f"; speculation: {f.verify_s_per_token:.3g} s per drafted token checked"))
    body = yaml.safe_dump({pool: f.profile() for pool, f in fits.items()}, sort_keys=False)
    return "\n".join(lines) + "\n" + body
