"""Dynamic sampling and the overlong reward held to verl's DAPO recipe. The references below are verl's semantics
written from its formulas (not its code): the trainer keeps a group when the population std of its
``filter_groups.metric`` values is above 0 or it has one sample, and the DAPO reward manager adds
``min(-(L - (max_resp_len - len)) / len * penalty_factor, 0)`` to a response of L valid tokens."""

from __future__ import annotations

import asyncio
import json
import random
from fractions import Fraction

import numpy as np
import pytest

from pdsr_sdk.dispatch.steps import has_reward_variance
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.data import PromptRecord, build_groups
from pdsr_sdk.rollout.reward import OverlongShaping
from pdsr_sdk.rollout.reward_runner import RewardRunner
from pdsr_sdk.rollout.session import RolloutSession


def verl_keeps(values: list[float]) -> bool:
    """verl's DAPO trainer: keep a group of one, else one whose population std is above 0 (exact arithmetic)."""
    if len(values) == 1:
        return True
    exact = [Fraction(v) for v in values]
    mean = sum(exact) / len(exact)
    return sum((v - mean) ** 2 for v in exact) / len(exact) > 0


def verl_overlong(length: int, max_resp_len: int, buffer_len: int, factor: float) -> Fraction:
    """verl's DAPO reward manager: expected_len = max_resp_len - len, the excess over it, the penalty <= 0."""
    exceed = length - (max_resp_len - buffer_len)
    return min(-Fraction(exceed) / buffer_len * Fraction(factor), Fraction(0))


def test_zero_variance_is_verls_population_std_test_with_groups_of_one_kept():
    hand = [([1.0, 1.0, 1.0], False), ([0.0, 1.0, 0.0], True), ([-1.0, -1.0], False), ([0.5], True),
            ([0.0], True), ([True, False], True), ([0.25, 0.25, 0.2500001], True)]
    for values, kept in hand:
        assert verl_keeps(values) is kept and has_reward_variance(values) is kept, values
    rng = random.Random(7)
    for _ in range(2000):
        n = rng.choice([1, 2, 3, 4, 8, 16])
        pool = rng.choice([[0.0, 1.0], [-1.0, 1.0], [rng.random() for _ in range(3)]])
        values = [rng.choice(pool) for _ in range(n)]
        assert has_reward_variance(values) is verl_keeps(values), values
    # deliberate: equal values are equal; numpy's std of three 0.1s is 1.4e-17, which verl's test keeps
    assert np.std([0.1] * 3) > 0 and not has_reward_variance([0.1] * 3)
    # pdsr's own: a failed reward (None) is left out; a group of one keeps its sample only with a reward
    assert not has_reward_variance([1.0, None, 1.0]) and not has_reward_variance([None])


class NeverStarted:   # an engine the session must not reach
    def __getattr__(self, name):
        raise AssertionError("an engine was used")


class IdTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return str(ids[0])


def judged(outputs: list, lengths: list[int], *, reward_fn=None, decided=None, env_tokens=0, max_tokens=16,
           buffer=4, penalty=1.0, **filter_groups):
    """A finished group of ``len(outputs)`` samples of these lengths (``env_tokens`` of each the environment's),
    scored by the session's reward (sample i gets ``outputs[i]``, a number or a dict) and judged by the session's
    filter: (scores, passed)."""
    group = build_groups([PromptRecord("q1", "prompt", [1], "7")], len(outputs), max_tokens)[0]
    for k, s in enumerate(group.samples):
        s.token_ids, s.num_generated, s.finish_reason = [k], lengths[k] - env_tokens, "length"
        s.add_env_tokens(env_tokens)

    def reward(text, ground_truth, **info):
        return outputs[int(text)]
    cfg = RolloutConfig(overlong_buffer=buffer, overlong_penalty=penalty,
                        sampling={"max_tokens": max_tokens, "n": len(outputs)},
                        filter_groups={"kind": "zero-variance", **filter_groups})
    session = RolloutSession(cfg, engines=[NeverStarted()], reward=reward_fn or reward)

    async def run():
        session.rewards = RewardRunner(session.reward_for, IdTokenizer(), given=decided)
        scored = await session.rewards.wait(group.samples)
        return scored, session.group_filter(group, [sc.reward for sc in scored])
    try:
        return asyncio.run(run())
    finally:
        session.rewards.close()


def verl_metric(output, length: int, metric: str) -> float:
    """What verl's trainer compares for one response: ``acc`` (the dict's, or a number reward itself), ``score``
    (the reward's score), ``seq_reward`` (the score plus the overlong reward, max_resp_len 16, buffer 4)."""
    score = output["score"] if isinstance(output, dict) else output
    if metric == "acc":
        return float(output["acc"]) if isinstance(output, dict) else score
    return score + (float(verl_overlong(length, 16, 4, 1.0)) if metric == "seq_reward" else 0.0)


