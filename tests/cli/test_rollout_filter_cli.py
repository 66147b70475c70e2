"""``pdsr rollout --steps K --filter-groups zero-variance`` on fake engines: the trajectories hold only groups
that pass a naive zero-variance check, the filtered ones go to <out>.filtered.parquet with --write-filtered,
and the summary counts them."""

from __future__ import annotations

import json
from collections import defaultdict

import pyarrow.parquet as pq
from click.testing import CliRunner

from pdsr_cli.main import cli


def constant(text, ground_truth, **info):
    return 1.0


def reward(text, ground_truth, *, prompt_id, sample_index, **info):
    """Every third prompt all right, every fourth all wrong, the others half right."""
    i = int(prompt_id[1:])
    return 1.0 if i % 3 == 0 else 0.0 if i % 4 == 0 else float(sample_index % 2)


def rewards_by_group(path) -> dict[str, list]:
    groups: dict[str, list] = defaultdict(list)
    for r in pq.read_table(path).to_pylist():
        groups[r["prompt_id"]].append(r["reward"])
    return groups


def setup(tmp_path, tiny_model_dir):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(60)))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({
        "model": str(tiny_model_dir), "policy": "baseline", "sampling": {"n": 3, "max_tokens": 6},
        "reward": "test_rollout_filter_cli:reward", "data": {"path": str(data)},
        "engines": [{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine", "max_model_len": 256}]}))
    return cfg


def test_filtered_rollout_writes_passing_groups_and_counts_the_rest(tmp_path, tiny_model_dir):
    cfg = setup(tmp_path, tiny_model_dir)
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--quiet", "--out", str(out), "--steps", "3",
                                 "--batch-size", "4", "--filter-groups", "zero-variance", "--write-filtered"])
    assert r.exit_code == 0, r.output
    kept, filtered = rewards_by_group(out), rewards_by_group(tmp_path / "o.filtered.parquet")
    assert len(kept) >= 3 * 4 and all(len(set(rs)) > 1 for rs in kept.values())
    assert filtered and all(len(set(rs)) == 1 for rs in filtered.values()) and not set(kept) & set(filtered)
    summary = json.loads((tmp_path / "o.summary.json").read_text())
    assert summary["filtered_groups"] == len(filtered) == sum(b["filtered_groups"] for b in summary["batches"])
    assert all(0 < b["pass_rate"] <= 1 for b in summary["batches"])
    assert "groups filtered out (--filter-groups)" in r.output


def test_write_filtered_needs_filter_groups(tmp_path, tiny_model_dir):
    cfg = setup(tmp_path, tiny_model_dir)
    r = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--quiet", "--out", str(tmp_path / "o.parquet"),
                                 "--steps", "2", "--write-filtered"])
    assert r.exit_code != 0 and "--write-filtered" in r.output and "--filter-groups" in r.output
    assert not (tmp_path / "o.parquet").exists()


def test_a_run_whose_every_group_is_filtered_ends_when_the_data_does(tmp_path, tiny_model_dir):
    cfg = setup(tmp_path, tiny_model_dir)
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--quiet", "--out", str(out), "--steps", "5",
                                 "--batch-size", "4", "--limit", "10", "--filter-groups", "zero-variance",
                                 "--reward", "test_rollout_filter_cli:constant"])
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "o.summary.json").read_text())
    assert summary["groups"] == 0 and summary["filtered_groups"] == 10
    assert pq.read_table(out).num_rows == 0
    # the step it ran has none of its 4 groups: the line says so, as a single short step's does
    assert ("ran out after 1 of the 5 steps asked for (--steps 5), in step 0, which has 0 of its 4 groups: 10 "
            "groups at 4 a step (--step-groups); 10 of them filtered out (--filter-groups: their rewards all equal)"
            ) in r.output


def test_a_single_filtered_step_the_data_cuts_short_says_so(tmp_path, tiny_model_dir):
    """--filter-groups without --steps runs one step: one that gets fewer than B passing groups before the data
    ends says how many it has and how many groups the filter took, not only the counts of an ordinary run."""
    cfg = setup(tmp_path, tiny_model_dir)
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--quiet", "--out", str(out), "--batch-size", "4",
                                 "--limit", "8", "--filter-groups", "zero-variance"])
    assert r.exit_code == 0, r.output
    kept = rewards_by_group(out)   # q1, q2, q5, q7 pass (q0, q3, q6 all right, q4 all wrong): 4 of 8
    summary = json.loads((tmp_path / "o.summary.json").read_text())
    assert sorted(kept) == ["q1", "q2", "q5", "q7"] and summary["filtered_groups"] == 4
    assert "ran out" not in r.output   # 4 passing groups: the step is whole
    r = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--quiet", "--out", str(out), "--batch-size", "4",
                                 "--limit", "7", "--filter-groups", "zero-variance", "--overwrite"])
    assert r.exit_code == 0, r.output
    assert ("pdsr: the data's prompts ran out in step 0, which has 3 of its 4 groups: 7 groups; 4 of them filtered "
            "out (--filter-groups: their rewards all equal)") in r.output


