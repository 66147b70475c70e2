"""The bench scripts (the real-engine ones first) refuse a bad flag by name (argparse's exit 2 and one ``error:`` line)
before any engine starts, and bench/fidelity.py's --reuse takes only a real.json made with the same settings."""

from __future__ import annotations

import json
import sys

import pytest

from support import ROOT, load_bench


@pytest.fixture(autouse=True)
def no_engines(monkeypatch):
    """A script that got past its checks would start engines (minutes): make that a test failure instead."""
    import asyncio

    def refuse(coro, *_, **__):
        coro.close()
        raise AssertionError("the script went on to start its engines")

    monkeypatch.setattr(asyncio, "run", refuse)


CASES = [
    ("rollout", ["--policies", "baseline,nope"], "--policies: unknown policy 'nope'"),
    ("rollout", ["--policies", "v3,oracle"], "--policies: policy 'oracle' is a simulator-only reference schedule"),
    ("rollout", ["--repeats", "0"], "argument --repeats: 0 is below 1"),
    ("rollout", ["--groups", "ten"], "argument --groups: 'ten' is not a whole number"),
    ("rollout", ["--runaway-frac", "2"], "argument --runaway-frac: 2 is above 1"),
    ("rollout", ["--trace", "no/such/trace.jsonl"], "argument --trace: no such file: no/such/trace.jsonl"),
    ("rollout", ["--model", "no/such/model"], "--model: no/such/model: not a model directory"),
    ("partial", ["--steps", "-1"], "argument --steps: -1 is below 1"),
    ("partial", ["--over-provision", "-0.5"], "argument --over-provision: -0.5 is below 0"),
    ("partial", ["--trainer-s", "x"], "argument --trainer-s: 'x' is not a number"),
    ("partial", ["--update", "later"], "argument --update: invalid choice: 'later'"),
    ("cpu_engine", ["--rounds", "0"], "argument --rounds: 0 is below 1"),
    ("cpu_engine", ["--core", "4096"], "argument --core: 4096 is not a core this process may run on"),
    ("spec", ["--data", "math=no/such.parquet"], "argument --data: no such file: no/such.parquet"),
    ("spec", ["--policy", "nope"], "--policy: unknown policy 'nope'"),
    ("spec", ["--prompt-lookup-min", "5"], "--prompt-lookup-min 5 is above --prompt-lookup-max 4"),
    ("spec", ["--prompts", "0"], "argument --prompts: 0 is below 1"),
    ("spec_replay", ["--run", "RUN", "--rules", "ngram,nope"], "--rules: unknown nope; valid: ngram, longest"),
    ("spec_replay", ["--run", "RUN", "--k", "0"], "argument --k: 0 is below 1"),
    ("spec_replay", ["--run", "RUN", "--history", "RUN", "--history", "RUN"], "--history: 2 given for 1 --run"),
    ("spec_replay", ["--run", "RUN", "--window", "4", "2"], "--window: MIN 4 is above MAX 2"),
]

