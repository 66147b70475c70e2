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

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pdsr_sdk.errors import DataError
from pdsr_sdk.sim.calibrate_fit import fit_pool
from pdsr_sdk.sim.calibrate_spans import Span, read_spans

COEFFS = ("c0_s", "c1_s_per_seq", "c2_s_per_token", "prefill_s_per_token")
#: running requests at which a fitted verify cost is written as the profile's [running, factor] pairs
VERIFY_SIZES = (1, 8, 32, 128, 256)
#: a fit below this R^2 or above this median |error| of span durations is reported as not to be trusted: clean
#: CPU runs fit at R^2 0.8-0.9 and 5-15%; a run disturbed by other work on its cores gave R^2 -24 and 177%
MIN_R2, MAX_MEDIAN_ERROR = 0.5, 0.25


@dataclass
class PoolFit:
    pool: str
    coefficients: dict[str, float]
    spans: int
    engines: int
    r2: float
    median_rel_error: float
    max_num_seqs: int | None = None
    #: the pool's engines' KV-cache capacity in tokens, from the runs' summaries (None: not recorded there)
    kv_cache_tokens: int | None = None
    outliers: int = 0
    #: from a run with speculation: seconds per drafted token checked, and the profile's ``speculation`` section
    verify_s_per_token: float | None = None
    speculation: dict[str, Any] | None = None

    def profile(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.coefficients)
        if self.max_num_seqs is not None:
            out["max_num_seqs"] = self.max_num_seqs
        if self.kv_cache_tokens is not None:
            out["kv_cache_tokens"] = self.kv_cache_tokens
        if self.speculation is not None:
            out["speculation"] = self.speculation
        return out


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
    seqs, kv = _engine_limit(paths, "max_num_seqs"), _engine_limit(paths, "kv_cache_tokens")
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
            kv_cache_tokens=kv.get(pool),
            outliers=int((~keep).sum()) - sum(not s.counted for s in ps), verify_s_per_token=verify,
            speculation=None if verify is None else speculation_section(ps, coefficients, verify,
                                                                        seqs.get(pool) or 256, k, mb))
    if not fits:
        raise DataError(f"{', '.join(map(str, paths))}: no pool has {min_spans} or more timed segments to fit")
    return fits


def fit_warnings(fits: dict[str, PoolFit]) -> list[str]:
    """One line per pool whose fit explains too little of its span timings to simulate with (MIN_R2,
    MAX_MEDIAN_ERROR)."""
    return [f"{f.pool}: the fit explains little of the span timings (R^2 {f.r2:.3g}, median |error| "
            f"{100 * f.median_rel_error:.1f}%; {f.spans} spans): too few, or timed while other work shared the "
            f"engines' cores or devices; a simulation with this profile is not a prediction, measure a longer or "
            f"quieter run" for f in fits.values()
            if (not math.isnan(f.r2) and f.r2 < MIN_R2) or f.median_rel_error > MAX_MEDIAN_ERROR]


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


def _engine_limit(paths, key: str) -> dict[str, int]:
    """An engine limit (``max_num_seqs``, ``kv_cache_tokens``) per pool from the runs' summary JSON files
    (``<out>.summary.json``), where the pool's engines that record it agree."""
    seen: dict[str, set[int]] = defaultdict(set)
    for summary in _summaries(paths):
        for e in summary.get("engines") or []:
            if isinstance(e, dict) and "pool" in e and isinstance(e.get(key), int):
                seen[e["pool"]].add(e[key])
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
