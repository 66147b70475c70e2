"""Assemble the seed 002 statistics of a length trace into one JSON-able report.

``analyze_trace`` computes every statistic with the kernels of ``stats`` and
returns plain dicts/lists/numbers (NaN becomes None); ``report_tables`` turns
a report into rows for printing. Definitions are in ``stats``; the choices
made where the seed is silent are listed in ``DEFINITIONS`` and copied into
every report so the numbers carry their meaning.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pdsr_sdk.analysis import stats
from pdsr_sdk.analysis.config import AnalyzeConfig
from pdsr_sdk.errors import DataError
from pdsr_sdk.traces.trace import LengthTrace

DEFINITIONS = {
    "cv": "per group std/mean of the N lengths; std with ddof=cv_ddof (1 = pandas' sample std); all-zero group -> 0",
    "spearman": "Spearman rank correlation (average ranks for ties) of sample 0 with sample j across groups, "
                "j=1..N-1; 'mean' averages j>=1, 'mean_incl_self' also averages in sample 0's own 1.0 as the "
                "original P-DSR study did (its 0.6699 is 0.6227 without it)",
    "top_k_recall": "|top-k of sample 0 ∩ top-k of sample j| / k, k = max(1, floor(top_k * G)), ties by group order",
    "safe_rate": "share of sample 0's top floor(top_k*G) groups inside sample j's top floor(safe_k*G), mean over j",
    "false_negatives": "groups with probe < L: group_rate = share with any later sample > L; sample_rate = share "
                       "of their later samples > L",
    "batch_capture": "consecutive batches of batch_prompts groups (a shorter last batch is kept); captured when a "
                     "group holding the batch's longest later sample has fewer than capture_top strictly longer "
                     "probes in the batch; cost_ratio = that sample / its group's probe (probe 0 counts as 1); "
                     "'missed' is over batches not captured (how bad the misses are)",
    "dispatch_v25": "per batch of B prompts: ceil(offload_fraction*B) longest-probe prompts go heavy with all N "
                    "samples; L_cut = probe of the shortest offloaded prompt; fast samples (probes included) "
                    "break when length > floor(cap_multiplier*L_cut) and waste cap tokens each; fast_prompts_broke "
                    "counts fast prompts with any breaking sample",
}


def analyze_trace(trace: LengthTrace, config: AnalyzeConfig | None = None) -> dict[str, Any]:
    """Every statistic of seed 002 on ``trace`` (equal group sizes, N >= 2), as a JSON-able dict."""
    cfg = config or AnalyzeConfig()
    trace.require_rectangular("analysis needs")
    if trace.samples_per_group < 2:
        raise DataError(f"{trace.source or 'trace'}: analysis needs at least 2 samples per group (sample 0 is "
                        f"the probe), the trace has N = {trace.samples_per_group}")
    x = trace.matrix()
    g, n = x.shape

    cv = stats.group_cv(x, ddof=cfg.cv_ddof)
    rho = stats.spearman_vs_probe(x)
    k = stats.top_k_count(g, cfg.top_k)
    recall = stats.top_k_recall(x, cfg.top_k)
    safe = stats.safe_rate(x, cfg.top_k, cfg.safe_k)
    fn = stats.false_negatives(x, cfg.fn_length)
    cap = stats.batch_capture(x, cfg.batch_prompts, cfg.capture_top)
    missed = cap.cost_ratio[~cap.captured]
    disp_b = cfg.dispatch_batch_prompts or cfg.batch_prompts
    disp = stats.dispatch_v25(x, disp_b, cfg.offload_fraction, cfg.cap_multiplier)

    report: dict[str, Any] = {
        "source": trace.source,
        "config": cfg.model_dump(),
        "trace": _trace_summary(trace, x),
        "cv": {"ddof": cfg.cv_ddof, **_summary(cv), "max_prompt_id": trace.prompt_ids[int(np.nanargmax(cv))]
               if np.isfinite(cv).any() else None},
        "spearman": {"per_sample": rho.tolist(), "mean": _nanmean(rho),
                     "mean_incl_self": _nanmean(np.append(rho, 1.0))},
        "top_k_recall": {"k_frac": cfg.top_k, "k": k, "per_sample": recall.tolist(), "mean": float(recall.mean())},
        "safe_rate": {"k_frac": cfg.top_k, "safe_frac": cfg.safe_k, "k": k,
                      "k_safe": stats.top_k_count(g, cfg.safe_k), "per_sample": safe.tolist(),
                      "mean": float(safe.mean())},
        "false_negatives": {
            "length": fn.length, "groups_below": fn.groups_below, "groups_exceeding": fn.groups_exceeding,
            "group_rate": fn.group_rate, "samples_below": fn.samples_below,
            "samples_exceeding": fn.samples_exceeding, "sample_rate": fn.sample_rate,
        },
        "batch_capture": {
            "batch_prompts": cap.batch_prompts, "capture_top": cap.capture_top, "batches": cap.batches,
            "captured": int(cap.captured.sum()), "capture_rate": cap.capture_rate,
            "cost_ratio_missed": {"batches": int(missed.size), "mean": _nanmean(missed), "max": _nanmax(missed)},
            "cost_ratio_all": {"mean": _nanmean(cap.cost_ratio), "max": _nanmax(cap.cost_ratio)},
        },
        "dispatch_v25": {
            "batch_prompts": disp.batch_prompts, "offload_fraction": disp.offload_fraction, "cap_multiplier": disp.cap_multiplier,
            "heavy_prompts_per_batch": stats.offload_count(disp.offload_fraction, min(disp_b, g)),
            "batches": disp.batches, "samples": disp.samples,
            "heavy": disp.heavy, "fast": disp.fast, "fast_ok": disp.fast_ok, "fast_broke": disp.fast_broke,
            "heavy_frac": disp.heavy / disp.samples, "fast_frac": disp.fast / disp.samples,
            "fast_ok_frac": _ratio(disp.fast_ok, disp.fast), "fast_broke_frac": _ratio(disp.fast_broke, disp.fast),
            "fast_prompts": disp.fast_prompts, "fast_prompts_broke": disp.fast_prompts_broke,
            "fast_prompts_broke_frac": _ratio(disp.fast_prompts_broke, disp.fast_prompts),
            "tokens": disp.tokens, "wasted_tokens": disp.wasted_tokens,
            "wasted_token_frac": _ratio(disp.wasted_tokens, disp.tokens),
            "l_cut_median": float(np.median(disp.l_cut)), "cap_median": float(np.median(disp.cap)),
        },
        "definitions": DEFINITIONS,
    }
    return _jsonable(report)


def _trace_summary(trace: LengthTrace, x: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {
        "groups": int(x.shape[0]), "samples_per_group": int(x.shape[1]), "samples": int(x.size),
        "tokens": int(x.sum()),
        "length": _quantiles(x.ravel()),
        "probe_length": _quantiles(x[:, 0]),
        "prompt_length": _quantiles(trace.prompt_lens),
    }
    if trace.finish_reasons is not None:
        names, counts = np.unique(trace.finish_reasons.astype(str), return_counts=True)
        out["finish_reasons"] = {str(k): int(v) for k, v in zip(names, counts)}
    if trace.durations_s is not None:
        d = trace.durations_s
        out["duration_s"] = _quantiles(d)
        busy = float(d.sum())
        out["tokens_per_s_of_sample_time"] = float(x.sum()) / busy if busy > 0 else None
    return out


def _quantiles(v: np.ndarray) -> dict[str, float]:
    v = np.asarray(v, dtype=np.float64)
    q = np.percentile(v, [50, 90, 99])
    return {"min": float(v.min()), "mean": float(v.mean()), "median": float(q[0]), "p90": float(q[1]),
            "p99": float(q[2]), "max": float(v.max())}


def _summary(v: np.ndarray) -> dict[str, float | None]:
    finite = v[np.isfinite(v)]
    if finite.size == 0:
        return {"mean": None, "median": None, "p90": None, "max": None}
    return {"mean": float(finite.mean()), "median": float(np.median(finite)),
            "p90": float(np.percentile(finite, 90)), "max": float(finite.max())}


def _nanmean(v: np.ndarray) -> float:
    v = np.asarray(v, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else math.nan


def _nanmax(v: np.ndarray) -> float:
    v = np.asarray(v, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.max()) if v.size else math.nan


def _ratio(a: int, b: int) -> float:
    return a / b if b else math.nan


def _jsonable(obj: Any) -> Any:
    """numpy scalars -> Python, NaN/inf -> None, recursively."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else None
    return obj