@pytest.mark.parametrize("metric", ["acc", "score", "seq_reward"])
def test_the_filter_compares_verls_metric(metric):
    """The recipe's metric is acc: a partial-credit reward whose scores differ within a group all wrong (acc
    False) is filtered under acc and kept under score; the shaped reward (seq_reward) differs with lengths."""
    cases = [([{"score": 0.2, "acc": False}, {"score": 0.6, "acc": False}], [4, 5]),
             ([{"score": 1.0, "acc": True}, {"score": 1.0, "acc": False}], [4, 5]),
             ([{"score": 0.0, "acc": np.bool_(True)}, {"score": 0.0, "acc": np.bool_(True)}], [13, 16]),
             ([1.0, 1.0, 1.0], [4, 14, 16]), ([0.0, 1.0], [3, 3]), ([1.0], [16])]
    rng = random.Random(3)
    for _ in range(30):
        n = rng.choice([1, 2, 4])
        cases.append(([{"score": rng.choice([0.0, 0.5, 1.0]), "acc": rng.random() < 0.5} for _ in range(n)],
                      [rng.randint(1, 16) for _ in range(n)]))
    for outputs, lengths in cases:
        scored, passed = judged(outputs, lengths, metric=metric)
        assert passed is verl_keeps([verl_metric(o, n, metric) for o, n in zip(outputs, lengths)]), (outputs, lengths)
        # the reward column is verl's seq_reward, the shaping logged as overlong_reward
        assert [sc.reward for sc in scored] == pytest.approx([verl_metric(o, n, "seq_reward")
                                                              for o, n in zip(outputs, lengths)])
        assert [json.loads(sc.extra)["overlong_reward"] for sc in scored] == pytest.approx(
            [float(verl_overlong(n, 16, 4, 1.0)) for n in lengths])


def test_acc_that_is_no_number_is_an_error_naming_the_sample_and_the_other_metric():
    with pytest.raises(ConfigError, match=r"filter_groups.metric 'acc': group 'q1' sample 1: the reward's acc is "
                                          r"'maybe'.*filter_groups.metric: score"):
        judged([{"score": 1.0, "acc": True}, {"score": 0.0, "acc": "maybe"}], [3, 3])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "nan"])
def test_an_acc_that_is_nan_is_left_out_and_the_run_goes_on(bad):
    """A NaN or infinite acc is no value: left out of its group's comparison as a failed reward is (it used to end
    the run as a config error), the other samples compared, the sample's score kept."""
    scored, passed = judged([{"score": 1.0, "acc": True}, {"score": 0.0, "acc": bad}, {"score": 0.0, "acc": False}],
                            [3, 3, 3])
    assert passed and [sc.reward for sc in scored] == [1.0, 0.0, 0.0]
    scored, passed = judged([{"score": 1.0, "acc": True}, {"score": 0.0, "acc": bad}], [3, 3])
    assert not passed   # one value left: nothing to compare it with


def test_the_simulator_refuses_a_metric_it_cannot_apply():
    from pdsr_sdk.sim.config import SimulateConfig

    with pytest.raises(ConfigError, match="filter_groups.metric .* the simulator compares the one reward"):
        SimulateConfig(steps=2, filter_groups={"kind": "zero-variance", "metric": "score"})
    assert SimulateConfig(steps=2, filter_groups={"kind": "zero-variance"}).filter_groups.metric == "acc"


def test_overlong_penalty_is_verls_from_the_formula():
    hand = {(12, 16, 4, 1.0): 0, (13, 16, 4, 1.0): Fraction(-1, 4), (16, 16, 4, 1.0): -1, (8, 16, 4, 1.0): 0,
            (14, 16, 4, 0.5): Fraction(-1, 4), (0, 16, 16, 1.0): 0, (8, 16, 16, 1.0): Fraction(-1, 2)}
    for (length, cap, buffer, factor), expected in hand.items():
        assert verl_overlong(length, cap, buffer, factor) == expected
        shaping = OverlongShaping(lambda text, truth, **info: 1.0, max_tokens=cap, buffer=buffer, penalty=factor)
        assert shaping.shaping(length) == pytest.approx(float(expected))
    rng = random.Random(11)
    for _ in range(500):
        cap = rng.randint(1, 4096)
        buffer, factor, length = rng.randint(1, cap), rng.choice([0.0, 0.5, 1.0, 2.5]), rng.randint(0, cap)
        shaping = OverlongShaping(lambda text, truth, **info: 1.0, max_tokens=cap, buffer=buffer, penalty=factor)
        assert shaping.shaping(length) == pytest.approx(float(verl_overlong(length, cap, buffer, factor)), abs=1e-12)
    # verl asserts max_resp_len >= overlong_buffer.len: a buffer as long as the cap shapes every response
    assert RolloutConfig(overlong_buffer=16, sampling={"max_tokens": 16}).overlong_buffer == 16
    with pytest.raises(ConfigError, match=r"overlong_buffer \(17\) must be at most sampling.max_tokens \(16\)"):
        RolloutConfig(overlong_buffer=17, sampling={"max_tokens": 16})


def test_every_response_is_shaped_a_sessions_reward_and_an_agents_too():
    """verl's DAPO reward manager shapes whatever compute_score gives; a session's reward= function and an
    agent's own reward are shaped as the config's reward is, over every response token (a multi-turn
    sample's environment tokens included, as verl's attention mask counts them)."""
    def own(text, ground_truth, **info):
        return 1.0
    scored, _ = judged([None, None], [12, 15], reward_fn=own)
    assert [sc.reward for sc in scored] == [1.0, 0.25] and [sc.score for sc in scored] == [1.0, 1.0]

    def agent(sample):   # an agent's own reward
        return 1.0, json.dumps({"acc": True}), None
    scored, passed = judged([None, None], [15, 16], reward_fn=own, decided=agent, env_tokens=6)
    assert [sc.reward for sc in scored] == [0.25, 0.0] and not passed   # acc True twice: no signal
    assert [json.loads(sc.extra) for sc in scored] == [{"acc": True, "overlong_reward": -0.75, "overlong": True},
                                                       {"acc": True, "overlong_reward": -1.0, "overlong": True}]
