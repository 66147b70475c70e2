"""A batch cut short by a stop is counted from the trajectories on --resume, its rewards too: the samples whose reward
failed (``reward_errors``) and a dict reward's numeric fields (``reward_extra_sums``, the summary's
``reward_extra_means``) as the run counted its finished batches. Before, only the reward's sum was read back: a run
stopped mid-batch and resumed reported 10 reward errors where its file held 12, and the fields' means of the
samples run after the resume alone."""

from __future__ import annotations

import json

import pytest

from pdsr_sdk.dispatch.trajectory import trajectory_schema
from pdsr_sdk.rollout.resume import merged_batches, read_resume_state
from pdsr_sdk.rollout.writer import TrajectoryWriter
from workloads import trajectory_rows


def _group(pid: str, batch_index: int) -> list[dict]:
    """Sample 0 scored with a dict reward (acc, a text field, a NaN), sample 1's reward failed."""
    rows = trajectory_rows(pid, 2)
    for row in rows:
        row["batch_index"] = batch_index
    rows[0].update(reward=1.0, reward_extra=json.dumps({"acc": 0.5, "note": "x", "bad": float("nan")}))
    rows[1].update(reward_error="ValueError: bad sample")
    return rows


@pytest.mark.parametrize("merged", [False, True], ids=["parts", "merged"])
def test_a_batch_cut_short_keeps_its_reward_errors_and_extra_fields(tmp_path, merged):
    out = tmp_path / "run.parquet"
    writer = TrajectoryWriter(out, trajectory_schema(), flush_groups=1, metadata={"run_id": "r1"})
    for pid, batch in (("q0", 0), ("q1", 0), ("q2", 1)):
        writer.add_group(_group(pid, batch))
    if merged:   # the struct reward_extra of a merged file reads as the parts' JSON text does
        writer.finalize()
    state = read_resume_state(out, {}, tmp_path / "no-summary.json")
    by_index = {b["batch_index"]: b for b in state.batches}
    assert [by_index[i]["groups"] for i in (0, 1)] == [2, 1]
    assert [by_index[i]["reward_errors"] for i in (0, 1)] == [2, 1]
    assert [by_index[i]["rewarded_samples"] for i in (0, 1)] == [2, 1]
    assert by_index[0]["reward_extra_sums"] == {"acc": [1.0, 2]}
    assert by_index[1]["reward_extra_sums"] == {"acc": [0.5, 1]}
    # completed after the resume: the part run now adds to it
    now = {"batch_index": 1, "groups": 1, "tokens": 2, "makespan_s": 1.0, "reward_sum": 1.0, "rewarded_samples": 1,
           "reward_errors": 1, "reward_extra_sums": {"acc": [0.25, 1]}}
    row = merged_batches(state.batches, [now])[1]
    assert row["reward_errors"] == 2 and row["reward_extra_sums"] == {"acc": [0.75, 2]}