def test_on_policy_dropped_groups_are_counted_and_the_run_ends_when_the_data_does(tmp_path, tiny_model_dir):
    """``--max-staleness 0``: the groups generating when a step ends are dropped then (as DAPO
    drops its excess); they count as done with, so a run with steps to spare ends once every prompt is taken,
    filtered or dropped."""
    cfg = setup(tmp_path, tiny_model_dir)
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--quiet", "--out", str(out), "--steps", "40",
                                 "--batch-size", "2", "--limit", "30", "--over-provision", "2",
                                 "--max-staleness", "0", "--filter-groups", "zero-variance"])
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "o.summary.json").read_text())
    assert summary["dropped_groups"] == sum(b["dropped_groups"] for b in summary["batches"]) > 0
    assert summary["groups"] + summary["filtered_groups"] + summary["dropped_groups"] == 30
    assert len(summary["batches"]) < 40
    assert all(len(set(rs)) > 1 for rs in rewards_by_group(out).values())


def test_progress_bars_count_without_a_total_when_the_pass_rate_decides_the_launches(tmp_path, tiny_model_dir):
    from pdsr_sdk.progress import PlainBar
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.run import run_rollout

    bars: list[PlainBar] = []

    def progress(desc="", total=None, unit="it"):
        bars.append(PlainBar(desc, total, unit))
        return bars[-1]

    data = json.loads(setup(tmp_path, tiny_model_dir).read_text())
    config = RolloutConfig.model_validate({**data, "steps": 2, "batch_size": 4,
                                           "output": {"path": str(tmp_path / "o.parquet")},
                                           "filter_groups": {"kind": "zero-variance"}})
    run_rollout(config, progress=progress)
    samples = next(b for b in bars if b.desc == "samples")
    assert samples.total is None and samples.n > 2 * 4 * 3   # filtered groups' samples ran too
    assert "%" not in samples.line(samples.start + 1)


def test_a_run_the_data_ends_early_says_how_many_steps_it_ran(tmp_path, tiny_model_dir):
    """10 prompts make 3 steps of 4 (the last of 2), not the 5 asked: the run ends there and says so."""
    cfg = setup(tmp_path, tiny_model_dir)
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--quiet", "--out", str(out), "--steps", "5",
                                 "--batch-size", "4", "--limit", "10", "--over-provision", "0.25"])
    assert r.exit_code == 0, r.output
    assert len(json.loads((tmp_path / "o.summary.json").read_text())["batches"]) == 3
    assert ("pdsr: the data's prompts ran out after 3 of the 5 steps asked for (--steps 5): 10 groups at 4 a step"
            in r.output)


def acc_varies(text, ground_truth, *, prompt_id, sample_index, **info):
    """The same score for every sample, an acc that differs within each group."""
    return {"score": 1.0, "acc": float(sample_index % 2)}


def test_filter_metric_chooses_what_the_filter_compares(tmp_path, tiny_model_dir):
    cfg = setup(tmp_path, tiny_model_dir)
    groups = {}
    for metric in ("acc", "score"):
        out = tmp_path / f"{metric}.parquet"
        r = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--quiet", "--out", str(out), "--steps", "2",
                                     "--batch-size", "4", "--limit", "8", "--filter-groups", "zero-variance",
                                     "--filter-metric", metric, "--reward", "test_rollout_filter_cli:acc_varies"])
        assert r.exit_code == 0, r.output
        summary = json.loads((tmp_path / f"{metric}.summary.json").read_text())
        groups[metric] = (summary["groups"], summary["filtered_groups"])
    assert groups == {"acc": (8, 0), "score": (0, 8)}


def test_filter_metric_needs_filter_groups(tmp_path, tiny_model_dir):
    cfg = setup(tmp_path, tiny_model_dir)
    r = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--quiet", "--out", str(tmp_path / "o.parquet"),
                                 "--steps", "2", "--filter-metric", "score"])
    assert r.exit_code != 0 and "--filter-metric" in r.output and "--filter-groups" in r.output
    assert not (tmp_path / "o.parquet").exists()


def failing(text, ground_truth, *, prompt_id, sample_index, **info):
    """``reward``, except that it raises on sample 0 of every even-numbered prompt."""
    if int(prompt_id[1:]) % 2 == 0 and sample_index == 0:
        raise RuntimeError("the reward's server refused the request")
    return reward(text, ground_truth, prompt_id=prompt_id, sample_index=sample_index)


def test_reward_errors_in_filtered_groups_are_counted(tmp_path, tiny_model_dir):
    """A reward that raised on samples of groups the filter then took out (a failed reward is left out of the
    comparison, so such a group has one value fewer) was counted nowhere: the summary said reward_errors 0 for a
    reward that failed on a third of the samples."""
    cfg = setup(tmp_path, tiny_model_dir)
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--quiet", "--out", str(out), "--steps", "3",
                                 "--batch-size", "4", "--filter-groups", "zero-variance", "--write-filtered",
                                 "--reward", "test_rollout_filter_cli:failing"])
    assert r.exit_code == 0, r.output
    kept, filtered = (pq.read_table(p).to_pylist() for p in (out, tmp_path / "o.filtered.parquet"))
    # the reference: sample 0 of each even-numbered prompt, in whichever file its group went to
    failed_kept = sum(int(row["prompt_id"][1:]) % 2 == 0 and row["sample_index"] == 0 for row in kept)
    failed_filtered = sum(int(row["prompt_id"][1:]) % 2 == 0 and row["sample_index"] == 0 for row in filtered)
    assert failed_kept > 0 and failed_filtered > 0
    assert sum(row["reward_error"] is not None for row in filtered) == failed_filtered
    summary = json.loads((tmp_path / "o.summary.json").read_text())
    assert summary["stats"]["reward_errors"] == failed_kept
    assert summary["filtered_reward_errors"] == failed_filtered
    assert sum(b["filtered_reward_errors"] for b in summary["batches"]) == failed_filtered
    assert f"the reward failed on {failed_filtered} of their samples" in r.output