MAIN_CASES = [   # scripts whose main() parses sys.argv
    ("fidelity", ["--policies", "baseline,v9"], "--policies: unknown policy 'v9'"),
    ("fidelity", ["--batch-size", "0"], "argument --batch-size: 0 is below 1"),
    ("fidelity", ["--out-dir", str(ROOT / "README.md")], f"argument --out-dir: {ROOT / 'README.md'}: is a file, not "
                                                          f"a folder"),
    ("fidelity", ["--out-dir", str(ROOT / "README.md" / "fid")], f"argument --out-dir: {ROOT / 'README.md' / 'fid'}: "
                                                                 f"cannot make this folder: {ROOT / 'README.md'} is a "
                                                                 "file"),
    ("weights", ["--repeats", "0"], "argument --repeats: 0 is below 1"),
    ("weights", ["--model", "no/such/model"], "--model: no/such/model: not a model directory"),
    ("score", ["--mbs", "0"], "argument --mbs: 0 is below 1"),
    ("stream_oracle", ["--updates", "all,later"], "--updates: unknown later; valid: all, staggered, auto"),
    ("score", ["--max-tokens", "512"], "argument --max-tokens: 512 is below the longest sample"),
    ("score", ["--dtype", "float8"], "argument --dtype: invalid choice: 'float8'"),
    ("multi_turn", ["--policies", "v3,nope"],
     "--policies: nope: invalid config: SimulateConfig: policy: unknown policy"),
    ("multi_turn", ["--policies", "v3-no-bogus"], "--policies: v3-no-bogus: invalid config: V3Settings: "
                                                  "policy_settings.v3.disable.0: Input should be 'probes_first'"),
    ("multi_turn", ["--groups", "0"], "argument --groups: 0 is below 1"),
    ("record_trace", ["no/such.parquet", "--out", "x.jsonl"], "argument trajectories: no such file: no/such.parquet"),
    ("gpu", ["--budgets", "0"], "argument --budgets: 0 is below 1"),
    ("verify_cost", ["--repeat", "0"], "argument --repeat: 0 is below 1"),
    ("dynamic_sampling", ["--b", "0"], "argument --b: 0 is below 1"),
    ("dynamic_sampling", ["--solve", "recorded,1.5"], "--solve: 1.5 is not a chance in (0, 1]"),
    ("dynamic_sampling", ["--policy", "nope"], "policy: unknown policy 'nope'"),
    ("dynamic_sampling", ["--fast", "0", "--heavy", "0"], "fast + heavy is 0"),
    ("simulate", ["--groups", "0"], "argument --groups: 0 is below 1"),
    ("policies", ["--seed", "x"], "argument --seed: 'x' is not comma-separated whole numbers"),
    ("policies", ["--engines", "8,0"], "argument --engines: 0 is below 1"),
    ("policies", ["--policies", "baseline,nope"], "--policies: unknown policy 'nope'"),
    ("policies", ["--trace", "no/such.jsonl"], "argument --trace: no such file: no/such.jsonl"),
    ("rules", ["--seeds", "x"], "argument --seeds: 'x' is not comma-separated whole numbers"),
    ("rules", ["--batch-sizes", "128,x"], "argument --batch-sizes: '128,x' is not comma-separated whole numbers"),
    ("rules", ["--over-provision", "-1"], "argument --over-provision: -1 is below 0"),
    ("spec_sim", ["--tokens-per-step", "0.5"], "argument --tokens-per-step: 0.5 is below 1"),
    ("spec_sim", ["--acceptance", str(ROOT / "bench/data/spec-acceptance-smollm2.json"), "--methods", "nope"],
     "spec-acceptance-smollm2.json: data set 'math500' has no method 'nope'"),
    ("stream_oracle", ["--seeds", "x"], "argument --seeds: 'x' is not comma-separated whole numbers"),
    ("stream_oracle", ["--max-partial-share", "2"], "argument --max-partial-share: 2 is not between 0 and 1"),
    ("partial_bound", ["--batch-sizes", "0"], "argument --batch-sizes: 0 is below 1"),
]


def _refused(capsys, call) -> str:
    with pytest.raises(SystemExit) as exc:
        call()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and [i for i, line in enumerate(lines) if "error:" in line] == [len(lines) - 1]
    return err


@pytest.mark.parametrize("script, argv, message", CASES)
def test_a_bad_flag_is_refused_by_name_before_any_engine(script, argv, message, capsys, tmp_path):
    run = tmp_path / "run.parquet"
    run.write_bytes(b"")   # spec_replay's --run must name a file; it is not read when a flag is refused
    argv = [str(run) if a == "RUN" else a for a in argv]
    assert message in _refused(capsys, lambda: load_bench(script).parse_args(argv))


