"""agent.env_timeout_s holds for an agent that blocks the event loop (a tool's synchronous call): its timer cannot
fire while the loop is held, so the time is checked again when the agent calls generate() or returns. Fake turn
engine (tests/turn_fakes.py); one sample, so no other agent's timer runs during the block."""

from __future__ import annotations

import time

import pytest

from support import requires_torch
from test_agent_session import PROMPTS, config

BLOCK_S, TIMEOUT_S = 2.5, 1.0   # time.sleep blocks at least BLOCK_S: past the timeout on any machine


async def blocks_then_generates(agent):
    await agent.generate()
    time.sleep(BLOCK_S)
    await agent.generate(ids=[7, 8])
    return 1.0


async def blocks_then_returns(agent):
    await agent.generate()
    time.sleep(BLOCK_S)
    return 1.0


@requires_torch
@pytest.mark.parametrize("agent", [blocks_then_generates, blocks_then_returns])
def test_an_agent_that_blocks_past_the_timeout_fails_its_sample(tiny_model_dir, agent):
    from pdsr_sdk.rollout.session import RolloutSession

    cfg = config(tiny_model_dir, agent={"env_timeout_s": TIMEOUT_S})
    cfg = cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"n": 1})})
    with RolloutSession(cfg) as session:
        out = session.step(PROMPTS[:1], agent=agent)
    (row,) = out.table.to_pylist()
    assert row["finish_reason"] == "failed" and row["reward"] is None
    assert row["error"] == ("the agent took longer than agent.env_timeout_s (1 s) between turns (the event loop was "
                            "held past it, as a tool's blocking call holds it: run blocking code with "
                            "asyncio.to_thread)")
    assert row["env_s"] >= BLOCK_S
    assert [t["role"] for t in row["turns"]] == ["assistant"]   # the turn after the block never ran
    assert out.summary["agent_failed"] == 1
