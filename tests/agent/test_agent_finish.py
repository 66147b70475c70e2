"""A sample's finish reason when its agent stops before the budget refuses a turn (fake turn engine): ``length``
where the budget ended the conversation (the agent said so, or the environment's ids it left do not fit), ``stop``
where the agent just returned."""

from __future__ import annotations

from pdsr_sdk.agent import AgentDone
from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch
from test_agent_session import PROMPTS, config


async def stops_early(agent):
    """Sample 0 returns after a tool's answer that fits; 1 after one past the budget; 2 says the budget is too low;
    3 after one that fills the budget exactly (no token left for the model)."""
    await agent.generate()
    k = agent.sample_index
    left = agent.tokens_left
    if k == 0:
        agent.append(ids=[7, 7], tool_name="calc")
    elif k == 1:
        agent.append(ids=[7] * (left + 1), tool_name="calc")
    elif k == 2:
        agent.stop_for_budget()
        try:
            await agent.generate(ids=[7])
        except AgentDone as done:
            return {"score": 1.0, "why": str(done), "pending": agent.env_pending}
    else:
        agent.append(ids=[7] * left, tool_name="calc")
    return {"score": 1.0, "why": "", "pending": agent.env_pending}


@requires_torch
def test_an_agent_that_stops_for_its_budget_ends_length(tiny_model_dir):
    """An agent that stopped because too few tokens were left kept its last turn's 'stop', so an overlong filter
    took the cut conversation for a finished one; so did one that returned with a tool's answer that did not fit."""
    with RolloutSession(config(tiny_model_dir)) as session:
        out = session.step(PROMPTS[:1], agent=stops_early)
    rows = out.table.to_pylist()
    by_index = {s.index: (s, row) for s, row in zip(out.samples, rows)}
    assert [by_index[k][0].finish_reason for k in range(4)] == ["stop", "length", "length", "length"]
    for k, (s, row) in by_index.items():
        # the environment's ids the agent left are not in the trajectory: it ends with the model's first turn
        assert [t.role for t in s.turns] == ["assistant"] and s.turns[0].finish_reason == "stop"
        assert row["response_length"] == s.turns[0].num_tokens and row["reward"] == 1.0
        left = 200 - s.turns[0].num_tokens
        pending = {0: 2, 1: left + 1, 2: 1, 3: left}[k]
        assert row["reward_extra"]["pending"] == pending
    assert by_index[2][1]["reward_extra"]["why"] == (f"sample {by_index[2][0].key}: the agent stopped for its budget "
                                                     f"(stop_for_budget)")
