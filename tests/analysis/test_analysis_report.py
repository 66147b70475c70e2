"""The `pdsr analyze` report: its numbers are the kernels', strict JSON with n/a as null, warnings on degenerate
traces and responses at the cap, bad input, and the plots."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pdsr_sdk.analysis import (
    AnalyzeConfig,
    analyze_trace,
    batch_capture,
    dispatch_v25,
    false_negatives,
    group_cv,
    report_notes,
    report_tables,
    safe_rate,
    spearman_vs_probe,
    top_k_recall,
    write_plots,
)
from pdsr_sdk.errors import ConfigValueError, DataError
from pdsr_sdk.traces import LengthTrace, synth_trace


def test_report_numbers_are_the_kernels():
    trace = synth_trace(groups=100, n=6, seed=1, tokens_per_s=20)
    cfg = AnalyzeConfig(top_k=0.2, safe_k=0.3, fn_length=400, batch_prompts=8, capture_top=2,
                        dispatch_batch_prompts=10, offload_fraction=0.3, cap_multiplier=1.25, cv_ddof=0)
    report = analyze_trace(trace, cfg)
    x = trace.matrix()
    assert report["trace"]["groups"] == 100 and report["trace"]["samples_per_group"] == 6
    assert report["trace"]["tokens"] == int(x.sum())
    assert report["cv"]["mean"] == pytest.approx(group_cv(x, 0).mean())
    assert report["cv"]["max"] == pytest.approx(group_cv(x, 0).max())
    assert report["spearman"]["per_sample"] == pytest.approx(spearman_vs_probe(x).tolist())
    assert report["spearman"]["mean_incl_self"] == pytest.approx((spearman_vs_probe(x).sum() + 1) / 6)
    assert report["top_k_recall"]["k"] == 20
    assert report["top_k_recall"]["mean"] == pytest.approx(top_k_recall(x, 0.2).mean())
    assert report["safe_rate"]["mean"] == pytest.approx(safe_rate(x, 0.2, 0.3).mean())
    assert report["false_negatives"]["group_rate"] == pytest.approx(false_negatives(x, 400).group_rate)
    cap = batch_capture(x, 8, 2)
    bc = report["batch_capture"]
    assert bc["batches"] == 13 and bc["ranked_batches"] == 13    # 100 = 12 x 8 + 4, and 4 > capture_top
    assert bc["capture_rate"] == pytest.approx(cap.capture_rate)
    assert bc["chance_rate"] == pytest.approx((12 * 2 / 8 + 2 / 4) / 13)
    missed = 1 - cap.capture_prob
    assert bc["cost_ratio_missed"]["batches"] == pytest.approx(missed.sum())
    if missed.sum():
        assert bc["cost_ratio_missed"]["mean"] == pytest.approx(cap.miss_cost.sum() / missed.sum())
        assert bc["cost_ratio_missed"]["max"] == pytest.approx(np.nanmax(cap.miss_max))
    assert report["top_k_recall"]["chance"] == 0.2 and report["safe_rate"]["chance"] == 0.3
    assert report["warnings"] == []
    d = dispatch_v25(x, 10, 0.3, 1.25)
    dv = report["dispatch_v25"]
    assert (dv["batch_prompts"], dv["heavy"], dv["fast_broke"]) == (10, d.heavy, d.fast_broke)
    assert dv["heavy_prompts_per_batch"] == 3
    assert dv["heavy_frac"] + dv["fast_frac"] == pytest.approx(1.0)
    assert report["trace"]["finish_reasons"]["stop"] + report["trace"]["finish_reasons"].get("length", 0) == 600
    assert report["trace"]["tokens_per_s_of_sample_time"] == pytest.approx(20.0)
    tables = report_tables(report)
    assert len(tables["per_sample"]) == 5
    assert [r["samples"] for r in tables["dispatch"]] == [d.heavy, d.fast, d.fast_ok, d.fast_broke]


def test_report_is_strict_json_with_nan_as_null():
    import json

    # every probe equal -> Spearman undefined
    trace = LengthTrace.from_matrix(np.array([[5, 1, 2], [5, 3, 4], [5, 6, 8]]))
    report = analyze_trace(trace)
    assert report["spearman"]["per_sample"] == [None, None]
    assert report["spearman"]["mean"] is None and report["spearman"]["mean_incl_self"] is None
    assert any("every probe is 5 tokens" in w for w in report["warnings"])
    json.loads(json.dumps(report, allow_nan=False))


RANKED = ("top_k_recall", "safe_rate")


def _na_rank_stats(report) -> bool:
    return (all(report[key]["mean"] is None and set(report[key]["per_sample"]) == {None} for key in RANKED)
            and report["spearman"]["mean"] is None and report["batch_capture"]["capture_rate"] is None
            and report["batch_capture"]["cost_ratio_missed"]["mean"] is None)


def test_degenerate_traces_say_na_with_a_warning():
    import json

    # all lengths equal: the kernels give chance; the report says there is nothing to rank
    equal = analyze_trace(LengthTrace.from_matrix(np.full((64, 4), 300)))
    assert _na_rank_stats(equal)
    assert any(w.startswith("every length is 300") for w in equal["warnings"])
    # one group
    one = analyze_trace(LengthTrace.from_matrix(np.array([[5, 9, 2]])), AnalyzeConfig(top_k=1.0, safe_k=1.0))
    assert _na_rank_stats(one) and one["warnings"][0].startswith("one group")
    # the top 10% of 9 groups is empty: n/a, not the single longest group
    small = analyze_trace(LengthTrace.from_matrix(np.arange(27).reshape(9, 3)))
    assert small["top_k_recall"]["k"] == 0 and small["top_k_recall"]["mean"] is None
    assert small["safe_rate"]["mean"] is None and small["spearman"]["mean"] == pytest.approx(1.0)
    assert any("floor(0.1 x 9 groups) = 0" in w and "needs 10 groups" in w for w in small["warnings"])
    # a safe set narrower than the top set is refused, naming both keys (it gave a rate that could not reach 1)
    with pytest.raises(ConfigValueError, match=r"safe_k \(0.1\) must be at least top_k \(0.2\)"):
        AnalyzeConfig(top_k=0.2, safe_k=0.1)
    # top 20% of 9 is 1 group, and so is the safe set of 20%
    safe_only = analyze_trace(LengthTrace.from_matrix(np.arange(27).reshape(9, 3)), AnalyzeConfig(top_k=0.2,
                                                                                                  safe_k=0.2))
    assert safe_only["top_k_recall"]["mean"] == 1.0 and safe_only["safe_rate"]["mean"] == 1.0
    # batches no larger than capture_top are captured whatever the probe
    tiny_batches = analyze_trace(LengthTrace.from_matrix(np.arange(60).reshape(20, 3)),
                                 AnalyzeConfig(batch_prompts=3, capture_top=3))
    assert tiny_batches["batch_capture"]["capture_rate"] is None
    assert any(w.startswith("batch capture is n/a") for w in tiny_batches["warnings"])
    for report in (equal, one, small, safe_only, tiny_batches):
        json.loads(json.dumps(report, allow_nan=False))


def test_responses_at_the_cap_are_counted_and_censor_false_negatives():
    x = np.array([[100, 512, 300], [512, 200, 512], [50, 60, 70], [400, 512, 80]])
    reasons = np.where(x == 512, "length", "stop")
    report = analyze_trace(LengthTrace.from_matrix(x, finish_reasons=reasons))
    assert report["trace"]["at_cap"] == {"basis": "finish_reason", "length": 512, "min_length": 512, "samples": 4,
                                         "share": 4 / 12}
    fn = report["false_negatives"]
    assert fn["group_rate"] is None and fn["sample_rate"] is None and fn["groups_below"] == 3
    assert any("false negatives at 512 are n/a" in w and "cut at 512 tokens" in w for w in report["warnings"])
    # below the cap the rate is measured
    assert analyze_trace(LengthTrace.from_matrix(x, finish_reasons=reasons),
                         AnalyzeConfig(fn_length=250))["false_negatives"]["group_rate"] == 0.5
    # without finish reasons the cap is the max length, and it censors only when many responses reach it
    plain = analyze_trace(LengthTrace.from_matrix(x))
    assert plain["trace"]["at_cap"]["basis"] == "max_length" and plain["false_negatives"]["group_rate"] is None
    few = x.copy()
    few[few == 512] = 500
    few[0, 1] = 512
    assert analyze_trace(LengthTrace.from_matrix(few))["false_negatives"]["group_rate"] == 0.0
    notes = report_notes(report)
    assert any("33% of responses end at the cap (512 tokens)" in n for n in notes)
    assert any(n.startswith("ref 0.5B MATH:") for n in notes)
    assert not any("at the cap" in n for n in report_notes(analyze_trace(LengthTrace.from_matrix(few))))


def test_a_cut_below_the_threshold_does_not_hide_longer_responses_that_stopped():
    # 'length' at 300 and 400 tokens (a context limit after long prompts) while other responses stopped past 512:
    # false negatives at 512 were n/a, 'so no later sample can exceed 512', yet 2 of 6 later samples below do
    x = np.array([[100, 300, 600], [200, 400, 100], [50, 700, 80], [900, 100, 90]])
    reasons = np.full(x.shape, "stop", dtype=object)
    reasons[0, 1] = reasons[1, 1] = "length"
    report = analyze_trace(LengthTrace.from_matrix(x, finish_reasons=reasons))
    assert report["trace"]["at_cap"]["length"] == 400
    fn = report["false_negatives"]
    assert (fn["groups_below"], fn["groups_exceeding"], fn["samples_below"], fn["samples_exceeding"]) == (3, 2, 6, 2)
    assert fn["group_rate"] == 2 / 3 and fn["sample_rate"] == 2 / 6
    assert not any(w.startswith("false negatives") for w in report["warnings"])


def test_one_response_at_the_max_is_no_cap():
    # a small trace without finish reasons whose longest response is alone at its max: it was read as a cap ('25% of
    # responses end at the cap (40 tokens) and tie there'), and false negatives at 512 as n/a
    for x in ([[10, 20, 30, 40]], [[30, 10], [20, 40]]):
        report = analyze_trace(LengthTrace.from_matrix(np.array(x)))
        assert report["trace"]["at_cap"] == {"basis": "max_length", "length": 40, "min_length": 40, "samples": 1,
                                             "share": 0.25}
        assert not any("at the cap" in n for n in report_notes(report))
        assert report["false_negatives"]["group_rate"] == 0.0
        assert not any(w.startswith("false negatives") for w in report["warnings"])
    # two responses at the max are one (as in test_responses_at_the_cap_are_counted_and_censor_false_negatives)
    report = analyze_trace(LengthTrace.from_matrix(np.array([[30, 40], [20, 40]])))
    assert report["false_negatives"]["group_rate"] is None
    assert any("50% of responses end at the cap (40 tokens)" in n for n in report_notes(report))


def test_false_negatives_with_no_probe_below_the_threshold_say_why():
    # long responses (every probe >= 600 tokens, none at a cap): no group is below 512, so the rate has no
    # denominator; it is n/a, and the warnings say why, as for every other n/a statistic
    x = np.array([[900, 1200, 700], [600, 650, 2000], [1500, 800, 900], [700, 3000, 640]])
    report = analyze_trace(LengthTrace.from_matrix(x, finish_reasons=np.full(x.shape, "stop")))
    fn = report["false_negatives"]
    assert fn["groups_below"] == 0 and fn["group_rate"] is None and fn["sample_rate"] is None
    assert [w for w in report["warnings"] if w.startswith("false negatives at 512 are n/a")] == [
        "false negatives at 512 are n/a: no group's probe is below 512 tokens (the shortest is 600), so no group "
        "counts as short (fn_length sets the threshold)"]
    # a threshold some probe is below measures it, and warns nothing of it
    report = analyze_trace(LengthTrace.from_matrix(x), AnalyzeConfig(fn_length=650))
    assert report["false_negatives"]["group_rate"] == 1.0
    assert not any(w.startswith("false negatives") for w in report["warnings"])


def test_a_later_sample_of_one_length_says_why_its_spearman_is_na():
    # sample 2 ran to the same 512 tokens in every group: nothing to rank, so its Spearman is n/a, and the
    # warnings say so (the other samples' are numbers); 1 of 250 responses at the cap reads 0.4%, not 0%
    x = np.array([[100, 150, 512], [300, 250, 512], [200, 400, 512], [50, 80, 512]])
    report = analyze_trace(LengthTrace.from_matrix(x))
    assert report["spearman"]["per_sample"][0] is not None and report["spearman"]["per_sample"][1] is None
    assert "Spearman is n/a for 1 later sample(s) whose every length is the same: sample 2 (512 tokens)" in \
        report["warnings"]
    assert not any("Spearman is n/a" in w for w in analyze_trace(LengthTrace.from_matrix(x[:, :2]))["warnings"])
    y = np.full((125, 2), 300)
    y[:, 1] = np.arange(125)
    y[0, 0] = 512
    reasons = np.full(y.shape, "stop", dtype=object)
    reasons[0, 0] = "length"
    said = [w for w in analyze_trace(LengthTrace.from_matrix(y, finish_reasons=reasons))["warnings"]
            if w.startswith("false negatives")]
    assert said and "0.4% of responses were cut at 512 tokens" in said[0]


def test_report_needs_equal_groups_of_two_or_more():
    ragged = LengthTrace(prompt_ids=["a", "b"], prompt_lens=[1, 1], lengths=[1, 2, 3], offsets=[0, 2, 3])
    with pytest.raises(DataError, match="analysis needs the same number of samples"):
        analyze_trace(ragged)
    with pytest.raises(DataError, match="at least 2 samples per group"):
        analyze_trace(LengthTrace.from_matrix(np.array([[1], [2]])))


def test_write_plots_writes_pngs(tmp_path):
    x = synth_trace(groups=64, n=4, seed=2).matrix()
    x[0, 1] = 0  # an empty response must not break the log axes
    paths = write_plots(x, tmp_path / "plots", title="t")
    assert [p.name for p in paths] == ["lengths_hist.png", "probe_vs_later.png", "cv_hist.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    assert not list((tmp_path / "plots").glob(".*"))


def test_importing_analysis_does_not_import_matplotlib():
    code = "import sys, pdsr_sdk.analysis, pdsr_sdk.traces; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_false_negative_warning_gives_the_tables_share_at_the_cap():
    # 1 of 40 responses cut at 300 tokens: the table said 2.5% and the warning '2% of responses were cut at 300'
    x = np.full((5, 8), 100)
    x[:, 0] = [50, 60, 70, 80, 90]
    x[2, 3] = 300
    report = analyze_trace(LengthTrace.from_matrix(x, finish_reasons=np.where(x == 300, "length", "stop")))
    row = next(r["value"] for r in report_tables(report)["summary"] if r["statistic"] == "responses at the cap")
    assert row.startswith("2.5% at 300")
    assert any(w.startswith("false negatives at 512 are n/a: 2.5% of responses were cut at 300 tokens")
               for w in report["warnings"])


def test_responses_cut_at_different_lengths_are_not_said_to_tie_at_one_cap():
    # 'length' at 300, 340 and 400 tokens (multi-turn responses with environment tokens, a context limit): the note
    # said '33% of responses end at the cap (400 tokens) and tie there', the table '33.3% at 400'
    x = np.array([[100, 300, 200], [340, 150, 120], [50, 60, 400], [200, 400, 80]])
    reasons = np.where(x >= 300, "length", "stop")
    report = analyze_trace(LengthTrace.from_matrix(x, finish_reasons=reasons))
    assert report["trace"]["at_cap"] == {"basis": "finish_reason", "length": 400, "min_length": 300, "samples": 4,
                                         "share": 4 / 12}
    row = next(r["value"] for r in report_tables(report)["summary"] if r["statistic"] == "responses at the cap")
    assert row == "33.3% at 300..400 (finish_reason 'length')"
    notes = [n for n in report_notes(report) if n.startswith("note:")]
    assert len(notes) == 1 and "tie" not in notes[0]
    assert notes[0].startswith("note: 33% of responses were cut (finish_reason 'length') at 300 to 400 tokens, "
                               "not at one cap")
    assert any("33.3% of responses were cut at 300 to 400 tokens" in w for w in report["warnings"])


def test_failed_samples_leave_their_groups_out_with_a_warning():
    # a failed sample (an engine died, an agent raised) has the length it broke off at: it was counted as a response
    # (here a probe of 0 tokens ranked its group last) and nothing said so
    rng = np.random.default_rng(3)
    x = rng.integers(100, 900, size=(10, 4))
    reasons = np.full(x.shape, "stop", dtype=object)
    x[2, 0], reasons[2, 0] = 0, "failed"
    x[7, 2], reasons[7, 2] = 35, "failed"
    reasons[7, 3] = "failed"
    kept = np.delete(x, [2, 7], axis=0)
    report = analyze_trace(LengthTrace.from_matrix(x, finish_reasons=reasons, prompt_ids=[f"q{i}" for i in range(10)]))
    assert report["trace"]["groups"] == 8 and report["trace"]["tokens"] == int(kept.sum())
    assert report["trace"]["failed"] == {"samples": 3, "groups_left_out": 2}
    assert report["trace"]["finish_reasons"] == {"stop": 32}
    assert report["spearman"]["per_sample"] == pytest.approx(spearman_vs_probe(kept).tolist())
    assert report["cv"]["mean"] == pytest.approx(group_cv(kept, 1).mean())
    said = [w for w in report["warnings"] if "failed" in w]
    assert len(said) == 1 and said[0].startswith("3 sample(s) failed (finish_reason 'failed'")
    assert "their 2 group(s) are left out of every statistic, 8 of 10 remain" in said[0]
    clean = analyze_trace(LengthTrace.from_matrix(kept, finish_reasons=np.full(kept.shape, "stop")))
    assert clean["trace"]["failed"] == {"samples": 0, "groups_left_out": 0}
    assert not any("failed" in w for w in clean["warnings"])
    reasons[:, 1] = "failed"
    with pytest.raises(DataError, match="every group has a failed sample"):
        analyze_trace(LengthTrace.from_matrix(x, finish_reasons=reasons, source="t.jsonl"))
