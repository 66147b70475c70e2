"""agent.max_env_turns (verl's multi_turn.max_user_turns): the environment's turns a sample may take, apart from
the model's (agent.max_turns), on the fake turn engine; verl's num_turns of the result."""

from __future__ import annotations

import pytest

from pdsr_sdk.agent import AgentDone
from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch
from test_agent_session import PROMPTS, config


async def chatty(agent):
    """A tool's answer after every turn, until a limit says no."""
    await agent.generate()
    try:
        while True:
            await agent.generate(ids=[7, 8, 9], tool_name="calc")
    except AgentDone as done:
        return {"score": 0.0, "why": str(done), "env_turns": agent.env_turns}


@requires_torch
@pytest.mark.parametrize("max_env_turns", [1, 2, None])
def test_env_turns_are_bounded_apart_from_model_turns(tiny_model_dir, max_env_turns):
    from pdsr_sdk.rollout.padded import trainer_batch

    agent = {"max_turns": 4, "max_env_turns": max_env_turns}
    with RolloutSession(config(tiny_model_dir, agent=agent)) as session:
        out = session.step(PROMPTS[:1], agent=chatty)
    env = 3 if max_env_turns is None else max_env_turns   # max_turns 4: three answers between four turns
    for s, row in zip(out.samples, out.table.to_pylist()):
        assert [t.role for t in s.turns] == ["assistant", "environment"] * env + ["assistant"]
        assert s.finish_reason == "stop" and row["reward_extra"]["env_turns"] == env
        assert row["response_mask"].count(0) == 3 * env
        limit = (f"{env} environment turns, the limit (agent.max_env_turns); the 3 ids appended since the last "
                 f"turn are not in the trajectory" if max_env_turns else "4 turns, the limit (agent.max_turns)")
        assert row["reward_extra"]["why"] == f"sample {s.key}: {limit}"
    # verl's num_turns: user_turns + assistant_turns + 1
    counts = trainer_batch(out, pad_token_id=0, numpy=True).non_tensors["__num_turns__"].tolist()
    assert counts == [env + (env + 1) + 1] * len(out.samples)
