"""Reward counters in a whole run's summary (fake engines, no vLLM): reward_errors (a reward that raised
on a sample) and reward_timeouts (a reward's own counter, as math_verify keeps it), per batch and in all."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.run import run_rollout


class TimingOutReward:
    """Counts every other call as a timeout (scored 0), as math_verify counts a check that overran."""

    def __init__(self):
        self.stats = {"reward_timeouts": 0}
        self.calls = 0

    def __call__(self, text, ground_truth, **info):
        self.calls += 1
        if self.calls % 2:
            self.stats["reward_timeouts"] += 1
        return 0.0


timing_out = TimingOutReward()


def failing_on_sample_1(text, ground_truth, *, sample_index, **info):
    if sample_index == 1:
        raise RuntimeError("no score for sample 1")
    return 1.0


def graded(text, ground_truth, *, prompt_id, sample_index, **info):
    """A dict reward as verl's: ``acc`` true on each group's sample 0 and on all of q1's, a number and a text."""
    acc = sample_index == 0 or prompt_id == "q1"
    return {"score": float(acc), "acc": acc, "index": sample_index + int(prompt_id[1:]), "note": "kept, not averaged"}


def run(tmp_path, tiny_model_dir, reward, output=None, **over):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(4)))
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="baseline", reward=reward, batch_size=2,
                        sampling={"n": 2, "max_tokens": 8}, data={"path": data},
                        engines=[{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine", "max_model_len": 256}],
                        output={"path": tmp_path / "o.parquet", **(output or {"overwrite": True})}, **over)
    return run_rollout(cfg)


def test_a_reward_that_raises_is_counted_and_the_run_goes_on(tmp_path, tiny_model_dir):
    summary = run(tmp_path, tiny_model_dir, "test_reward_summary:failing_on_sample_1")
    assert summary.samples == 8 and summary.stats["reward_errors"] == 4
    assert [b["reward_errors"] for b in summary.batches] == [2, 2]
    assert summary.rewarded_samples == 4 and summary.reward_mean == 1.0
    table = pq.read_table(tmp_path / "o.parquet").to_pylist()
    failed = [r for r in table if r["reward_error"] is not None]
    assert {r["sample_index"] for r in failed} == {1} and all(r["reward"] is None for r in failed)
    assert failed[0]["reward_error"] == "RuntimeError: no score for sample 1"


def test_reward_timeouts_reach_the_summary(tmp_path, tiny_model_dir):
    summary = run(tmp_path, tiny_model_dir, "test_reward_summary:timing_out")
    assert summary.stats["reward_timeouts"] == 4 and [b["reward_timeouts"] for b in summary.batches] == [2, 2]
    assert summary.stats["reward_errors"] == 0


def test_the_means_of_a_dict_rewards_numeric_fields_reach_the_summary_across_a_resume(tmp_path, tiny_model_dir):
    """verl's reward_extra_info: each numeric field of a dict reward (booleans as 0 / 1) is averaged over the
    samples in the summary, its text fields left out, and a resumed run's summary averages the whole file's."""
    first = run(tmp_path, tiny_model_dir, "test_reward_summary:graded", num_batches=1)
    assert first.groups == 2 and first.reward_extra_means == {"acc": 0.75, "index": 1.0}   # q0, q1
    whole = run(tmp_path, tiny_model_dir, "test_reward_summary:graded", output={"resume": True}, num_batches=2)
    rows = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert len(rows) == 8 and whole.groups == 4
    expected = {key: sum(float(r["reward_extra"][key]) for r in rows) / len(rows) for key in ("acc", "index")}
    assert whole.reward_extra_means == pytest.approx(expected) and expected["acc"] == 5 / 8
    saved = json.loads((tmp_path / "o.summary.json").read_text())
    assert saved["reward_extra_means"] == pytest.approx(expected)
    assert [b["reward_extra_sums"]["acc"] for b in saved["batches"]] == [[3.0, 4], [2.0, 4]]
