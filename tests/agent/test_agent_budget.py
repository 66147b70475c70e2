"""An environment whose output does not fit in what is left of a sample's response budget: the agent hears why, and
the trajectory ends with the model's last turn (fake turn engine)."""

from __future__ import annotations

from pdsr_sdk.agent import AgentDone
from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch
from test_agent_session import PROMPTS, config


async def long_tool_output(agent):
    """Sample 0's tool answers with more tokens than are left; the others' turns spend the budget themselves."""
    await agent.generate()
    try:
        if agent.sample_index == 0:
            agent.append(ids=[7] * (agent.tokens_left + 5), tool_name="search")
            await agent.generate()
        while True:
            await agent.generate(ids=[7])
    except AgentDone as done:
        return {"score": 0.0, "why": str(done)}


@requires_torch
def test_an_environment_output_past_the_budget_says_so(tiny_model_dir):
    """AgentDone said "its 200 response tokens are spent" when the model had sampled a handful: the environment's
    output, which the agent can shorten, was what did not fit."""
    with RolloutSession(config(tiny_model_dir, agent={"max_turns": 200})) as session:
        out = session.step(PROMPTS[:1], agent=long_tool_output)
    for s, row in zip(out.samples, out.table.to_pylist()):
        why = row["reward_extra"]["why"]
        if s.index == 0:
            first = s.turns[0].num_tokens
            assert [t.role for t in s.turns] == ["assistant"] and row["response_length"] == first
            assert why == (f"sample {s.key}: the {200 - first + 5} tokens the environment appended since the last "
                           f"turn do not fit in the {200 - first} left of its 200 response tokens "
                           f"(sampling.max_tokens); they are not in the trajectory")
        else:
            assert row["response_length"] == 200
            assert why == f"sample {s.key}: its 200 response tokens (sampling.max_tokens) are spent"
