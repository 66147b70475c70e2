"""Assemble the seed 002 statistics of a length trace into one JSON-able report.

``analyze_trace`` computes every statistic with the kernels of ``stats`` and
returns plain dicts/lists/numbers (NaN becomes None; a statistic that cannot
mean anything on the trace is None with its reason in ``warnings``);
``report_tables`` and ``report_notes`` (:mod:`pdsr_sdk.analysis.report_text`) turn
it into what ``pdsr analyze`` prints. Definitions are in ``stats``; the choices
made where the seed is silent are listed in ``DEFINITIONS`` and copied into
every report so the numbers carry their meaning.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pdsr_sdk.analysis import stats
from pdsr_sdk.analysis.config import AnalyzeConfig
from pdsr_sdk.analysis.dispatch_replay import dispatch_v25
from pdsr_sdk.errors import DataError
from pdsr_sdk.traces.trace import LengthTrace

#: a share of responses at the length cap from which ties there dominate the rank statistics
AT_CAP_NOTE = 0.2

DEFINITIONS = {
    "ties": "rank statistics (top_k_recall, safe_rate, batch_capture) break ties uniformly at random, "
            "independently per sample, and report the exact expectation over tie orders: a tie block straddling "
            "a top-k boundary puts each member in with probability (slots left) / (block size). A probe with no "
            "signal then scores chance (k/G, capture_top/B) however many lengths tie, e.g. at the cap",
    "cv": "per group std/mean of the N lengths; std with ddof=cv_ddof (1 = pandas' sample std); all-zero group -> 0",
    "spearman": "Spearman rank correlation (average ranks for ties) of sample 0 with sample j across groups, "
                "j=1..N-1; 'mean' averages j>=1, 'mean_incl_self' also averages in sample 0's own 1.0 as the "
                "original P-DSR study did (its 0.6699 is 0.6227 without it)",
    "top_k_recall": "E|top-k of sample 0 ∩ top-k of sample j| / k over random tie orders, k = floor(top_k * G) "
                    "(n/a when 0); chance = k/G",
    "safe_rate": "expected share of sample 0's top floor(top_k*G) groups inside sample j's top floor(safe_k*G), "
                 "ties at random, mean over j (n/a when either is 0); chance = floor(safe_k*G)/G",
    "false_negatives": "groups with probe < L: group_rate = share with any later sample > L; sample_rate = share "
                       "of their later samples > L; n/a when the responses were cut at a cap <= L "
                       "and none is longer than L (none can exceed it)",
    "batch_capture": "consecutive batches of batch_prompts groups (a shorter last batch is kept); a batch is "
                     "captured when the group holding its longest later sample (one of the tied holders, chosen "
                     "uniformly) is among the batch's capture_top longest probes (ties at random); capture_rate "
                     "is the expected share over the batches of more than capture_top groups (ranked_batches; "
                     "smaller ones are captured whatever the probe), chance_rate = mean capture_top/size; "
                     "cost_ratio = that sample / its group's probe (probe 0 counts as 1), expected per batch; "
                     "'missed' is over batches not captured (how bad the misses are): batches = expected count, "
                     "mean = expected ratio per expected miss, max = largest ratio that can be missed",
    "dispatch_v25": "per batch of B prompts (dispatch_batch_prompts, default 128 as seed 002's table): "
                    "floor(offload_fraction*B) longest-probe prompts (at least 1; seed 002 offloads 25 of 128) go "
                    "heavy with all N samples (equal probes by group order: one fixed tie order blind to the later "
                    "samples, so not in the probe's favour, but one draw rather than an expectation); L_cut = probe "
                    "of the shortest offloaded prompt; fast samples (probes included) break when length > "
                    "floor(cap_multiplier*L_cut) and waste cap tokens each; fast_prompts_broke counts fast prompts "
                    "with any breaking sample. Seed 002's table counts prompts (heavy 1450 = 19.5%, fast 5974, "
                    "retry 777 = 13.0% of fast), shown as the console's 'ref seed 002' column where the settings "
                    "match. Responses cut at the trace's cap cannot exceed it, so breaks past the cap go unseen "
                    "(optimistic when many responses are at the cap)",
    "at_cap": "trace.at_cap: share of responses at the length cap: finish_reason 'length' where the trace has "
              "finish reasons (basis 'finish_reason'), else length == the trace's max length (basis 'max_length'); "
              "length / min_length: the longest / shortest of them (they differ when responses were cut at "
              "different lengths: environment tokens of multi-turn responses, a context limit after prompts of "
              "different lengths)",
    "reference": "the console's 'ref 0.5B MATH' column: the P-DSR length study's published numbers (0.5B model on "
                 "MATH, 7424 groups x 8), shown next to statistics computed with its settings; the study's tie "
                 "rule is not published, these numbers are expectations over random tie orders",
    "warnings": "statistics that are n/a, and why (degenerate traces: one group, all lengths equal, an empty "
                "top-k set, no batch larger than capture_top, a cap at or below fn_length, no probe below "
                "fn_length), and groups left out (a failed sample: trace.failed)",
}


def analyze_trace(trace: LengthTrace, config: AnalyzeConfig | None = None) -> dict[str, Any]:
    """Every statistic of seed 002 on ``trace`` (equal group sizes, N >= 2), as a JSON-able dict.

    Statistics that cannot mean anything on this trace are None, with the
    reason in ``report["warnings"]`` (the SDK prints nothing).
    """
    cfg = config or AnalyzeConfig()
    trace, failed, failed_groups = without_failed(trace)
    trace.require_rectangular("analysis needs")
    if trace.samples_per_group < 2:
        raise DataError(f"{trace.source or 'trace'}: analysis needs at least 2 samples per group (sample 0 is "
                        f"the probe), the trace has N = {trace.samples_per_group}")
    x = trace.matrix()
    g, n = x.shape

    cv = stats.group_cv(x, ddof=cfg.cv_ddof)
    rho = stats.spearman_vs_probe(x)
    k = stats.top_k_count(g, cfg.top_k)
    k_safe = stats.top_k_count(g, cfg.safe_k)
    recall = stats.top_k_recall(x, cfg.top_k)
    safe = stats.safe_rate(x, cfg.top_k, cfg.safe_k)
    fn = stats.false_negatives(x, cfg.fn_length)
    cap = stats.batch_capture(x, cfg.batch_prompts, cfg.capture_top)
    disp_b = cfg.dispatch_batch_prompts
    disp = dispatch_v25(x, disp_b, cfg.offload_fraction, cfg.cap_multiplier)
    summary = _trace_summary(trace, x)
    at_cap = summary["at_cap"]

    warnings: list[str] = []
    if failed:
        warnings.append(f"{failed} sample(s) failed (finish_reason 'failed': an agent raised or timed out, an engine "
                        f"refused or died), so their lengths are not a response's: their {failed_groups} group(s) are "
                        f"left out of every statistic, {g} of {g + failed_groups} remain")
    summary["failed"] = {"samples": failed, "groups_left_out": failed_groups}
    rank_na = capture_na = False
    if g == 1:
        rank_na = True
        warnings.append("one group: Spearman, top-K recall, safe rate and batch capture rank groups against each "
                        "other and are n/a")
    elif (x == x.flat[0]).all():
        rank_na = True
        warnings.append(f"every length is {int(x.flat[0])}: there is nothing to rank; Spearman, top-K recall, "
                        "safe rate and batch capture are n/a")
    else:
        if (x[:, 0] == x[0, 0]).all():
            warnings.append(f"every probe is {int(x[0, 0])} tokens: the probe ranks nothing (Spearman n/a; "
                            "recall, safe rate and capture are at chance)")
        flat = [j for j in range(1, n) if (x[:, j] == x[0, j]).all()]
        if flat and not (x[:, 0] == x[0, 0]).all():
            said = ", ".join(f"sample {j} ({int(x[0, j])} tokens)" for j in flat[:5])
            said += " ..." if len(flat) > 5 else ""
            warnings.append(f"Spearman is n/a for {len(flat)} later sample(s) whose every length is the same: {said}")
        if k == 0:
            warnings.append(f"top-K recall and safe rate are n/a: floor({cfg.top_k:g} x {g} groups) = 0, the top "
                            f"set is empty (it needs {math.ceil(1 / cfg.top_k - 1e-9)} groups)")
        if not cap.ranked.any():
            capture_na = True
            warnings.append(f"batch capture is n/a: no batch has more than capture_top = {cfg.capture_top} groups, "
                            "so every batch is captured whatever the probe")
    if rank_na:
        rho, recall, safe = (np.full(n - 1, np.nan) for _ in range(3))
    capture_na = capture_na or rank_na
    # n/a only when the data agrees that none can exceed fn_length: responses cut at different lengths ('length' at
    # the context limit, after prompts of different lengths) leave longer ones that stopped, which are measured
    fn_na = cut_at_cap(at_cap) and at_cap["length"] <= cfg.fn_length and int(x.max()) <= cfg.fn_length
    if fn_na:
        where = (f"were cut at {cut_lengths(at_cap)}" if at_cap["basis"] == "finish_reason" else
                 f"end at the trace's max length, {at_cap['length']} (no finish reasons: taken as the cap)")
        # the summary table's share, to its digit (2.5%, not a rounded 2%; 0.4%, not 0%)
        warnings.append(f"false negatives at {cfg.fn_length} are n/a: {pct_text(at_cap['share'])} of responses "
                        f"{where}, so no later sample can exceed {cfg.fn_length}")
    elif fn.groups_below == 0:
        warnings.append(f"false negatives at {cfg.fn_length} are n/a: no group's probe is below {cfg.fn_length} "
                        f"tokens (the shortest is {int(x[:, 0].min())}), so no group counts as short (fn_length "
                        f"sets the threshold)")

    ranked = cap.ranked
    miss_prob = 1.0 - cap.capture_prob[ranked]
    expected_missed = float(miss_prob.sum())
    report: dict[str, Any] = {
        "source": trace.source,
        "config": cfg.model_dump(),
        "trace": summary,
        "cv": {"ddof": cfg.cv_ddof, **_summary(cv), "max_prompt_id": trace.prompt_ids[int(np.nanargmax(cv))]
               if np.isfinite(cv).any() else None},
        "spearman": {"per_sample": rho.tolist(), "mean": _nanmean(rho),
                     "mean_incl_self": _nanmean(np.append(rho, 1.0)) if np.isfinite(rho).any() else None},
        "top_k_recall": {"k_frac": cfg.top_k, "k": k, "chance": k / g if k and not rank_na else None,
                         "per_sample": recall.tolist(), "mean": _nanmean(recall)},
        "safe_rate": {"k_frac": cfg.top_k, "safe_frac": cfg.safe_k, "k": k, "k_safe": k_safe,
                      "chance": k_safe / g if k and k_safe and not rank_na else None,
                      "per_sample": safe.tolist(), "mean": _nanmean(safe)},
        "false_negatives": {
            "length": fn.length, "groups_below": fn.groups_below, "groups_exceeding": fn.groups_exceeding,
            "group_rate": None if fn_na else fn.group_rate, "samples_below": fn.samples_below,
            "samples_exceeding": fn.samples_exceeding, "sample_rate": None if fn_na else fn.sample_rate,
        },
        "batch_capture": {
            "batch_prompts": cap.batch_prompts, "capture_top": cap.capture_top, "batches": cap.batches,
            "ranked_batches": int(ranked.sum()),
            "captured": None if capture_na else float(cap.capture_prob[ranked].sum()),
            "capture_rate": None if capture_na else cap.capture_rate,
            "chance_rate": None if capture_na else cap.chance_rate,
            "cost_ratio_missed": {
                "batches": None if capture_na else expected_missed,
                "mean": None if capture_na or expected_missed <= 0 else
                float(cap.miss_cost[ranked].sum()) / expected_missed,
                "max": None if capture_na else _nanmax(cap.miss_max[ranked])},
            "cost_ratio_all": {"mean": _nanmean(cap.cost_ratio), "max": _nanmax(cap.cost_ratio)},
        },
        "dispatch_v25": {
            "batch_prompts": disp.batch_prompts, "offload_fraction": disp.offload_fraction,
            "cap_multiplier": disp.cap_multiplier,
            "heavy_prompts_per_batch": stats.offload_count(disp.offload_fraction, min(disp_b, g)),
            "batches": disp.batches, "samples": disp.samples,
            "heavy": disp.heavy, "fast": disp.fast, "fast_ok": disp.fast_ok, "fast_broke": disp.fast_broke,
            "heavy_frac": disp.heavy / disp.samples, "fast_frac": disp.fast / disp.samples,
            "fast_ok_frac": _ratio(disp.fast_ok, disp.fast), "fast_broke_frac": _ratio(disp.fast_broke, disp.fast),
            "prompts": disp.heavy_prompts + disp.fast_prompts, "heavy_prompts": disp.heavy_prompts,
            "heavy_prompts_frac": disp.heavy_prompts / (disp.heavy_prompts + disp.fast_prompts),
            "fast_prompts": disp.fast_prompts, "fast_prompts_ok": disp.fast_prompts_ok,
            "fast_prompts_ok_frac": _ratio(disp.fast_prompts_ok, disp.fast_prompts),
            "fast_prompts_broke": disp.fast_prompts_broke,
            "fast_prompts_broke_frac": _ratio(disp.fast_prompts_broke, disp.fast_prompts),
            "tokens": disp.tokens, "wasted_tokens": disp.wasted_tokens,
            "wasted_token_frac": _ratio(disp.wasted_tokens, disp.tokens),
            "l_cut_median": float(np.median(disp.l_cut)), "cap_median": float(np.median(disp.cap)),
        },
        "warnings": warnings,
        "definitions": DEFINITIONS,
    }
    return _jsonable(report)


def without_failed(trace: LengthTrace) -> tuple[LengthTrace, int, int]:
    """``trace`` without the groups holding a failed sample (finish_reason 'failed': its length is where it broke off,
    not a response's; a group with one is no longer N comparable samples), the failed samples and those groups'
    count. A trace whose every group holds one is a ``DataError``."""
    if trace.finish_reasons is None:
        return trace, 0, 0
    failed = trace.finish_reasons.astype(str) == "failed"
    if not failed.any():
        return trace, 0, 0
    group = np.repeat(np.arange(trace.num_groups), trace.group_sizes)
    drop = np.zeros(trace.num_groups, dtype=bool)
    drop[group[failed]] = True
    if drop.all():
        raise DataError(f"{trace.source or 'trace'}: every group has a failed sample (finish_reason 'failed', "
                        f"{int(failed.sum())} in all), so none is N responses to compare; nothing to analyze")
    keep = ~drop[group]
    pick = lambda v: None if v is None else v[keep]  # noqa: E731
    kept = np.flatnonzero(~drop)
    sizes = trace.group_sizes[kept]
    out = LengthTrace(prompt_ids=[trace.prompt_ids[i] for i in kept], prompt_lens=trace.prompt_lens[kept],
                      lengths=trace.lengths[keep], offsets=np.r_[0, np.cumsum(sizes)],
                      durations_s=pick(trace.durations_s), finish_reasons=pick(trace.finish_reasons),
                      source=trace.source, rewards=pick(trace.rewards),
                      turns=None if trace.turns is None else trace.turns.take(np.flatnonzero(keep)))
    return out, int(failed.sum()), int(drop.sum())


def cut_at_cap(at_cap: dict[str, Any]) -> bool:
    """Whether the trace's responses were cut at a length cap (any 'length' finish, else a large share at the max)."""
    if at_cap["length"] is None:
        return False
    if at_cap["basis"] == "finish_reason":
        return at_cap["share"] > 0
    # one response at the max is no pile-up (a small trace's longest is 25% of 4 samples)
    return at_cap["share"] >= AT_CAP_NOTE and at_cap["samples"] >= 2


def length_cap(report: dict[str, Any]) -> int | None:
    """The length an :func:`analyze_trace` report's responses were cut at, as its notes and false-negative warning
    read it (any finish_reason 'length', else at least 20% of responses, two or more, at the trace's max); None if
    uncut."""
    at_cap = report["trace"]["at_cap"]
    return at_cap["length"] if cut_at_cap(at_cap) else None


def _at_cap(trace: LengthTrace, x: np.ndarray) -> dict[str, Any]:
    if trace.finish_reasons is not None:
        cut = trace.finish_reasons.astype(str) == "length"
        lengths = np.asarray(trace.lengths)[cut]
        length, shortest = (int(lengths.max()), int(lengths.min())) if cut.any() else (None, None)
        return {"basis": "finish_reason", "length": length, "min_length": shortest, "samples": int(cut.sum()),
                "share": float(cut.mean())}
    top = int(x.max())
    at = int((x == top).sum())
    return {"basis": "max_length", "length": top, "min_length": top, "samples": at, "share": at / x.size}


def cut_lengths(at_cap: dict[str, Any], unit: str = " tokens", to: str = " to ") -> str:
    """The length a report's responses at the cap were cut at, or their range when they were cut at several."""
    low, high = at_cap["min_length"], at_cap["length"]
    return f"{high}{unit}" if low == high else f"{low}{to}{high}{unit}"


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
    out["at_cap"] = _at_cap(trace, x)
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


def pct_text(v) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"
