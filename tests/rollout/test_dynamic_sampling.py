"""Dynamic sampling (DAPO) in the SDK step, on fake engines: each step returns B groups that pass the filter,
the filtered ones are exactly those a naive filter over the unfiltered results rejects, and they are counted."""

from __future__ import annotations

import re

import pytest

from pdsr_sdk.dispatch.steps import adaptive_in_flight, has_reward_variance, needed_launches
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch

PROMPTS = [{"id": f"q{i}", "prompt": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(40)]
B, N = 3, 4


def reward(text, ground_truth, *, prompt_id, sample_index, **info):
    """Every third prompt all right, every fifth all wrong, the others half right."""
    i = int(prompt_id[1:])
    if i % 3 == 0:
        return 1.0
    if i % 5 == 0:
        return 0.0
    return float(sample_index % 2)


def config(tiny_model_dir, **kw) -> RolloutConfig:
    return RolloutConfig(model=str(tiny_model_dir), policy="baseline", **{"batch_size": B, **kw},
                         sampling={"n": N, "max_tokens": 5},
                         engines=[{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine", "max_model_len": 256}])


def test_zero_variance_and_the_launch_arithmetic():
    assert not has_reward_variance([1.0, 1.0, 1.0]) and not has_reward_variance([0.0, None, 0.0])
    assert has_reward_variance([0.0, 1.0, None]) and not has_reward_variance([None, None])
    assert adaptive_in_flight(128, 0.5) == 256 and adaptive_in_flight(128, 1.0) == 128
    assert needed_launches(10, 10, 0.5) == 10 and needed_launches(10, 25, 0.5) == 0 and needed_launches(0, 0, 0.5) == 0


def reference_passing(tiny_model_dir) -> dict[str, bool]:
    """The naive reference: every prompt's group generated unfiltered, then the zero-variance filter."""
    with RolloutSession(config(tiny_model_dir, batch_size=len(PROMPTS)), reward=reward) as session:
        rows = session.step(PROMPTS).table.to_pylist()
    by_prompt: dict[str, list] = {}
    for r in rows:
        by_prompt.setdefault(r["prompt_id"], []).append(r["reward"])
    return {pid: len(set(rs)) > 1 for pid, rs in by_prompt.items()}


@requires_torch
@pytest.mark.parametrize("over_provision", [None, 0.5])
def test_each_step_returns_b_groups_that_pass_and_the_filtered_ones_fail(tiny_model_dir, over_provision):
    passing = reference_passing(tiny_model_dir)
    assert 0 < sum(passing.values()) < len(passing)
    cfg = config(tiny_model_dir, filter_groups={"kind": "zero-variance"}, over_provision=over_provision)
    seen: list[str] = []
    with RolloutSession(cfg, reward=reward) as session:
        prompts = iter(PROMPTS)
        for step in range(3):
            out = session.step(prompts if step == 0 else ())
            ids = [g.prompt_id for g in out.groups]
            filtered = [g.prompt_id for g in out.filtered]
            assert len(ids) == B and all(passing[p] for p in ids), (step, ids)
            assert all(not passing[p] for p in filtered), (step, filtered)
            assert out.summary["filtered_groups"] == len(filtered)
            assert out.summary["filtered_tokens"] == sum(s.num_generated for g in out.filtered for s in g.samples)
            assert len(out.filtered_scores) == N * len(filtered)
            assert all(not has_reward_variance([sc.reward for sc in out.filtered_scores[i:i + N]])
                       for i in range(0, len(out.filtered_scores), N))
            table = out.table.to_pylist()
            assert all(has_reward_variance([r["reward"] for r in table if r["prompt_id"] == p]) for p in ids)
            assert 0 < out.summary["pass_rate"] <= 1
            seen += ids + filtered + [g.prompt_id for g in out.dropped]
            assert out.summary["dropped_groups"] == len(out.dropped)
        carried = [g.prompt_id for g, _ in session.carried()]
    # every group launched is returned, filtered, dropped (on-policy: generating at a step's end) or still in
    # flight, once
    assert len(seen) == len(set(seen)) and not set(seen) & set(carried)
    assert set(seen) | set(carried) == {p["id"] for p in PROMPTS[:len(seen) + len(carried)]}


@requires_torch
def test_a_predicate_passed_to_the_session_is_the_filter(tiny_model_dir):
    """An SDK predicate (here: keep only groups whose prompt number is even) streams steps on its own."""
    calls = []

    def even(group, rewards):
        calls.append((group.prompt_id, list(rewards)))
        return int(group.prompt_id[1:]) % 2 == 0

    with RolloutSession(config(tiny_model_dir), reward=reward, group_filter=even) as session:
        out = session.step(iter(PROMPTS))
    assert len(out.groups) == B and all(int(g.prompt_id[1:]) % 2 == 0 for g in out.groups)
    assert all(int(g.prompt_id[1:]) % 2 for g in out.filtered)
    assert all(len(rs) == N and rs == [reward("", None, prompt_id=p, sample_index=i) for i in range(N)]
               for p, rs in calls)


def test_filtering_needs_a_reward():
    from pdsr_sdk.errors import ConfigError

    with pytest.raises(ConfigError, match="filter_groups.*reward is 'none'"):
        RolloutConfig(reward="none", filter_groups={"kind": "zero-variance"})


@requires_torch
def test_filtering_prompts_without_a_ground_truth_and_no_reward_for_them_is_an_error(tiny_model_dir):
    """reward 'auto' scores nothing without a ground truth: every group would be filtered, forever."""
    from pdsr_sdk.errors import ConfigError

    with RolloutSession(config(tiny_model_dir, filter_groups={"kind": "zero-variance"})) as session:
        with pytest.raises(ConfigError, match="filter_groups.*group 's0-p0' has none.*'auto'.*no ground truth"):
            session.step(["What is 1+1?", "What is 2+2?", "What is 3+3?"])


@requires_torch
def test_a_reward_that_always_fails_is_named_when_the_launch_bound_ends_the_run(tiny_model_dir):
    """Every call of the reward raised: every group was filtered (a failed reward is left out of the comparison),
    and the run ended with 'the prompts are too hard or too easy for this model', not a word of the reward's
    error. The error now says how many of the filtered groups' samples the reward failed on, and the first error."""
    from pdsr_sdk.errors import RunError

    def unreachable(text, ground_truth, **info):
        raise ConnectionError("the sandbox at port 8080 refused the connection")

    cfg = config(tiny_model_dir, filter_groups={"kind": "zero-variance", "max_launch_factor": 2})
    with RolloutSession(cfg, reward=unreachable) as session:
        with pytest.raises(RunError) as info:
            session.step(iter(PROMPTS))
    text = str(info.value)
    assert "max_launch_factor" in text   # the bound's own message stays
    failed = re.search(r"the reward failed on (\d+) of the (\d+) samples", text)
    assert failed and failed[1] == failed[2] and int(failed[1]) >= N * B, text   # every one of them
    assert "ConnectionError: the sandbox at port 8080 refused the connection" in text


@requires_torch
def test_prompts_given_after_the_source_ran_out_are_topped_up_from(tiny_model_dir):
    """A step whose prompts run out before B groups pass ends with what it has. The stream used to keep that for
    good: every later step, given prompts enough, still launched no top-up and returned fewer than B groups
    (B=2, step 1 given 20 new prompts: 1 group, 19 prompts untouched). New prompts now top up again."""
    judged = []

    def every_second(group, rewards):
        judged.append(group.prompt_id)
        return len(judged) % 2 == 0

    cfg = config(tiny_model_dir, batch_size=2, over_provision=0.0)
    with RolloutSession(cfg, reward=lambda text, ground_truth=None, **_: 0.0, group_filter=every_second) as session:
        first = session.step([f"a{i}" for i in range(3)])   # the 1st and 3rd judged filtered: none left
        assert len(first.groups) == 1 and len(first.filtered) == 2
        later = [session.step([f"b{i}" for i in range(20)] if k == 0 else ()) for k in range(2)]
    assert [len(out.groups) for out in later] == [2, 2]


@requires_torch
def test_the_launch_bound_counts_each_step_and_a_failed_steps_launches_stay_counted(tiny_model_dir):
    """B=1, max_launch_factor 2: a step launches at most 2 groups. Step 0 launched q0 (filtered), and its top-up
    refused 'bad', failing it. Its launch used to count toward the next step's bound: that step launched q2
    (filtered) and, with 2 launched, ended the session with "step 0 has launched 2 groups ... bounds a step at 2"
    where it had launched one. The bound now counts each step's own launches (the next step tops up with q3, which
    passes); its record still counts the failed step's launch, as it does that step's filtered group."""
    from pdsr_sdk.errors import DataError

    prompts = [{"id": k, "prompt": f"prompt {k}"} for k in ("q0", "bad", "q2", "q3", "q4")]
    prompts[1]["prompt"] = ""
    cfg = config(tiny_model_dir, batch_size=1, over_provision=0.0,
                 filter_groups={"kind": "zero-variance", "max_launch_factor": 2})
    with RolloutSession(cfg, reward=lambda text, ground_truth=None, **_: 0.0,
                        group_filter=lambda group, rewards: group.prompt_id not in ("q0", "q2")) as session:
        source = iter(prompts)
        with pytest.raises(DataError, match=r"step 0 prompts\[1\]: a prompt mapping needs a non-empty 'prompt'"):
            session.step(source)
        out = session.step(())
    assert [g.prompt_id for g in out.groups] == ["q3"]
    assert [g.prompt_id for g in out.filtered] == ["q0", "q2"]
    assert out.summary["launched_groups"] == 3 and out.summary["filtered_groups"] == 2, out.summary
