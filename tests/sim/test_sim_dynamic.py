"""Dynamic sampling in the simulator (``pdsr simulate --steps K --filter-groups zero-variance``): rewards in the
trace (one optional field; old traces load), the filtered stream against a naive filter of the trace's rewards,
and verl's DAPO recipe as the baseline."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pdsr_sdk.dispatch.steps import has_reward_variance
from pdsr_sdk.errors import DataError
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.steps import run_steps, simulate_steps
from pdsr_sdk.sim.steps_baseline import dapo_plan
from pdsr_sdk.traces import LengthTrace, read_trace
from pdsr_sdk.traces.io import write_trace_jsonl

N = 4


def passes(i: int) -> bool:
    """Group i has signal unless i % 3 == 0 (all wrong) or i % 7 == 0 (all right)."""
    return i % 3 != 0 and i % 7 != 0


def trace(groups: int = 400, seed: int = 0) -> LengthTrace:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 200, size=(groups, N))
    rewards = np.array([[float(k % 2) if passes(i) else float(i % 7 == 0) for k in range(N)] for i in range(groups)])
    return LengthTrace.from_matrix(lengths, prompt_lens=np.full(groups, 20), rewards=rewards, source="t.jsonl")


def config(**kw) -> SimulateConfig:
    return SimulateConfig(**{"policy": "baseline", "fast": 2, "heavy": 0, "steps": 4, "step_groups": 8,
                             "max_staleness": 0, "filter_groups": {"kind": "zero-variance"}, **kw})


def test_rewards_are_one_optional_trace_field(tmp_path):
    t = trace(5)
    t.rewards[3] = np.nan   # a sample without a reward
    path = write_trace_jsonl(t, tmp_path / "t.jsonl")
    back = read_trace(path)
    assert np.array_equal(back.lengths, t.lengths) and np.allclose(back.rewards, t.rewards, equal_nan=True)
    assert json.loads(path.read_text().splitlines()[0])["rewards"][3] is None
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"prompt_id": "a", "prompt_len": 3, "lengths": [1, 2]}) + "\n")
    assert read_trace(old).rewards is None and read_trace(old).group_rewards() == {}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt_id": "a", "prompt_len": 3, "lengths": [1, 2], "rewards": [1, "x"]}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: rewards\[1\] is 'x'"):
        read_trace(bad)


@pytest.mark.parametrize("over_provision", [None, 0.5])
def test_steps_consume_b_passing_groups_and_filter_the_rest(over_provision):
    t = trace()
    cfg = config()
    run = run_steps(t, cfg, "baseline", over_provision, keep_groups=True)
    rewards = t.group_rewards()
    consumed = [g.prompt_id for g in run.groups]
    assert all(s.groups >= 8 for s in run.steps) and len(consumed) == sum(s.groups for s in run.steps)
    assert all(has_reward_variance(rewards[p]) for p in consumed)
    assert all(passes(int(p[1:])) for p in consumed)
    filtered = sum(s.filtered for s in run.steps)
    launched = set(run.launched_at)
    # every launched group that fails is filtered, unless it is still in flight at the end
    failing = {p for p in launched if not passes(int(p[1:]))}
    assert len(failing) - run.dropped_groups <= filtered <= len(failing) and filtered > 0
    assert not set(consumed) & failing
    assert all(0 < s.pass_rate <= 1 for s in run.steps)


def test_the_dapo_recipe_generates_batches_of_3b_until_b_pass():
    t = trace()
    cfg = config(step_groups=10)
    plan = dapo_plan(t, cfg)
    # naive: consecutive batches of 30 groups; a step takes batches until 10 of their groups pass
    expect, i = [], 0
    for _ in range(cfg.steps):
        kept = made = 0
        while kept < 10:
            kept += sum(passes(g) for g in range(i, i + 30))
            i += 30
            made += 1
        expect.append(made)
    assert plan == expect
    lowpass = LengthTrace.from_matrix(t.lengths.reshape(-1, N), prompt_lens=t.prompt_lens,
                                      rewards=np.zeros(t.num_samples))
    with pytest.raises(DataError, match="DAPO recipe: step 1 generated 10 batches"):
        dapo_plan(lowpass, cfg)
    report = simulate_steps(t, cfg)
    assert len(report.baseline_steps_s) == cfg.steps and report.runs[0].over_provision is None


def test_filtering_needs_rewards_in_the_trace():
    t = trace(60)
    plain = LengthTrace.from_matrix(t.lengths.reshape(-1, N), prompt_lens=t.prompt_lens, source="plain.jsonl")
    with pytest.raises(DataError, match="plain.jsonl.*--filter-groups.*rewards"):
        run_steps(plain, config(), "baseline", None)


@pytest.mark.parametrize("policy", ["baseline", "v3"])
def test_on_policy_drops_the_groups_generating_at_a_steps_end_instead_of_restarting_them(policy):
    """On-policy (S = 0) with a filter, a group with tokens that a step's end does not take is dropped then:
    never consumed, its unfinished samples finished as 'dropped', its tokens counted; nothing is restarted
    for staleness, so every consumed token is of the step's own version."""
    from pdsr_sdk.dispatch.types import DROPPED

    t = trace()
    run = run_steps(t, config(policy=policy, steps=6), policy, 1.0, keep_groups=True)
    dropped = sum(s.dropped for s in run.steps)
    assert dropped > 0   # F = 1 keeps 2 x B in flight: the excess is generating at every step's end
    assert all(s.stale_restarts == 0 for s in run.steps)
    assert all(set(s.ages) <= {0} for s in run.steps)
    consumed = {g.prompt_id for g in run.groups}
    assert all(s.finish_reason != DROPPED for g in run.groups for s in g.samples)
    assert len(consumed) == sum(s.groups for s in run.steps)
    left = run.dropped_groups - dropped   # still in flight after the last step
    assert left >= 0 and run.dropped_tokens >= sum(s.dropped_tokens for s in run.steps) > 0
    # every launched group is consumed, filtered, dropped at a step's end, or still in flight: once each
    assert len(run.launched_at) == len(consumed) + sum(s.filtered for s in run.steps) + dropped + left


def test_a_step_that_launches_past_the_bound_ends_the_run_saying_why():
    from pdsr_sdk.errors import RunError

    t = trace(600)
    t.rewards[:] = 0.0   # every group all wrong: none ever passes
    with pytest.raises(RunError, match=r"step 0 has launched \d+ groups and 0 of the 8 .* bounds a step at 40\. "
                                       r"Nearly every group's rewards are all equal"):
        run_steps(t, config(filter_groups={"kind": "zero-variance", "max_launch_factor": 5}), "baseline", None)
    # a third of the groups fail: 8 passing ones take about 12 launches a step, within 4 x 8
    run = run_steps(trace(600), config(filter_groups={"kind": "zero-variance", "max_launch_factor": 4}), "baseline",
                    None)
    assert len(run.steps) == 4 and all(s.groups >= 8 and s.launched <= 32 for s in run.steps)
