"""``pdsr rollout --resume`` and ``--overwrite``: a resume with other settings names each key and leaves the
earlier run's parts unchanged; a resumed run numbers its batches and summarises as a run in one go would; an
overwrite keeps the old output until the new run writes."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from cli_checks import failed, invoke, snapshot, write_jsonl


def test_resume_with_overwrite_is_an_error(prompts, tmp_path, no_engines):
    out = tmp_path / "o.parquet"
    out.write_bytes(b"an earlier run")
    failed(invoke("rollout", "--data", prompts, "--out", out, "--resume", "--overwrite"),
           "--resume and --overwrite", "conflict", "pass one of them")
    assert out.read_bytes() == b"an earlier run"


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
    assert (f"pdsr: nothing left to run: {out} already has 2 batches, and --num-batches 2 counts the run's "
            f"batches in all; raise --num-batches to run more" in again.output)
    assert "4 groups, 8 samples (4 groups from before the resume)" in again.output
    assert out.read_bytes() == before and summary_batches(tmp_path) == [(0, 2), (1, 2)]
    # a smaller --num-batches than the file has runs nothing either, and the line says what the file has (before:
    # "already has the run's 1 batches"); without it the rest of the data runs
    fewer = invoke(*run, "--out", out, "--num-batches", 1, "--resume").output
    assert f"nothing left to run: {out} already has 2 batches, and --num-batches 1 counts the run's" in fewer
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


def test_resume_with_nothing_to_resume_starts_a_new_run_and_says_so(prompts, tmp_path, fake_run):
    """--resume (with --steps K too) where --out holds no run: a new run starts, as before, with one pdsr: line
    saying so; a resume that finds a run does not say it."""
    line = "holds no finished group to resume; starting a new run"
    for extra, out in (([], tmp_path / "o.parquet"), (["--steps", 2], tmp_path / "s" / "o.parquet")):
        r = invoke(*fake_run, "--data", prompts, "--out", out, "--batch-size", 2, "--num-batches", 1, "--resume",
                   *extra)
        assert r.exit_code == 0, r.output
        assert f"pdsr: output.resume (--resume): {out} {line}" in r.output
        assert [ln for ln in r.output.splitlines() if line in ln] == [f"pdsr: output.resume (--resume): {out} {line}"]
        assert pq.read_table(out).num_rows > 0
    again = invoke(*fake_run, "--data", prompts, "--out", tmp_path / "o.parquet", "--batch-size", 2, "--resume")
    assert again.exit_code == 0 and line not in again.output, again.output


def test_a_resumed_steps_run_with_nothing_to_run_says_what_its_file_has(prompts, tmp_path, fake_run):
    """--steps K counts the run's steps in all. A run whose data ran out before K steps, resumed with K or more, has
    no prompt left to run: before, its line said it had "the run's 8 steps (--steps 8); raise --steps to run more"
    of a file of 3 steps, which no --steps adds to. One resumed with fewer steps than its file has said "the run's
    1 steps" of a file of 2."""
    out, used_up = tmp_path / "o.parquet", tmp_path / "u" / "o.parquet"
    run = [*fake_run, "--data", prompts, "--step-groups", 2]
    first = invoke(*run, "--out", used_up, "--steps", 5)
    assert first.exit_code == 0 and "ran out after 3 of the 5 steps asked for" in first.output, first.output
    for steps in (5, 8):
        again = invoke(*run, "--out", used_up, "--steps", steps, "--resume")
        assert again.exit_code == 0, again.output
        assert (f"pdsr: nothing left to run: {used_up} already has every prompt of the data (in 3 steps); start "
                f"over with --overwrite to run them again" in again.output), again.output
    assert invoke(*run, "--out", out, "--steps", 2).exit_code == 0   # q4 left
    for steps in (2, 1):
        again = invoke(*run, "--out", out, "--steps", steps, "--resume")
        assert (f"pdsr: nothing left to run: {out} already has 2 steps, and --steps {steps} counts the run's steps in "
                f"all; raise --steps to run more" in again.output), again.output


def test_resume_keeps_the_reward_shaping_and_the_group_filter(prompts, tmp_path, fake_run):
    """What the file's rows are: rewards under DAPO's overlong shaping or not, zero-variance groups filtered out or
    not. Before, a dynamic-sampling run resumed without --filter-groups wrote groups whose rewards all equal into it,
    and one resumed without --overlong-buffer unshaped rewards beside shaped ones, without a word."""
    out = tmp_path / "o.parquet"
    run = [*fake_run, "--data", prompts, "--out", out, "--reward", "math_boxed", "--max-tokens", 8]
    first = invoke(*run, "--steps", 1, "--step-groups", 2, "--filter-groups", "zero-variance", "--overlong-buffer", 4)
    assert first.exit_code == 0, first.output
    before = out.read_bytes()
    msg = failed(invoke(*run, "--steps", 2, "--step-groups", 2, "--resume"),
                 "o.parquet: --resume continues a run made with other settings",
                 "overlong_buffer (--overlong-buffer) is None now but was 4",
                 "overlong_penalty (--overlong-penalty) is None now but was 1.0",
                 "filter_groups.kind (--filter-groups) is None now but was 'zero-variance'",
                 "filter_groups.metric (--filter-metric) is None now but was 'acc'")
    assert "sampling" not in msg
    failed(invoke(*run, "--steps", 2, "--step-groups", 2, "--resume", "--filter-groups", "zero-variance",
                  "--filter-metric", "score", "--overlong-buffer", 4, "--overlong-penalty", 0.5),
           "overlong_penalty (--overlong-penalty) is 0.5 now but was 1.0",
           "filter_groups.metric (--filter-metric) is 'score' now but was 'acc'")
    assert out.read_bytes() == before
    same = invoke(*run, "--steps", 2, "--step-groups", 2, "--resume", "--filter-groups", "zero-variance",
                  "--overlong-buffer", 4)
    assert same.exit_code == 0, same.output
