"""Rewards as samples finish (pdsr_sdk.rollout.reward_runner), on fake engines: the scores a step returns are
the ones scoring after the step gives, and a reward that blocks does not hold up the engines."""

from __future__ import annotations

import threading

import pytest

from pdsr_sdk.dispatch.trajectory import reward_extra_struct, sample_row, trajectory_schema
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession
from support import WAIT_S, raised_in_thread, requires_torch

PROMPTS = [{"id": f"q{i}", "prompt": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(3)]


def config(tiny_model_dir, **kw) -> RolloutConfig:
    return RolloutConfig(model=str(tiny_model_dir), policy="baseline", batch_size=3,
                         sampling={"n": 4, "max_tokens": 6},
                         engines=[{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine", "max_model_len": 256}],
                         **kw)


def dict_reward(text, ground_truth, *, sample_index, prompt_id, response_length, **info):
    """A score from the text and the row, extra fields, and an error on one sample of each group."""
    if sample_index == 2:
        raise ValueError(f"no score for {prompt_id}/2")
    return {"score": float(len(text) % 5 + sample_index), "truth": ground_truth, "tokens": response_length}


@requires_torch
@pytest.mark.parametrize("workers", [1, 3])
def test_the_rewards_a_step_returns_are_those_scoring_after_the_step_gives(tiny_model_dir, workers):
    with RolloutSession(config(tiny_model_dir, reward_workers=workers), reward=dict_reward) as session:
        out = session.step(PROMPTS)
        after = [sample_row(s, session.tokenizer, dict_reward) for s in out.samples]   # the old way: after the step
    import pyarrow as pa

    got = out.table.to_pylist()
    after = reward_extra_struct(pa.Table.from_pylist(after, schema=trajectory_schema())).to_pylist()   # a struct
    keys = ("prompt_id", "sample_index", "response_text", "reward", "reward_extra", "reward_error")
    assert [{k: r[k] for k in keys} for r in got] == [{k: r[k] for k in keys} for r in after]
    assert sum(r["reward_error"] is not None for r in got) == 3 == out.summary["reward_errors"]
    assert all(r["reward"] is not None for r in got if r["sample_index"] != 2)
    assert out.summary["reward_s"] >= 0 and out.summary["reward_wait_s"] >= 0
    assert [s.reward for s in out.scores] == [r["reward"] for r in got]
    tokens = [r["reward_extra"]["tokens"] for r in got if r["reward_extra"] is not None]   # "truth" is text
    assert len(tokens) == 9 and out.summary["reward_extra_means"] == {"tokens": pytest.approx(sum(tokens) / 9)}


@requires_torch
def test_a_reward_that_blocks_does_not_stall_the_engines(tiny_model_dir):
    """Every reward call waits until every sample of the step has finished: scored on the event loop that
    feeds the engines, the first call would keep all other samples from finishing."""
    total = len(PROMPTS) * 4
    finished: list = []
    all_finished = threading.Event()
    waited: list[bool] = []

    def blocking(text, ground_truth, **info):
        waited.append(all_finished.wait(WAIT_S))
        return 1.0

    def on_sample(sample):
        finished.append(sample.key)
        if len(finished) == total:
            all_finished.set()

    with RolloutSession(config(tiny_model_dir, reward_workers=1), reward=blocking) as session:
        session.hooks.on_sample_done.append(on_sample)
        out = session.step(PROMPTS)
    assert waited and all(waited), "a reward call waited in vain for the engines to finish the step"
    assert len(out.samples) == total and all(r["reward"] == 1.0 for r in out.table.to_pylist())


@requires_torch
def test_a_reward_raising_keyboard_interrupt_stops_the_step_with_an_error_naming_it(tiny_model_dir):
    """A reward that raises KeyboardInterrupt itself (no Ctrl-C reaches its worker thread): the step raises a RunError
    naming it and the session closes. Before, the KeyboardInterrupt ended the session's event loop and step() waited
    for good."""
    from pdsr_sdk.errors import RunError

    def interrupting(text, ground_truth, *, sample_index, **info):
        if sample_index == 1:
            raise KeyboardInterrupt("sandbox gone")
        return 1.0

    def run():
        with RolloutSession(config(tiny_model_dir, reward_workers=2), reward=interrupting) as session:
            session.step(PROMPTS)

    error = raised_in_thread(run, "step() never returned after the reward raised KeyboardInterrupt")
    assert isinstance(error, RunError), error
    assert "the reward function raised KeyboardInterrupt (sandbox gone) on sample 1 of prompt" in str(error)


@requires_torch
def test_a_restarted_sample_is_scored_again(tiny_model_dir):
    """A sample that finishes a second time (regenerated) gets the score of its new response, not the old one."""
    import asyncio

    from pdsr_sdk.rollout.reward_runner import RewardRunner

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return ",".join(map(str, ids))

    from pdsr_sdk.dispatch.types import Group, Sample

    g = Group("p", [1], "p", n=1)
    s = Sample(g, 0, max_tokens=4, token_ids=[1, 2], num_generated=2, finish_reason="stop")
    g.samples = [s]

    async def main():
        runner = RewardRunner(lambda group: (lambda text, truth, **info: float(len(text))), Tok())
        first = (await runner.wait([s]))[0]
        s.token_ids, s.num_generated, s.restarts = [1, 2, 3, 44], 4, 1
        assert runner.result(s) is None                 # the old score is not this state's
        second = (await runner.wait([s]))[0]
        runner.close()
        return first, second

    first, second = asyncio.run(main())
    assert (first.text, first.reward) == ("1,2", 3.0) and (second.text, second.reward) == ("1,2,3,44", 8.0)