def report_tables(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Rows for printing a report: ``summary``, ``per_sample`` and ``dispatch`` tables."""
    t, cv, sp = report["trace"], report["cv"], report["spearman"]
    rc, sf, fn = report["top_k_recall"], report["safe_rate"], report["false_negatives"]
    bc, dv = report["batch_capture"], report["dispatch_v25"]
    pct = lambda v: None if v is None else 100.0 * v  # noqa: E731
    c = report["config"]
    # the P-DSR study's numbers (0.5B model, MATH), shown where the settings match the study's
    ref = {
        "groups": "7424 x 8", "cv": "0.29 / 1.18" if c["cv_ddof"] == 1 else "",
        "spearman": "0.623 (0.670 incl. self)",
        "recall": "30.7%" if c["top_k"] == 0.1 else "",
        "safe": "51.1%" if (c["top_k"], c["safe_k"]) == (0.1, 0.2) else "",
        "fn": "63%" if c["fn_length"] == 512 else "",
        "capture": "46.98% of 464" if (c["batch_prompts"], c["capture_top"]) == (16, 3) else "",
        "cost": "4.67x / 68.36x" if (c["batch_prompts"], c["capture_top"]) == (16, 3) else "",
    }
    length = t["length"]
    rows = [
        ("groups x samples", f"{t['groups']} x {t['samples_per_group']}", ref["groups"]),
        ("length median / p99 / max", f"{length['median']:.0f} / {length['p99']:.0f} / {length['max']:.0f}", ""),
        (f"CV mean / max (ddof={cv['ddof']})", _pair(cv["mean"], cv["max"]), ref["cv"]),
        ("Spearman(sample 0, j) mean", _fmt(sp["mean"]), ref["spearman"]),
        (f"top-{rc['k_frac']:.0%} recall mean", _pct(rc["mean"]), ref["recall"]),
        (f"safe rate (top {sf['k_frac']:.0%} in top {sf['safe_frac']:.0%})", _pct(sf["mean"]), ref["safe"]),
        (f"false negatives @{fn['length']} (groups / samples)",
         f"{_pct(fn['group_rate'])} / {_pct(fn['sample_rate'])}", ref["fn"]),
        (f"batch capture (B={bc['batch_prompts']}, top {bc['capture_top']})",
         f"{_pct(bc['capture_rate'])} of {bc['batches']}", ref["capture"]),
        ("cost ratio of misses mean / max",
         _pair(bc["cost_ratio_missed"]["mean"], bc["cost_ratio_missed"]["max"], "x"), ref["cost"]),
    ]
    summary = [{"statistic": name, "value": value, "ref 0.5B MATH": r} for name, value, r in rows]
    per_sample = [
        {"sample": j + 1, "spearman": _num(sp["per_sample"][j]), "top_k_recall_%": pct(rc["per_sample"][j]),
         "safe_rate_%": pct(sf["per_sample"][j])}
        for j in range(len(sp["per_sample"]))
    ]
    dispatch = [
        {"worker": "heavy (offloaded)", "samples": dv["heavy"], "%": pct(dv["heavy_frac"]), "of": "all"},
        {"worker": "fast", "samples": dv["fast"], "%": pct(dv["fast_frac"]), "of": "all"},
        {"worker": "  fast succeeded", "samples": dv["fast_ok"], "%": pct(dv["fast_ok_frac"]), "of": "fast"},
        {"worker": "  fast broke -> retry", "samples": dv["fast_broke"], "%": pct(dv["fast_broke_frac"]),
         "of": "fast"},
    ]
    return {"summary": summary, "per_sample": per_sample, "dispatch": dispatch}


def _num(v):
    return math.nan if v is None else v


def _fmt(v, suffix: str = "") -> str:
    return "n/a" if v is None else f"{v:.3g}{suffix}"


def _pair(a, b, suffix: str = "") -> str:
    return f"{_fmt(a, suffix)} / {_fmt(b, suffix)}"


def _pct(v) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"
