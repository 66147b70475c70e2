"""What ``pdsr analyze`` prints of an :func:`~pdsr_sdk.analysis.report.analyze_trace` report: the rows of its
tables (``report_tables``) and the notes under them (``report_notes``)."""

from __future__ import annotations

from typing import Any

from pdsr_sdk.analysis.report import AT_CAP_NOTE, cut_at_cap, cut_lengths, pct_text


def report_tables(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Rows for printing a report: ``summary``, ``per_sample`` and ``dispatch`` tables."""
    t, cv, sp = report["trace"], report["cv"], report["spearman"]
    rc, sf, fn = report["top_k_recall"], report["safe_rate"], report["false_negatives"]
    bc, dv = report["batch_capture"], report["dispatch_v25"]
    pct = lambda v: "n/a" if v is None else 100.0 * v  # noqa: E731
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
    fn_value = ("n/a" if fn["group_rate"] is None and fn["groups_below"] else
                f"{pct_text(fn['group_rate'])} / {pct_text(fn['sample_rate'])}")
    rows = [
        ("groups x samples", f"{t['groups']} x {t['samples_per_group']}", ref["groups"]),
        ("length median / p99 / max", f"{length['median']:.0f} / {length['p99']:.0f} / {length['max']:.0f}", ""),
        ("responses at the cap", _at_cap_text(t["at_cap"]), ""),
        (f"CV mean / max (ddof={cv['ddof']})", _pair(cv["mean"], cv["max"]), ref["cv"]),
        ("Spearman(sample 0, j) mean", _fmt(sp["mean"]), ref["spearman"]),
        (f"top-{rc['k_frac']:.0%} recall mean", _chance(rc["mean"], rc["chance"]), ref["recall"]),
        (f"safe rate (top {sf['k_frac']:.0%} in top {sf['safe_frac']:.0%})", _chance(sf["mean"], sf["chance"]),
         ref["safe"]),
        (f"false negatives @{fn['length']} (groups / samples)", fn_value, ref["fn"]),
        (f"batch capture (B={bc['batch_prompts']}, top {bc['capture_top']})",
         "n/a" if bc["capture_rate"] is None else
         f"{_chance(bc['capture_rate'], bc['chance_rate'])} of {bc['ranked_batches']}", ref["capture"]),
        ("cost ratio of misses mean / max",
         _pair(bc["cost_ratio_missed"]["mean"], bc["cost_ratio_missed"]["max"], "x"), ref["cost"]),
    ]
    summary = [{"statistic": name, "value": value, "ref 0.5B MATH": r} for name, value, r in rows]
    per_sample = [
        {"sample": j + 1, "spearman": "n/a" if sp["per_sample"][j] is None else sp["per_sample"][j],
         "top_k_recall_%": pct(rc["per_sample"][j]),
         "safe_rate_%": pct(sf["per_sample"][j])}
        for j in range(len(sp["per_sample"]))
    ]
    # seed 002's dispatch table (prompts; 58 batches of 128, top 20%, cap 1.5 x L_cut), where the settings match
    seed = (dv["batch_prompts"], dv["offload_fraction"], dv["cap_multiplier"]) == (128, 0.2, 1.5)
    ref_rows = ("1450 (19.5%)", "5974 (80.5%)", "5197 (87.0%)", "777 (13.0%)") if seed else ("",) * 4
    rows_d = [("heavy (offloaded)", "heavy_prompts", "heavy", "heavy_frac", "all"),
              ("fast", "fast_prompts", "fast", "fast_frac", "all"),
              ("  fast succeeded", "fast_prompts_ok", "fast_ok", "fast_ok_frac", "fast"),
              ("  fast broke -> retry", "fast_prompts_broke", "fast_broke", "fast_broke_frac", "fast")]
    dispatch = [
        {"worker": worker, "prompts": dv[p], "prompts_%": pct(_share(dv, p)), "samples": dv[s], "samples_%": pct(dv[f]),
         "of": of, "ref seed 002 (prompts)": r}
        for (worker, p, s, f, of), r in zip(rows_d, ref_rows)
    ]
    return {"summary": summary, "per_sample": per_sample, "dispatch": dispatch}


def _share(dv: dict[str, Any], key: str) -> float | None:
    """A prompt count of the dispatch replay as a share: of all prompts (heavy, fast) or of the fast ones."""
    whole = dv["prompts"] if key in ("heavy_prompts", "fast_prompts") else dv["fast_prompts"]
    return dv[key] / whole if whole else None


def report_notes(report: dict[str, Any]) -> list[str]:
    """One-line notes printed under the summary table: what the reference column is, and what ties at the cap do."""
    notes = []
    if any(row["ref 0.5B MATH"] for row in report_tables(report)["summary"][1:]):
        notes.append("ref 0.5B MATH: the P-DSR length study's published numbers (0.5B model on MATH), where the "
                     "settings match.")
    at_cap = report["trace"]["at_cap"]
    if cut_at_cap(at_cap) and at_cap["share"] >= AT_CAP_NOTE and at_cap["min_length"] != at_cap["length"]:
        # cut at many lengths (environment tokens of multi-turn responses, context-limit cuts): they do not tie
        notes.append(f"note: {at_cap['share']:.0%} of responses were cut (finish_reason 'length') at "
                     f"{cut_lengths(at_cap)}, not at one cap: their full lengths are unknown, so recall, safe rate "
                     "and capture rank them by where they were cut, and the V2.5 replay sees no breaks past them.")
    elif cut_at_cap(at_cap) and at_cap["share"] >= AT_CAP_NOTE:
        notes.append(f"note: {at_cap['share']:.0%} of responses end at the cap ({at_cap['length']} tokens) and tie "
                     "there, which no probe can rank: it limits recall, safe rate and capture whatever the model, "
                     "and the V2.5 replay sees no breaks past the cap.")
    return notes


def _at_cap_text(at_cap: dict[str, Any]) -> str:
    if at_cap["length"] is None:
        return "0.0% (finish_reason 'length')"
    how = "finish_reason 'length'" if at_cap["basis"] == "finish_reason" else "length = max, no finish reasons"
    return f"{pct_text(at_cap['share'])} at {cut_lengths(at_cap, '', '..')} ({how})"


def _chance(v, chance) -> str:
    return pct_text(v) if v is None or chance is None else f"{pct_text(v)} (chance {pct_text(chance)})"


def _fmt(v, suffix: str = "") -> str:
    return "n/a" if v is None else f"{v:.3g}{suffix}"


def _pair(a, b, suffix: str = "") -> str:
    return f"{_fmt(a, suffix)} / {_fmt(b, suffix)}"