@pytest.mark.parametrize("script, argv, message", MAIN_CASES)
def test_a_bad_flag_is_refused_by_name_in_main(script, argv, message, capsys, monkeypatch):
    module = load_bench(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    assert message in _refused(capsys, module.main)


def test_good_flags_pass(tmp_path):
    """The checks let the documented commands through (the v3-noseg form and a real trace included)."""
    from pdsr_sdk.traces import synth_trace, write_trace_jsonl

    trace = write_trace_jsonl(synth_trace(groups=4, n=2, seed=1), tmp_path / "t.jsonl")
    args = load_bench("rollout").parse_args(["--policies", "baseline,v3-noseg,v2.5", "--trace", str(trace),
                                             "--repeats", "3", "--runaway-frac", "0.02"])
    assert args.repeats == 3 and args.trace == trace
    args = load_bench("partial").parse_args(["--over-provision", "0.25", "--trainer-s", "3", "--kv-on-update", "keep"])
    assert args.over_provision == 0.25 and args.trainer_s == 3.0
    assert load_bench("spec").parse_args(["--policy", "v3", "--data", f"t={trace}"]).data == [f"t={trace}"]


def test_fidelity_reuses_only_runs_of_the_same_settings(tmp_path, capsys, monkeypatch):
    """--reuse with a real.json of another trace (other --groups, or a file from before the settings were recorded)
    is refused, naming what differs; one of the same settings is taken; none there means measure."""
    import argparse

    fid = load_bench("fidelity")
    parser = argparse.ArgumentParser(prog="fidelity.py")
    settings = dict(groups=32, n=4, batch_size=16, median_length=120.0, max_length=480, max_num_seqs=8, seed=0,
                    policies=["baseline", "v3"])
    path = tmp_path / "real.json"
    assert fid.reused_runs(path, settings, parser) is None
    runs = {"baseline": {"makespan_s": 1.0, "path": "b.parquet", "segments": {}, "stats": {}}}
    path.write_text(json.dumps({"settings": settings, "runs": runs}))
    assert fid.reused_runs(path, settings, parser) == runs
    err = _refused(capsys, lambda: fid.reused_runs(path, {**settings, "groups": 8}, parser))
    assert "--reuse:" in err and "'groups': 32" in err and "'groups': 8" in err
    path.write_text(json.dumps(runs))   # the file as it was written before
    assert "not recorded (an older file)" in _refused(capsys, lambda: fid.reused_runs(path, settings, parser))
    # through the command line: refused before anything in --out-dir is rewritten
    path.write_text(json.dumps({"settings": settings, "runs": runs}))
    monkeypatch.setattr(sys, "argv", ["fidelity.py", "--reuse", "--out-dir", str(tmp_path), "--groups", "8"])
    assert "'groups': 8" in _refused(capsys, fid.main)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real.json"]


def test_record_trace_refuses_a_run_without_rewards_and_rescores_one(tmp_path, capsys, monkeypatch):
    """A run made with reward 'none' has no rewards to keep (--scorer run): refused by name, not an AttributeError;
    --scorer last-number scores its responses again, per sample, as last_number_right does."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pdsr_sdk.traces import read_trace

    texts = ["so 18", "I think 17", "it is 5", "5 or 6"]
    table = pa.table({"prompt_id": ["a", "a", "b", "b"], "sample_index": [0, 1, 0, 1],
                      "prompt_length": [10, 10, 12, 12], "response_length": [3, 4, 3, 3],
                      "reward": pa.array([None] * 4, pa.float32()), "response_text": texts,
                      "ground_truth": ["#### 18", "#### 18", "#### 6", "#### 6"]})
    pq.write_table(table, tmp_path / "run.parquet")
    rt = load_bench("record_trace")
    out = tmp_path / "trace.jsonl"
    monkeypatch.setattr(sys, "argv", ["record_trace.py", str(tmp_path / "run.parquet"), "--out", str(out)])
    assert "the run computed no rewards" in _refused(capsys, rt.main)
    assert not out.exists()
    monkeypatch.setattr(sys, "argv", ["record_trace.py", str(tmp_path / "run.parquet"), "--scorer", "last-number",
                                      "--out", str(out)])
    rt.main()
    assert read_trace(out).rewards.tolist() == [1.0, 0.0, 0.0, 1.0]
    pq.write_table(table.drop(["ground_truth"]), tmp_path / "bare.parquet")
    monkeypatch.setattr(sys, "argv", ["record_trace.py", str(tmp_path / "bare.parquet"), "--scorer", "last-number",
                                      "--out", str(out)])
    assert "no column ground_truth" in _refused(capsys, rt.main)


def test_spec_replay_prints_the_tail_ratio_it_is_read_for():
    """group's rules against ngram in the tail, accepted per verify step: the number docs/benchmarks.md quotes."""
    sr = load_bench("spec_replay")
    tail = {"accepted": 6, "verify_steps": 4}
    assert sr.tail_ratio({"tail": tail}, {"tail": {"accepted": 3, "verify_steps": 3}}) == pytest.approx(1.5)
    assert sr.tail_ratio({"tail": tail}, {"tail": {"accepted": 0, "verify_steps": 0}}) != sr.tail_ratio(
        {"tail": tail}, {"tail": {"accepted": 0, "verify_steps": 0}})   # nan: no ngram step to compare with



def test_partial_prints_the_details_of_the_round_at_the_median_ratio():
    """bench/partial.py printed the off-policy share and staleness of the middle round by index, not of the round
    whose ratio is the median it prints."""
    median_run = load_bench("partial").median_run
    on = [{"samples": 10, "wall_s": 1.0, "round": r} for r in range(3)]
    runs = [{"samples": 10, "wall_s": w, "round": r} for r, w in enumerate((0.5, 0.25, 1.0))]   # ratios 2, 4, 1
    assert median_run(runs, on)["round"] == 0
    assert median_run(runs[1:], on[1:])["round"] == 2   # ratios 4, 1: the lower middle


def test_a_file_that_is_no_trajectories_is_one_line_naming_it(tmp_path, monkeypatch):
    """bench/recurrence.py and bench/spec_replay.py ended in pyarrow's traceback on a file that is no Parquet file or
    lacks a column they read; the error names the argument and the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = tmp_path / "notes.txt"
    text.write_text("not parquet\n")
    bare = tmp_path / "bare.parquet"
    pq.write_table(pa.table({"prompt_id": ["a"], "sample_index": [0]}), bare)
    rec = load_bench("recurrence")
    for argv, message in [([str(text), str(bare)], f"error: first {text}: not a trajectories Parquet file"),
                          ([str(bare), str(bare)], f"error: first {bare}: no column finish_reason")]:
        monkeypatch.setattr(sys, "argv", ["recurrence.py", *argv])
        with pytest.raises(SystemExit) as exc:
            rec.main()
        assert str(exc.value.code).startswith(message)
    replay = load_bench("spec_replay")
    with pytest.raises(SystemExit) as exc:
        replay.main(["--run", str(bare)])
    assert str(exc.value.code).startswith(f"error: --run {bare}: no column prompt_token_ids, response_token_ids")
