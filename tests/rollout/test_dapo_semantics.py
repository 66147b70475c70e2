"""The overlong reward held to verl's DAPO recipe. The reference below is verl's semantics written from its
formula (not its code): the DAPO reward manager adds ``min(-(L - (max_resp_len - len)) / len * penalty_factor,
0)`` to a response of L valid tokens."""

from __future__ import annotations

import asyncio
import json
import random
from fractions import Fraction

import pytest

from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.data import PromptRecord, build_groups
from pdsr_sdk.rollout.reward import OverlongShaping
from pdsr_sdk.rollout.reward_runner import RewardRunner
from pdsr_sdk.rollout.session import RolloutSession


def verl_overlong(length: int, max_resp_len: int, buffer_len: int, factor: float) -> Fraction:
    """verl's DAPO reward manager: expected_len = max_resp_len - len, the excess over it, the penalty <= 0."""
    exceed = length - (max_resp_len - buffer_len)
    return min(-Fraction(exceed) / buffer_len * Fraction(factor), Fraction(0))


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
    assert [json.loads(sc.extra) for sc in scored] == [{"acc": True, "overlong_reward": -0.75},
                                                       {"acc": True, "overlong_reward": -1.0}]
