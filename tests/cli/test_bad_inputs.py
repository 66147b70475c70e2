"""Bad input and resumed runs: each case gives a clear error (naming the flag, file, row or key) before any work
starts, and leaves what is already on disk unchanged."""

from __future__ import annotations

import json
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from support import ROOT
from pdsr_cli.main import cli


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def failed(result, *needles):
    """The command failed cleanly (exit 2, one error line, no traceback) and its message has every needle."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "error: " in result.output.lower()
    for needle in needles:
        assert str(needle) in result.output, (needle, result.output)
    return result.output


def snapshot(*paths):
    return {p: p.read_bytes() for p in paths}


# --------------------------------------------------------------------------- pdsr gae

@pytest.fixture()
def gae_input(tmp_path):
    rows = [{"rewards": [0.0, 1.0], "values": [0.5, 0.25], "response_mask": [1, 1]} for _ in range(3)]
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path, rows


@pytest.mark.parametrize("column, value, where", [
    ("rewards", float("nan"), "row 1 token 1 is nan"),
    ("values", float("inf"), "row 1 token 1 is inf"),
])
def test_gae_non_finite_rewards_or_values_name_the_row(tmp_path, gae_input, column, value, where):
    path, rows = gae_input
    rows[1][column][1] = value
    pq.write_table(pa.Table.from_pylist(rows), path)
    out = tmp_path / "out.parquet"
    failed(invoke("gae", "--data", path, "--out", out, "--whiten"), "in.parquet", repr(column), where, "finite")
    assert not out.exists()


def test_gae_scalar_nan_reward_names_the_row(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([{"rewards": r, "values": [0.0, 0.0], "response_mask": [1, 1]}
                                         for r in (1.0, 0.0, float("nan"))]), path)
    failed(invoke("gae", "--data", path, "--out", tmp_path / "o.parquet"), "'rewards' row 2 is nan")


@pytest.mark.parametrize("column", ["rewards", "values", "response_mask"])
def test_gae_a_list_of_text_names_the_column(tmp_path, column):
    row = {"rewards": [0.0, 1.0], "values": [0.5, 0.25], "response_mask": [1, 1]}
    row[column] = ["a", "b"]
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([row]), path)
    failed(invoke("gae", "--data", path, "--out", tmp_path / "o.parquet"),
           f"{path}: column {column!r} must be a list of numbers per row, got list<", "string>")


def test_gae_a_reward_no_token_can_carry_is_named(tmp_path):
    """A scalar reward goes on its row's last valid token; a row with none loses it, and the command says so
    (a reward of 0 loses nothing and is not named)."""
    path, out = tmp_path / "in.parquet", tmp_path / "o.parquet"
    rows = [{"rewards": r, "values": [0.0, 0.0], "response_mask": m}
            for r, m in ((1.0, [1, 1]), (2.0, [0, 0]), (0.0, [0, 0]), (-1.0, [0, 0]))]
    pq.write_table(pa.Table.from_pylist(rows), path)
    res = CliRunner().invoke(cli, ["gae", "--data", str(path), "--out", str(out), "--lam", "1"])
    assert res.exit_code == 0, res.output
    assert ("warning: 2 row(s) have a reward but no valid token to carry it (their response_mask is all 0), so it "
            "is in no advantage: row 1, 3") in res.output
    adv = pq.read_table(out).column("advantages").to_pylist()
    assert adv[0] == [1.0, 1.0] and adv[1] == adv[3] == [0.0, 0.0]
    res = CliRunner().invoke(cli, ["gae", "--data", str(path), "--out", str(out), "--overwrite", "--mask-column", ""])
    assert res.exit_code == 0 and "warning" not in res.output, res.output


def test_gae_existing_out_needs_overwrite(tmp_path, gae_input):
    path, _ = gae_input
    out = tmp_path / "out.parquet"
    out.write_bytes(b"an earlier result")
    failed(invoke("gae", "--data", path, "--out", out), str(out), "already exists", "--overwrite")
    assert out.read_bytes() == b"an earlier result"
    assert invoke("gae", "--data", path, "--out", out, "--overwrite").exit_code == 0
    assert pq.read_table(out).column_names[-2:] == ["advantages", "returns"]


def test_gae_without_data_or_out_names_the_flag(tmp_path, gae_input):
    path, _ = gae_input
    failed(invoke("gae", "--data", path), "--out is required (or 'out:' in the --config file)")
    failed(invoke("gae", "--out", tmp_path / "o.parquet"), "--data is required (or 'data:' in the --config file)")
    cfg = tmp_path / "gae.yaml"   # the file may give them instead
    cfg.write_text(f"data: {path}\nout: {tmp_path / 'o.parquet'}\n")
    assert invoke("gae", "--config", cfg).exit_code == 0 and (tmp_path / "o.parquet").exists()


def test_gae_unwritable_out_fails_before_computing(tmp_path, gae_input, monkeypatch):
    from pdsr_sdk.gae import table

    path, _ = gae_input
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a folder must be")
    monkeypatch.setattr(table, "read_table", lambda *a, **k: pytest.fail("read the input before checking --out"))
    failed(invoke("gae", "--data", path, "--out", blocker / "out.parquet"), "--out", "blocker", "is a file")
    failed(invoke("gae", "--data", path, "--out", tmp_path), "--out", "is a directory")
    assert blocker.read_text() == "a file where a folder must be"


# --------------------------------------------------------------------------- --set POLICY:KEY=VALUE

TRACE = "examples/traces/synth_256x8.jsonl"


@pytest.mark.parametrize("flag", ["--set", "--policy-set"])
@pytest.mark.parametrize("item, what", [("v2:steal=false", "policy 'v2' is not selected"),
                                        ("v9:steal=false", "policy 'v9' is not a known policy")])
def test_simulate_setting_for_a_policy_not_selected(flag, item, what):

    trace = ROOT / TRACE
    out = failed(invoke("simulate", "--trace", trace, "--policy", "v3,v2.5", "--no-references", flag, item,
                        "--num-batches", 1, "--quiet"), f"{flag} {item.split('=')[0]}", what)
    assert "the selected policies are v3, v2.5" in out


def test_rollout_setting_for_a_policy_not_selected(tmp_path):
    out = tmp_path / "o.parquet"
    failed(invoke("rollout", "--policy", "v3", "--set", "v2.5:cap_multiplier=2", "--out", out),
           "--set v2.5:cap_multiplier: policy 'v2.5' is not selected; the selected policy is v3")
    assert not out.exists()


# --------------------------------------------------------------------------- a flag's bad value

@pytest.mark.parametrize("args, line", [
    (["rollout", "--n", 0], "--n: sampling.n: Input should be greater than or equal to 1 (got 0)"),
    (["rollout", "--max-tokens", -5], "--max-tokens: sampling.max_tokens: Input should be greater than or equal"),
    (["rollout", "--reward", "nope"], "--reward: reward: unknown reward 'nope'; valid names: auto, none, math_boxed, "
                                      "math_verify (or an import path"),
    (["simulate", "--n", 0], "--n: n: Input should be greater than or equal to 1 (got 0)"),
    # no option named like the key: the one given whose value is the key's
    (["simulate", "--segment-min", 0], "--segment-min: segments.min_tokens: Input should be greater than or equal"),
    (["simulate", "--n", 0, "--segment-max", 0], "--segment-max: segments.max_tokens: Input should be greater"),
    # two given with the value: neither is named
    (["simulate", "--segment-min", 0, "--segment-max", 0], "command line: segments.min_tokens: Input should be"),
    (["gae", "--chunk", 0, "--data", "in.parquet", "--out", "o.parquet"], "--chunk: chunk: Input should be"),
    (["trace", "synth", "--groups", 0, "--out", "t.jsonl"], "--groups: groups: Input should be"),
])
def test_a_bad_flag_value_names_the_flag_and_its_key(args, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    failed(invoke(*args), line)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, out", [
    (["gae", "--data", "in.parquet"], "adv.csv"),
    (["score", "--data", "in.parquet"], "scored.jsonl"),
    (["rollout"], "traj.arrow"),
])
def test_an_output_named_as_another_format_is_refused(args, out, tmp_path, monkeypatch):
    """pdsr writes Parquet and reads a file by its suffix: an output named .csv could not be read back."""
    monkeypatch.chdir(tmp_path)
    stem = out.split(".")[0]
    failed(invoke(*args, "--out", out), f"{out}: this output is written as Parquet, not .{out.split('.')[1]}; "
                                        f"name it {stem}.parquet")
    assert not list(tmp_path.iterdir())


def test_a_bad_value_from_the_file_names_the_file_not_a_flag(tmp_path):
    cfg = tmp_path / "synth.yaml"
    cfg.write_text("groups: 0\n")
    out = failed(invoke("trace", "synth", "--config", cfg, "--n", 4, "--out", tmp_path / "t.jsonl"),
                 f"{cfg}: groups: Input should be")
    assert "--groups" not in out


# --------------------------------------------------------------------------- pdsr rollout

def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture()
def prompts(tmp_path):
    return write_jsonl(tmp_path / "prompts.jsonl", [{"id": f"q{i}", "prompt": f"What is {i}+1?", "answer": str(i + 1)}
                                                    for i in range(5)])


@pytest.fixture()
def fake_run(tmp_path, tiny_model_dir):
    """A config running on fake engines (no vLLM): flags after it make a whole, fast ``pdsr rollout``."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({
        "model": str(tiny_model_dir), "policy": "baseline", "sampling": {"n": 2, "max_tokens": 8},
        "engines": [{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine", "max_model_len": 256}]}))
    return ["rollout", "--quiet", "--config", cfg]


@pytest.fixture()
def no_engines(monkeypatch):
    """Engines must not start: every case below fails before."""
    from pdsr_sdk.rollout.session import RolloutSession

    async def refuse(self, **_):
        raise AssertionError("engines started before the input was checked")

    monkeypatch.setattr(RolloutSession, "start", refuse)


def test_resume_with_overwrite_is_an_error(prompts, tmp_path, no_engines):
    out = tmp_path / "o.parquet"
    out.write_bytes(b"an earlier run")
    failed(invoke("rollout", "--data", prompts, "--out", out, "--resume", "--overwrite"),
           "--resume and --overwrite", "conflict", "pass one of them")
    assert out.read_bytes() == b"an earlier run"


def test_unwritable_out_fails_before_engines_start(prompts, tmp_path, no_engines):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file")
    failed(invoke("rollout", "--data", prompts, "--out", blocker / "o.parquet"),
           "--out (output.path)", "blocker", "is a file, not a folder")
    failed(invoke("rollout", "--data", prompts, "--out", tmp_path / "o.parquet", "--summary", blocker / "s.json"),
           "--summary (output.summary_path)", "is a file, not a folder")
    as_parquet = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist([json.loads(line) for line in prompts.read_text().splitlines()]), as_parquet)
    failed(invoke("rollout", "--data", as_parquet, "--out", as_parquet), "--out and --data are the same file")
    assert blocker.read_text() == "a file" and not (tmp_path / "o.parquet").exists()


def test_every_policys_output_is_checked_before_the_first_run(prompts, tmp_path, no_engines):
    (tmp_path / "o.v2.5.parquet").mkdir()
    failed(invoke("rollout", "--data", prompts, "--policy", "v3,v2.5", "--out", tmp_path / "o.parquet"),
           "o.v2.5.parquet: is a folder")


def test_serve_port_taken_or_out_of_range_fails_before_engines_start(no_engines):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        failed(invoke("serve", "--port", port), f"--port: cannot listen on 127.0.0.1:{port}", "in use")
    for port in (-1, 65536):
        failed(invoke("serve", "--port", port), f"--port: {port} is not a port; expected 0-65535")


@pytest.mark.parametrize("key", ["over_provision: 0.25", "steps: 3", "filter_groups: {kind: zero-variance}"])
def test_serve_with_a_stream_of_steps_fails_before_engines_start(tmp_path, no_engines, key):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(key + "\n")
    failed(invoke("serve", "--config", cfg, "--port", 0), "serve: a serving session runs requests as they come")


def _earlier_run(tmp_path, n=2, metadata=None):
    """Trajectories of an interrupted run (parts on disk): prompts q0, q1 in batch 0, group size ``n``."""
    from workloads import trajectory_rows

    from pdsr_sdk.dispatch.trajectory import trajectory_schema
    from pdsr_sdk.rollout.writer import TrajectoryWriter

    out = tmp_path / "o.parquet"
    w = TrajectoryWriter(out, trajectory_schema(), flush_groups=1, metadata=metadata)
    for pid in ("q0", "q1"):
        w.add_group(trajectory_rows(pid, n))
    return out, snapshot(*sorted((tmp_path / "o.parquet.parts").iterdir()))


def test_resume_with_another_group_size_names_the_key(prompts, tmp_path, no_engines):
    out, before = _earlier_run(tmp_path, n=2)   # written before settings were recorded: n from group_size
    failed(invoke("rollout", "--data", prompts, "--out", out, "--resume", "--n", 4),
           "o.parquet: --resume continues a run made with other settings", "sampling.n (--n) is 4 now but was 2",
           "--overwrite")
    assert snapshot(*before) == before


def test_resume_with_another_policy_and_model_names_each_key(prompts, tmp_path, no_engines, tiny_model_dir):
    from pdsr_sdk.rollout.resume import METADATA_KEY

    then = {"policy": "v2.5", "model": "Qwen2.5-7B", "sampling.n": 8}
    out, before = _earlier_run(tmp_path, n=8, metadata={METADATA_KEY: json.dumps(then)})
    msg = failed(invoke("rollout", "--data", prompts, "--out", out, "--resume", "--n", 8, "--policy", "v3"),
                 "policy (--policy) is 'v3' now but was 'v2.5'", "model (--model) is")
    assert "was 'Qwen2.5-7B'" in msg and "sampling.n" not in msg
    assert snapshot(*before) == before


def test_resume_with_another_batch_size_names_the_key(prompts, tmp_path, no_engines):
    """The run's batches are the data cut into batch_size prompts: another size would number them anew."""
    from pdsr_sdk.rollout.resume import METADATA_KEY

    out, before = _earlier_run(tmp_path, n=2, metadata={METADATA_KEY: json.dumps({"batch_size": 4})})
    failed(invoke("rollout", "--data", prompts, "--out", out, "--resume", "--n", 2, "--batch-size", 2),
           "batch_size (--batch-size) is 2 now but was 4")
    assert snapshot(*before) == before


def test_resume_goes_on_numbering_and_summarises_the_whole_run(prompts, tmp_path, fake_run):
    import pyarrow.parquet as pq

    out = tmp_path / "o.parquet"
    first = invoke(*fake_run, "--data", prompts, "--out", out, "--batch-size", 2, "--num-batches", 1)
    assert first.exit_code == 0, first.output
    before = out.read_bytes()
    second = invoke(*fake_run, "--data", prompts, "--out", out, "--batch-size", 2, "--resume")
    assert second.exit_code == 0, second.output
    assert "5 groups, 10 samples (2 groups from before the resume)" in second.output
    rows = pq.read_table(out).to_pylist()
    assert {r["prompt_id"]: r["batch_index"] for r in rows} == {"q0": 0, "q1": 0, "q2": 1, "q3": 1, "q4": 2}
    summary = json.loads((tmp_path / "o.summary.json").read_text())
    assert [(b["batch_index"], b["groups"]) for b in summary["batches"]] == [(0, 2), (1, 2), (2, 1)]
    assert summary["groups"] == 5 and summary["tokens"] == sum(r["response_length"] for r in rows) == 80
    # what the first run wrote is in the result unchanged
    old = pq.read_table(pa.BufferReader(before)).to_pylist()
    assert [r for r in rows if r["prompt_id"] in ("q0", "q1")] == old


def batch_of(out):
    return {r["prompt_id"]: r["batch_index"] for r in pq.read_table(out).to_pylist()}


def summary_batches(tmp_path):
    return [(b["batch_index"], b["groups"]) for b in json.loads((tmp_path / "o.summary.json").read_text())["batches"]]


def test_num_batches_counts_the_runs_batches_in_all_however_often_it_resumes(prompts, tmp_path, fake_run):
    out, whole = tmp_path / "o.parquet", tmp_path / "whole" / "o.parquet"
    run = [*fake_run, "--data", prompts, "--batch-size", 2]
    assert invoke(*run, "--out", whole, "--num-batches", 2).exit_code == 0   # the same run in one go
    assert invoke(*run, "--out", out, "--num-batches", 1).exit_code == 0
    resumed = invoke(*run, "--out", out, "--num-batches", 2, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert batch_of(out) == batch_of(whole) == {"q0": 0, "q1": 0, "q2": 1, "q3": 1}
    assert summary_batches(tmp_path) == [(0, 2), (1, 2)]
    # run again, finished: nothing runs, and the output says so
    before = out.read_bytes()
    again = invoke(*run, "--out", out, "--num-batches", 2, "--resume")
    assert again.exit_code == 0, again.output
    assert (f"pdsr: nothing left to run: {out} already has the run's 2 batches (--num-batches 2)"
            in again.output)
    assert "4 groups, 8 samples (4 groups from before the resume)" in again.output
    assert out.read_bytes() == before and summary_batches(tmp_path) == [(0, 2), (1, 2)]
    # a smaller --num-batches than the file has runs nothing either; without it the rest of the data runs
    assert "nothing left to run" in invoke(*run, "--out", out, "--num-batches", 1, "--resume").output
    rest = invoke(*run, "--out", out, "--resume")
    assert "nothing left to run" not in rest.output and batch_of(out) == {**batch_of(whole), "q4": 2}
    assert "already has every prompt of the data (3 batches of 2)" in invoke(*run, "--out", out, "--resume").output


def test_a_resumed_run_completes_the_batch_it_was_cut_short_in(prompts, tmp_path, fake_run):
    out, _ = _earlier_run(tmp_path)   # stopped with q0, q1 of batch 0 on disk
    r = invoke(*fake_run, "--data", prompts, "--out", out, "--batch-size", 3, "--num-batches", 2, "--resume")
    assert r.exit_code == 0, r.output
    # batch 0 is q0..q2 (its q2 runs now, in batch 0), batch 1 q3, q4: as a run in one go numbers them
    assert batch_of(out) == {"q0": 0, "q1": 0, "q2": 0, "q3": 1, "q4": 1}
    summary = json.loads((tmp_path / "o.summary.json").read_text())
    assert summary_batches(tmp_path) == [(0, 3), (1, 2)] and summary["groups"] == 5
    first = summary["batches"][0]
    # one row for batch 0: the 2 groups of one token per sample before, q2's 2 x 8 tokens now
    assert first["resumed"] and "interrupted" not in first and first["tokens"] == 2 * 2 * 1 + 2 * 8
    assert sum(b["tokens"] for b in summary["batches"]) == summary["tokens"] == 4 + 3 * 16


def test_overwrite_keeps_the_old_output_until_the_run_writes(prompts, tmp_path, fake_run):
    out = tmp_path / "o.parquet"
    assert invoke(*fake_run, "--data", prompts, "--out", out, "--limit", 1).exit_code == 0
    before = out.read_bytes()
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": 7}])
    failed(invoke(*fake_run, "--data", bad, "--out", out, "--overwrite"), "bad.jsonl", "'prompt'", "is int64",
           "expected text")
    assert out.read_bytes() == before


# --------------------------------------------------------------------------- columns

def load(tmp_path, tiny_model_dir, rows, **cfg):
    from pdsr_sdk.rollout.config import DataConfig
    from pdsr_sdk.rollout.data import load_prompts, load_tokenizer

    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return load_prompts(DataConfig(**cfg), load_tokenizer(tiny_model_dir), path=path)


VERL = [{"data_source": "math", "prompt": [{"role": "user", "content": f"What is {i}+1?"}],
         "reward_model": {"ground_truth": str(i + 1), "style": "rule"}, "extra_info": {"index": 10 + i}}
        for i in range(2)]


def test_verl_layout_is_found_without_flags(tmp_path, tiny_model_dir):
    recs = load(tmp_path, tiny_model_dir, VERL)
    assert [r.ground_truth for r in recs] == ["1", "2"] and "What is 1+1?" in recs[1].text
    recs = load(tmp_path, tiny_model_dir, VERL, id_column="extra_info.index")
    assert [r.prompt_id for r in recs] == ["10", "11"]


@pytest.mark.parametrize("prompt", ["input", "context_messages"])
def test_openrlhf_columns_are_found_without_flags(tmp_path, tiny_model_dir, prompt):
    rows = [{prompt: "What is 2+2?" if prompt == "input" else [{"role": "user", "content": "What is 2+2?"}],
             "label": "4"}]
    recs = load(tmp_path, tiny_model_dir, rows)
    assert recs[0].ground_truth == "4" and "What is 2+2?" in recs[0].text


def test_a_struct_ground_truth_column_asks_for_a_dotted_path(tmp_path, tiny_model_dir):
    from pdsr_sdk.errors import DataError

    with pytest.raises(DataError, match=r"column 'reward_model' \(data.ground_truth_column, --ground-truth-column\) "
                                        r"is struct.*e.g. --ground-truth-column reward_model.ground_truth"):
        load(tmp_path, tiny_model_dir, VERL, ground_truth_column="reward_model")
    with pytest.raises(DataError, match=r"column 'reward_model' has no field 'answer' \(fields: ground_truth, style\)"):
        load(tmp_path, tiny_model_dir, VERL, ground_truth_column="reward_model.answer")


def test_non_finite_ground_truth_names_the_row(tmp_path, tiny_model_dir):
    from pdsr_sdk.errors import DataError

    with pytest.raises(DataError, match=r"data.parquet: row 1: column 'answer' is nan; expected a finite number"):
        load(tmp_path, tiny_model_dir, [{"prompt": "a", "answer": 1.5}, {"prompt": "b", "answer": float("nan")}])


def test_a_list_id_column_is_the_wrong_type(tmp_path, tiny_model_dir):
    from pdsr_sdk.errors import DataError

    with pytest.raises(DataError, match=r"column 'id' \(data.id_column, --id-column\) is list<.*int64>; "
                                        r"expected a string or integer id"):
        load(tmp_path, tiny_model_dir, [{"prompt": "a", "id": [1]}])


# --------------------------------------------------------------------------- the model's context

def test_max_tokens_beyond_the_context_names_the_flag(prompts, tmp_path, tiny_model_dir, no_engines):
    failed(invoke("rollout", "--data", prompts, "--model", tiny_model_dir, "--max-tokens", 9000,
                  "--out", tmp_path / "o.parquet"),
           "--max-tokens (sampling.max_tokens) is 9000 but the context is 8192 tokens",
           "max_position_embeddings in", "config.json")


def test_a_long_prompt_names_its_row_or_is_skipped_and_counted(tmp_path, fake_run):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "What is 1+1?"}, {"prompt": "word " * 400},
                                              {"prompt": "What is 2+2?"}])
    out = tmp_path / "o.parquet"
    failed(invoke(*fake_run, "--data", data, "--out", out), "p.jsonl: row 1 (prompt id 'row-1')",
           "exceed the context of 256 tokens (engines[0].max_model_len)", "1 row(s) in all", "--skip-long")
    assert not out.exists()
    r = invoke(*fake_run, "--data", data, "--out", out, "--skip-long")
    assert r.exit_code == 0, r.output
    assert "2 groups" in r.output and "1 prompts longer than the context skipped" in r.output
    assert json.loads((tmp_path / "o.summary.json").read_text())["skipped_long"] == 1
    assert set(pq.read_table(out).column("prompt_id").to_pylist()) == {"row-0", "row-2"}
