"""bench/record_trace.py's GSM8K scorer (the last number against the answer, as lm-evaluation-harness's
flexible-extract), and the recorded trace it made: rewards per sample, read back as the simulator reads them."""

from __future__ import annotations

import pytest

from pdsr_sdk.traces import read_trace
from support import ROOT, load_bench


def load():
    return load_bench("record_trace")


@pytest.mark.parametrize("response, truth, right", [
    ("She sells 9 eggs for $2 each, so 18 dollars.", "9 * 2 = 18\n#### 18", 1.0),
    ("The answer is 1,250.", "#### 1250", 1.0),
    ("So it is 18.0", "#### 18", 1.0),
    ("First 18, then 20.", "#### 18", 0.0),   # the last number counts
    ("I do not know.", "#### 18", 0.0),
    ("-3 degrees", "#### -3", 1.0),
    ("", "#### 5", 0.0),
    ("x is 5", "\\frac{1}{2}", 0.0),   # a ground truth that is not a number
])
def test_last_number_scorer(response, truth, right):
    assert load().last_number_right(response, truth) == right


def test_the_recorded_gsm8k_trace_has_a_reward_per_sample():
    trace = read_trace(ROOT / "bench" / "data" / "smollm2-gsm8k-128x8-rewards.jsonl")
    assert trace.num_groups == 128 and trace.samples_per_group == 8 and trace.rewards.shape == trace.lengths.shape
    assert set(trace.rewards.tolist()) == {0.0, 1.0}
    passing = sum(len(set(r)) > 1 for r in trace.group_rewards().values())
    assert 0 < passing < 128   # some groups carry GRPO signal, most do not (SmolLM2 solves 1.5%)
