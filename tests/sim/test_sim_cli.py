"""`pdsr simulate` from the command line: the report files, calibrate and simulate again, the built-in trace,
clean errors, and what the table says to a user of one trace."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import simulate, trajectories_table
from pdsr_sdk.traces import read_trace, synth_trace, write_trace_jsonl
from sim_driver_inputs import small_trace


def test_cli_round_trip_writes_json_and_png_and_calibrates(tmp_path):
    trace_path = write_trace_jsonl(small_trace(groups=16), tmp_path / "t.jsonl")
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(trace_path), "--policy", "all", "--fast", "2",
                                 "--heavy", "1", "--batch-size", "8", "--out-dir", str(out), "--quiet",
                                 "--set", "cap_multiplier=2.0"])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "simulate.json").read_text())
    # every registered policy for real engines, then the simulator-only references (on by default)
    assert [p["policy"] for p in report["policies"]] == ["baseline", "lpt", "v1", "v2", "v2.5", "v3", "oracle",
                                                         "oracle-probe"]
    assert report["policies"][4]["settings"]["cap_multiplier"] == 2.0
    assert report["trace"]["samples"] == 64 and report["trace"]["batches"] == 2
    for p in report["policies"]:
        assert p["lower_bound_s"] <= p["makespan_s"]
        assert p["ratio"] == pytest.approx(p["makespan_s"] / p["lower_bound_s"])
        assert f"{p['makespan_s']:.4g}" in r.output
    png = out / "timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and report["timelines"] == [str(png)]

    # calibrate from a simulated "run", then simulate with the fitted profile
    rep = simulate(small_trace(groups=16), SimulateConfig(policy="baseline", fast=1, heavy=1, batch_size=16,
                                                          timeline=False), keep_groups=True)
    traj = tmp_path / "run.parquet"
    pq.write_table(trajectories_table(rep.runs[0].groups), traj)
    r = CliRunner().invoke(cli, ["simulate", "calibrate", "--trajectories", str(traj), "--out",
                                 str(tmp_path / "p.yaml")])
    assert r.exit_code == 0, r.output
    assert "fast" in r.output and "heavy" in r.output
    # an existing --out needs --overwrite (or overwrite: true); an input as --out is always an error
    for args, needle in ((["--out", tmp_path / "p.yaml"], "p.yaml: already exists; pass --overwrite (overwrite: true)"),
                         (["--out", traj, "--overwrite"], f"out (--out) and --trajectories are the same file {traj}")):
        r = CliRunner().invoke(cli, ["simulate", "calibrate", "--trajectories", str(traj), *map(str, args)])
        assert r.exit_code == 2 and needle in r.output, r.output
    assert pq.read_table(traj).num_rows == 64
    r = CliRunner().invoke(cli, ["simulate", "calibrate", "--trajectories", str(traj), "--out",
                                 str(tmp_path / "p.yaml"), "--overwrite"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(traj), "--profile", str(tmp_path / "p.yaml"),
                                 "--policy", "baseline", "--fast", "1", "--heavy", "1", "--batch-size", "16",
                                 "--quiet"])
    assert r.exit_code == 0, r.output
    # the fitted profile reproduces the run it was fitted on
    sim = float(r.output.splitlines()[3].split()[1])
    assert sim == pytest.approx(rep.runs[0].makespan_s, rel=0.02)


def test_cli_without_a_trace_runs_the_built_in_one(tmp_path, monkeypatch):
    """No --trace: the `pdsr trace synth` defaults, written once to pdsr's cache with the groups the run
    needs (at least 1,024, in 512s), then read from there."""
    monkeypatch.setenv("PDSR_CACHE_DIR", str(tmp_path))
    args = ["simulate", "--policy", "baseline,v3", "--no-references", "--batch-size", "64", "--num-batches", "2",
            "--fast", "2", "--heavy", "1", "--quiet"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    path = tmp_path / "data" / "synth_1024x8_seed0.jsonl"
    assert f"{path}: 128 groups, 1024 samples in 2 batch(es) of 64 prompts" in r.output
    built = read_trace(path)
    want = synth_trace(groups=1024)
    assert built.num_groups == 1024 and np.array_equal(built.lengths, want.lengths)
    mtime = path.stat().st_mtime_ns
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0 and path.stat().st_mtime_ns == mtime    # reused, not drawn again
    # a multi-step run gets a trace long enough for every step of the curve (F up to 1)
    r = CliRunner().invoke(cli, ["simulate", "--steps", "12", "--step-groups", "128", "--fast", "2", "--heavy", "1",
                                 "--quiet", "--over-provision", "1"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "data" / "synth_2048x8_seed0.jsonl").exists()   # 256 + 11 x 128 = 1,664 groups
    # what --help says of it holds: the `informative` family member (not `seed002`), median ~420, p99 ~1.4k
    from pdsr_sdk.traces.family import WORKLOADS

    text = " ".join(CliRunner().invoke(cli, ["simulate", "--help"]).output.split())
    assert "the `informative` family member: median ~420 tokens, p99 ~1.4k" in text
    assert WORKLOADS.get("informative").synth == {}   # trace synth's defaults
    lengths = built.lengths
    assert round(float(np.median(lengths)), -1) == 420 and round(float(np.percentile(lengths, 99)), -2) == 1400


def test_cli_errors_are_clean(tmp_path):
    trace_path = write_trace_jsonl(small_trace(groups=4), tmp_path / "t.jsonl")
    run = CliRunner().invoke
    r = run(cli, ["simulate", "--trace", str(trace_path), "--policy", "v2.5", "--heavy", "0", "--quiet"])
    assert r.exit_code == 2 and "needs at least one engine in pool(s) heavy" in r.output
    r = run(cli, ["simulate", "--trace", str(trace_path), "--policy", "all", "--set", "bogus=1"])
    assert r.exit_code == 2 and "'bogus' belongs to none of the selected policies" in r.output
    r = run(cli, ["simulate", "--trace", str(trace_path), "--policy", "v2.5", "--set", "v2.5:cap_multiplier=-1"])
    assert r.exit_code == 2 and "cap_multiplier" in r.output
    r = run(cli, ["simulate", "--trace", str(trace_path), "--n", "9"])
    assert r.exit_code == 2 and "n is 9 but group 0" in r.output and "has only 4 samples" in r.output
    (tmp_path / "bad.yaml").write_text("medium: {c0_s: 1}\n")
    r = run(cli, ["simulate", "--trace", str(trace_path), "--profile", str(tmp_path / "bad.yaml")])
    assert r.exit_code == 2 and "medium: unknown pool" in r.output
    r = run(cli, ["simulate", "calibrate", "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and "--trajectories" in r.output
    r = run(cli, ["simulate", "calibrate", "--trajectories", str(trace_path), "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and f"{trace_path}: is a length trace (JSONL), not a trajectories file" in r.output
    assert "pdsr rollout" in r.output and not (tmp_path / "p.yaml").exists()


def test_num_batches_with_steps_is_refused_not_ignored(tmp_path):
    # --steps runs steps x step_groups groups whatever --num-batches says: the flag did nothing, silently
    trace_path = write_trace_jsonl(small_trace(groups=40), tmp_path / "t.jsonl")
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(trace_path), "--steps", "2", "--step-groups", "4",
                                 "--num-batches", "3", "--quiet"], catch_exceptions=False)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "num_batches (--num-batches) applies to batch-by-batch runs only" in r.output
    with pytest.raises(ValueError, match="num_batches applies to batch-by-batch runs only"):
        SimulateConfig(steps=2, num_batches=3)
    assert SimulateConfig(num_batches=3).num_batches == 3 and SimulateConfig(steps=2).steps == 2


@pytest.mark.parametrize("flag", ["--segment-min", "--segment-max"])
def test_segment_sizes_with_no_segments_are_refused_not_ignored(tmp_path, flag):
    # --no-segments runs each request in one go: a segment size beside it did nothing, silently
    trace_path = write_trace_jsonl(small_trace(groups=8), tmp_path / "t.jsonl")
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(trace_path), "--no-segments", flag, "100", "--quiet"],
                           catch_exceptions=False)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "--segment-min / --segment-max size the dynamic segments that --no-segments turns off" in r.output
    ok = CliRunner().invoke(cli, ["simulate", "--trace", str(trace_path), flag, "100", "--quiet"],
                            catch_exceptions=False)
    assert ok.exit_code == 0, ok.output


def test_cli_says_what_a_user_of_one_trace_needs_to_read_the_table(tmp_path):
    """One policy runs beside baseline (vs_base); the footnote explains only the columns shown; a short trace and
    fewer batches than asked are said; a response no engine can hold is named before anything runs."""
    trace_path = write_trace_jsonl(small_trace(groups=10), tmp_path / "t.jsonl")
    base = ["simulate", "--trace", str(trace_path), "--fast", "2", "--heavy", "1", "--quiet", "--no-timeline"]
    r = CliRunner().invoke(cli, [*base, "--policy", "v3", "--batch-size", "16", "--num-batches", "3"])
    assert r.exit_code == 0, r.output
    assert "10 groups, 40 samples in 1 batch(es) of 16 prompts (the trace holds only 10 groups" in r.output
    assert "--num-batches asked for 3, the trace holds 1" in r.output
    rows = [line.split()[0] for line in r.output.splitlines() if line.startswith(("baseline ", "v3 "))]
    assert rows == ["baseline", "v3"] and "vs_base = makespan / baseline's" in r.output
    assert "of_oracle" not in r.output
    r = CliRunner().invoke(cli, [*base, "--policy", "v3", "--no-references", "--batch-size", "4"])
    assert r.exit_code == 0, r.output
    assert "in 3 batch(es) of 4 prompts (the last has 2: the trace ran out)" in r.output
    assert "vs_base" not in r.output and "baseline " not in r.output
    lines = [json.dumps({"prompt_id": "a", "prompt_len": 50, "lengths": [10, 40_000]}),
             json.dumps({"prompt_id": "b", "prompt_len": 5, "lengths": [3, 4]})]
    (tmp_path / "long.jsonl").write_text("\n".join(lines) + "\n")
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(tmp_path / "long.jsonl"), "--quiet"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "group 0 ('a'), sample 1: a context of 40,050 tokens (prompt 50 + response 40,000)" in r.output
    assert "at most 32,768" in r.output


def test_cli_marks_a_policy_that_truncated_responses_as_not_comparable(tmp_path):
    trace_path = write_trace_jsonl(synth_trace(groups=16, n=4, seed=3, median_length=300, max_length=3000,
                                               runaway_frac=0.2), tmp_path / "t.jsonl")
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(trace_path), "--policy", "baseline,v1", "--quiet",
                                 "--no-references", "--batch-size", "16", "--no-timeline"])
    assert r.exit_code == 0, r.output
    assert "trunc" in r.output.splitlines()[1] and "trunc = responses a policy's cap cut short" in r.output


def test_an_unreadable_trace_is_named_by_its_key_and_flag(tmp_path):
    """``trace (--trace)`` before what is wrong with the file, as ``data.path (--data)`` before a prompt file's."""
    gone, bad = tmp_path / "gone.jsonl", tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n')
    out = ["--out-dir", str(tmp_path / "o")]
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(gone), *out])
    assert result.exit_code != 0 and result.output.strip() == (f"error: trace (--trace) {gone}: trace file does not "
                                                               "exist")
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(bad), *out])
    assert result.exit_code != 0 and result.output.startswith(f"error: trace (--trace) {bad}:1: missing key(s)")


def test_a_run_in_an_earlier_runs_out_dir_leaves_only_its_own_files(tmp_path):
    """--steps 3, then one batch without the timeline, then --steps again, in the same --out-dir: each run's folder
    holds the files it wrote and none of the earlier run's others; a file of another name stays."""
    trace_path = write_trace_jsonl(small_trace(groups=16), tmp_path / "t.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    common = ["simulate", "--trace", str(trace_path), "--fast", "1", "--heavy", "1", "--batch-size", "4",
              "--policy", "baseline", "--out-dir", str(out), "--quiet"]
    r = CliRunner().invoke(cli, [*common, "--steps", "3", "--over-provision", "0"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "steps.json", "steps.png", "timeline.png"]
    r = CliRunner().invoke(cli, [*common, "--no-timeline"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "simulate.json"]
    for name in ("steps.json", "steps.png", "timeline.png"):
        assert f"pdsr: removed {out / name}: an earlier run's (this run writes no {name})" in r.output
    r = CliRunner().invoke(cli, [*common, "--steps", "3", "--over-provision", "0"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "steps.json", "steps.png", "timeline.png"]
    assert (out / "notes.txt").read_text() == "mine\n"
