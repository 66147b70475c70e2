"""`pdsr analyze`: flags -> config -> SDK report; JSON, tables and plots on disk; clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from support import ROOT
from pdsr_cli.main import cli
from pdsr_sdk.analysis import AnalyzeConfig, analyze_trace
from pdsr_sdk.traces import LengthTrace, read_trace, synth_trace, write_trace_jsonl

EXAMPLE = ROOT / "examples" / "traces" / "synth_256x8.jsonl"
PLOTS = {"lengths_hist.png", "probe_vs_later.png", "cv_hist.png"}


def _run(*args: str):
    return CliRunner().invoke(cli, ["analyze", *args])


def test_analyze_example_writes_report_tables_and_plots(tmp_path):
    out = tmp_path / "out"
    result = _run(str(EXAMPLE), "--out-dir", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "analysis.json").read_text())
    want = analyze_trace(read_trace(EXAMPLE))
    for key in ("trace", "cv", "spearman", "top_k_recall", "safe_rate", "false_negatives", "batch_capture",
                "dispatch_v25"):
        assert report[key] == want[key], key
    assert {Path(p).name for p in report["plots"]} == PLOTS
    assert {p.name for p in out.iterdir()} == PLOTS | {"analysis.json"}
    # the printed tables carry the report's numbers
    assert "256 groups x 8 samples" in result.output
    assert f"{100 * want['top_k_recall']['mean']:.1f}%" in result.output
    assert "30.7%" in result.output and "46.98% of 464" in result.output  # reference column at the defaults
    heavy = want["dispatch_v25"]["heavy"]
    assert any(line.startswith("heavy (offloaded)") and f" {heavy} " in line for line in result.output.splitlines())


def test_flags_override_config_file_and_reach_the_report(tmp_path):
    cfg = tmp_path / "analyze.yaml"
    cfg.write_text("top_k: 0.05\nfn_length: 300\nbatch_prompts: 8\nplots: false\n")
    json_path = tmp_path / "r" / "report.json"
    result = _run(str(EXAMPLE), "--config", str(cfg), "--top-k", "0.2", "--cv-ddof", "0", "--cap-multiplier", "2",
                  "--dispatch-batch-prompts", "32", "--json", str(json_path))
    assert result.exit_code == 0, result.output
    report = json.loads(json_path.read_text())
    expected_cfg = AnalyzeConfig(top_k=0.2, fn_length=300, batch_prompts=8, plots=False, cv_ddof=0, cap_multiplier=2,
                                 dispatch_batch_prompts=32)
    assert report["config"] == expected_cfg.model_dump()
    assert report["top_k_recall"]["k"] == 51            # floor(0.2 * 256)
    assert report["false_negatives"]["length"] == 300
    assert report["batch_capture"]["batches"] == 32     # 256 / 8
    assert report["dispatch_v25"]["batches"] == 8       # 256 / 32
    assert report["cv"] == analyze_trace(read_trace(EXAMPLE), expected_cfg)["cv"]
    assert report["plots"] == [] and not list(json_path.parent.glob("*.png"))
    # the study's reference numbers are shown only next to statistics computed with its settings
    assert "30.7%" not in result.output and "63%" not in result.output and "0.29 / 1.18" not in result.output


def test_plots_go_next_to_the_json_by_default(tmp_path):
    json_path = tmp_path / "deep" / "a.json"
    result = _run(str(EXAMPLE), "--json", str(json_path))
    assert result.exit_code == 0, result.output
    assert {p.name for p in json_path.parent.iterdir()} == PLOTS | {"a.json"}


def test_an_existing_json_needs_overwrite_and_the_trace_is_never_replaced(tmp_path, monkeypatch):
    import pdsr_sdk.traces

    trace = tmp_path / "victim.jsonl"
    trace.write_bytes(EXAMPLE.read_bytes())
    (tmp_path / "d").mkdir()
    named_like_the_report = tmp_path / "d" / "analysis.json"
    named_like_the_report.write_bytes(EXAMPLE.read_bytes())
    report = tmp_path / "r.json"
    report.write_text("an earlier report")
    read = pdsr_sdk.traces.read_trace
    monkeypatch.setattr(pdsr_sdk.traces, "read_trace", lambda *a: pytest.fail("read the trace before the checks"))
    for args, needle in ((["--json", str(report)], f"--json {report}: already exists; pass --overwrite"),
                         (["--json", str(trace)], f"--json and TRACE are the same file {trace}"),
                         (["--json", str(tmp_path / "." / "victim.jsonl"), "--overwrite"], "the same file"),
                         (["--out-dir", str(tmp_path / "d")], "--out-dir and TRACE are the same file")):
        source = named_like_the_report if "--out-dir" in args else trace
        result = _run(str(source), "--no-plots", *args)
        assert result.exit_code == 2 and needle in result.output and "Traceback" not in result.output, result.output
    assert trace.read_bytes() == named_like_the_report.read_bytes() == EXAMPLE.read_bytes()
    assert report.read_text() == "an earlier report"
    monkeypatch.setattr(pdsr_sdk.traces, "read_trace", read)
    result = _run(str(trace), "--no-plots", "--json", str(report), "--overwrite")
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["trace"]["groups"] == 256
    # the --out-dir folder's files are replaced
    assert _run(str(trace), "--no-plots", "--out-dir", str(tmp_path / "o")).exit_code == 0
    assert _run(str(trace), "--no-plots", "--out-dir", str(tmp_path / "o")).exit_code == 0


def test_analyze_trajectories_parquet(tmp_path):
    trace = synth_trace(groups=40, n=4, seed=3)
    x = trace.matrix()
    rows = [(trace.prompt_ids[g], j, int(trace.prompt_lens[g]), int(x[g, j]))
            for j in range(4) for g in range(40)]  # sample-major order: grouping must undo it
    cols = list(zip(*rows))
    path = tmp_path / "traj.parquet"
    pq.write_table(pa.table({"prompt_id": pa.array(cols[0]), "sample_index": pa.array(cols[1], pa.int32()),
                             "prompt_length": pa.array(cols[2], pa.int32()),
                             "response_length": pa.array(cols[3], pa.int32())}), path)
    result = _run(str(path), "--no-plots", "--out-dir", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "o" / "analysis.json").read_text())
    want = analyze_trace(trace)
    assert report["spearman"] == want["spearman"] and report["dispatch_v25"] == want["dispatch_v25"]


@pytest.mark.parametrize("make, args, needle", [
    (None, ["--top-k", "1.5"], "top_k: Input should be less than or equal to 1"),
    (None, ["--cap-multiplier", "0"], "cap_multiplier: Input should be greater than 0"),
    (None, ["--top-k", "0.3"], "safe_k (0.2) must be at least top_k (0.3)"),
    ("missing", [], "does not exist"),
    ("ragged", [], "analysis needs the same number of samples in every group"),
    ("single", [], "at least 2 samples per group"),
])
def test_errors_are_clean(tmp_path, make, args, needle):
    path = EXAMPLE
    if make == "missing":
        path = tmp_path / "nope.jsonl"
    elif make in ("ragged", "single"):
        path = tmp_path / f"{make}.jsonl"
        lines = [{"prompt_id": "a", "prompt_len": 1, "lengths": [1] if make == "single" else [1, 2]},
                 {"prompt_id": "b", "prompt_len": 1, "lengths": [3] if make == "single" else [3, 4, 5]}]
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = _run(str(path), "--no-plots", "--out-dir", str(tmp_path / "o"), *args)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "o" / "analysis.json").exists()


def test_help_lists_flags_with_defaults():
    result = CliRunner().invoke(cli, ["analyze", "--help"])
    assert result.exit_code == 0
    for flag, default in (("--top-k", "0.1"), ("--safe-k", "0.2"), ("--fn-length", "512"),
                          ("--batch-prompts", "16"), ("--capture-top", "3"), ("--offload-fraction", "0.2"),
                          ("--cap-multiplier", "1.5")):
        assert flag in result.output and f"[default: {default}]" in result.output
    assert "--no-plots" in result.output and "--json" in result.output and "--out-dir" in result.output


def test_round_trip_through_trace_synth_and_analyze(tmp_path):
    trace_path = tmp_path / "t.jsonl"
    assert CliRunner().invoke(cli, ["trace", "synth", "--groups", "64", "--seed", "5", "--out",
                                    str(trace_path)]).exit_code == 0
    write_trace_jsonl(synth_trace(groups=64, seed=5), tmp_path / "sdk.jsonl")
    assert trace_path.read_text() == (tmp_path / "sdk.jsonl").read_text()
    result = _run(str(trace_path), "--no-plots", "--out-dir", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output


def test_capped_trace_prints_the_share_at_the_cap_and_warns_on_stderr(tmp_path):
    # a small model's recording: 44% of its responses hit max_tokens = 512
    path = ROOT / "bench" / "data" / "smollm2-gsm8k-128x8.jsonl"
    result = CliRunner().invoke(cli, ["analyze", str(path), "--no-plots", "--out-dir", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "o" / "analysis.json").read_text())
    assert report["trace"]["at_cap"]["basis"] == "finish_reason" and report["trace"]["at_cap"]["length"] == 512
    assert "43.9% at 512 (finish_reason 'length')" in result.stdout
    assert "note: 44% of responses end at the cap (512 tokens)" in result.stdout
    assert "ref 0.5B MATH: the P-DSR length study's published numbers" in result.stdout
    # ties at the cap no longer read as agreement: recall and capture sit at chance
    rc, bc = report["top_k_recall"], report["batch_capture"]
    assert abs(rc["mean"] - rc["chance"]) < 0.05 and abs(bc["capture_rate"] - bc["chance_rate"]) < 0.1
    assert f"(chance {100 * rc['chance']:.1f}%)" in result.stdout
    # no later sample can exceed the cap: false negatives at 512 are n/a, said once on stderr
    assert report["false_negatives"]["group_rate"] is None
    assert "warning: false negatives at 512 are n/a" in result.stderr
    assert "warning:" not in result.stdout


def test_degenerate_trace_says_na(tmp_path):
    path = tmp_path / "equal.jsonl"
    write_trace_jsonl(synth_trace(groups=32, seed=1), path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({"prompt_id": r["prompt_id"], "prompt_len": r["prompt_len"],
                                        "lengths": [300] * len(r["lengths"])}) + "\n" for r in lines))
    result = CliRunner().invoke(cli, ["analyze", str(path), "--no-plots", "--out-dir", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    recall_line = next(line for line in result.stdout.splitlines() if line.startswith("top-10% recall"))
    capture_line = next(line for line in result.stdout.splitlines() if line.startswith("batch capture"))
    assert " n/a " in recall_line and " n/a " in capture_line and "100" not in recall_line + capture_line
    assert "warning: every length is 300: there is nothing to rank" in result.stderr

    # one group: the heading said "1 groups x 4 samples"
    write_trace_jsonl(LengthTrace.from_matrix(np.array([[7, 9, 11, 5]])), path)
    result = CliRunner().invoke(cli, ["analyze", str(path), "--no-plots", "--out-dir", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{path}: 1 group x 4 samples\n"), result.stdout


def test_analyze_says_whether_v3_would_rank_by_the_probe(tmp_path):
    informative = write_trace_jsonl(synth_trace(groups=64, seed=5), tmp_path / "i.jsonl")
    rng = np.random.default_rng(0)
    noise = LengthTrace.from_matrix(rng.integers(1, 2000, size=(64, 8)), prompt_ids=[f"p{i}" for i in range(64)],
                                    prompt_lens=np.full(64, 10))
    blind = write_trace_jsonl(noise, tmp_path / "n.jsonl")
    said = {}
    for name, path in (("informative", informative), ("blind", blind)):
        r = _run(str(path), "--no-plots", "--out-dir", str(tmp_path / name))
        assert r.exit_code == 0, r.output
        said[name] = next(line for line in r.output.splitlines() if line.startswith("v3 (default settings)"))
    assert "v3 ranks waiting work by the probe throughout" in said["informative"]
    # the rank is off, not v3: its other rules (moves of the tail) still act, and the line said "as baseline"
    assert said["blind"].endswith(
        "v3 takes waiting work in queue order throughout, as baseline does (the probe predicts too little to rank by; "
        "its other rules, such as moving the tail to a lighter engine, still act: pdsr simulate --policy all measures "
        "what it buys on the trace)")
    assert "ranking.min_correlation = 0.3" in said["blind"]
    short = write_trace_jsonl(synth_trace(groups=8, n=4, seed=5), tmp_path / "s.jsonl")
    r = _run(str(short), "--no-plots", "--out-dir", str(tmp_path / "short"))
    assert ("fewer than ranking.min_pairs = 64 probe/sibling pairs, so v3 would not rank by the probe: it would take "
            "waiting work in queue order, as baseline does (its other rules") in r.output


def test_report_of_a_jsonl_file_agrees_with_scipy_and_hand_counts(tmp_path):
    # A small capped trace written by hand (no pdsr writer), its statistics recomputed without pdsr's kernels
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(7)
    cap = 300
    lengths = np.minimum(cap, np.round(rng.lognormal(5, 0.6, (40, 1)) * rng.lognormal(0, 0.4, (40, 6)))).astype(int)
    path = tmp_path / "small.jsonl"
    path.write_text("".join(json.dumps({"prompt_id": f"p{g}", "prompt_len": 10, "lengths": row.tolist()}) + "\n"
                            for g, row in enumerate(lengths)))
    result = _run(str(path), "--out-dir", str(tmp_path / "out"), "--no-plots")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "analysis.json").read_text())

    cv = stats.variation(lengths, axis=1, ddof=1)
    assert report["cv"]["mean"] == pytest.approx(cv.mean(), rel=1e-12)
    assert report["cv"]["max"] == pytest.approx(cv.max(), rel=1e-12)
    rho = [stats.spearmanr(lengths[:, 0], lengths[:, j]).statistic for j in range(1, 6)]
    assert report["spearman"]["per_sample"] == pytest.approx(rho, rel=1e-12)
    flat = np.sort(lengths.ravel())   # p99 by linear interpolation between order statistics, by hand
    h = 0.99 * (flat.size - 1)
    lo = int(h)
    assert report["trace"]["length"]["p99"] == pytest.approx(flat[lo] + (h - lo) * (flat[lo + 1] - flat[lo]))
    at_cap = int((lengths == cap).sum())
    assert at_cap > 0
    assert report["trace"]["at_cap"] == {"basis": "max_length", "length": cap, "min_length": cap, "samples": at_cap,
                                         "share": pytest.approx(at_cap / lengths.size)}
    assert f"{100 * at_cap / lengths.size:.1f}% at {cap}" in result.output


def test_an_unreadable_trace_is_named_by_its_argument(tmp_path):
    """As ``pdsr trace convert`` names SOURCE, analyze names TRACE, before what is wrong with the file."""
    gone, bad = tmp_path / "gone.jsonl", tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n')
    assert _run(str(gone), "--no-plots", "--out-dir", str(tmp_path / "o")).output.strip() == (
        f"error: TRACE {gone}: trace file does not exist")
    assert _run(str(bad), "--no-plots", "--out-dir", str(tmp_path / "o")).output.startswith(f"error: TRACE {bad}:1: ")


def test_a_run_in_an_earlier_runs_out_dir_leaves_only_its_own_files(tmp_path):
    """A run with plots, then one with --no-plots, then one with --json elsewhere, in the same --out-dir: each
    run's folder holds the files it wrote and none of the earlier run's others (the plots of another trace beside
    this one's analysis.json); a file of another name, the trace itself, and the --json file's own folder stay."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    trace = write_trace_jsonl(synth_trace(groups=16, n=4, seed=1), out / "t.jsonl")
    assert _run(str(EXAMPLE), "--out-dir", str(out)).exit_code == 0
    assert {p.name for p in out.iterdir()} == PLOTS | {"analysis.json", "notes.txt", "t.jsonl"}
    r = _run(str(trace), "--no-plots", "--out-dir", str(out))
    assert r.exit_code == 0, r.output
    assert {p.name for p in out.iterdir()} == {"analysis.json", "notes.txt", "t.jsonl"}
    for name in sorted(PLOTS):
        assert f"pdsr: removed {out / name}: an earlier run's (this run writes no {name})" in r.output
    assert json.loads((out / "analysis.json").read_text())["trace"]["groups"] == 16
    r = _run(str(EXAMPLE), "--out-dir", str(out), "--json", str(tmp_path / "elsewhere.json"))
    assert r.exit_code == 0, r.output
    assert {p.name for p in out.iterdir()} == PLOTS | {"notes.txt", "t.jsonl"}
    # only --json: its folder is the user's, where the plots replace theirs and nothing else is removed
    r = _run(str(trace), "--no-plots", "--json", str(out / "again.json"))
    assert r.exit_code == 0, r.output
    assert {p.name for p in out.iterdir()} == PLOTS | {"notes.txt", "t.jsonl", "again.json"}
    assert (out / "notes.txt").read_text() == "mine\n" and read_trace(trace).num_groups == 16


def test_the_out_dir_files_removed_are_those_analyze_writes():
    from pdsr_cli.commands.analyze import OUT_DIR_FILES
    from pdsr_sdk.analysis.plots import PLOT_FILES

    assert set(OUT_DIR_FILES) == PLOTS | {"analysis.json"} == set(PLOT_FILES) | {"analysis.json"}


def test_a_misspelt_trace_key_is_one_warning_line(tmp_path):
    """A key no trace line defines (``reward`` for ``rewards``) is said once on stderr as ``warning:``, with the file,
    the line and the key it likely meant, and the analysis runs on."""
    path = tmp_path / "t.jsonl"
    write_trace_jsonl(synth_trace(groups=32, seed=1), path)
    rows = [dict(json.loads(line), reward=[0] * 8) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(cli, ["analyze", str(path), "--no-plots", "--out-dir", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if "not length-trace keys" in line]
    assert said == [f"warning: {path}: key(s) 'reward' (line 1; did you mean 'rewards'?) are not length-trace "
                    f"keys and are ignored; a trace line holds prompt_id, prompt_len, lengths and optionally "
                    f"durations_s, finish_reasons, rewards, turns"]


def test_failed_samples_are_left_out_and_said_on_stderr(tmp_path):
    # a trajectories file whose engine died under one prompt: its samples' lengths were analyzed as responses
    rng = np.random.default_rng(5)
    x = rng.integers(50, 600, size=(12, 4))
    reasons = np.full(x.shape, "stop", dtype=object)
    x[4], reasons[4] = [0, 0, 17, 0], "failed"
    trace = LengthTrace.from_matrix(x, finish_reasons=reasons)
    path = tmp_path / "t.jsonl"
    write_trace_jsonl(trace, path)
    result = _run(str(path), "--out-dir", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{path}: 11 groups x 4 samples")
    assert "warning: 4 sample(s) failed (finish_reason 'failed'" in result.stderr
    assert "11 of 12 remain" in result.stderr
    report = json.loads((tmp_path / "o" / "analysis.json").read_text())
    assert report["trace"]["failed"] == {"samples": 4, "groups_left_out": 1}
    assert report["trace"]["probe_length"]["min"] == float(np.delete(x, 4, axis=0)[:, 0].min())
