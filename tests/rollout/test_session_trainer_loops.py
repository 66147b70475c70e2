"""A trainer's loop around a session, as a slime / AReaL user writes it (docs/sdk.md): steps one at a time, and the
pipelined loop of the docs ending when its trainer raises (fake engines from the config, tests/fakes.py)."""

from __future__ import annotations

import asyncio

import pytest

from support import WAIT_S, requires_torch
from pdsr_sdk.errors import RunError

pytestmark = requires_torch


def fake_config(tiny_model_dir, **kw):
    """Two fake engines from the config (responses run to max_tokens)."""
    from pdsr_sdk import RolloutConfig

    return RolloutConfig(model=str(tiny_model_dir), batch_size=2, policy="baseline",
                         sampling={"n": 2, "max_tokens": 8},
                         engines=[{"name": "fast-0", "pool": "fast", "backend": "fakes:LoopEngine"},
                                  {"name": "heavy-0", "pool": "heavy", "backend": "fakes:LoopEngine"}], **kw)


@pytest.mark.parametrize("streaming", [False, True])
def test_a_second_step_while_one_runs_is_an_error_and_the_first_completes(tiny_model_dir, streaming):
    """A step (or a generate batch) started while another runs used to take over the dispatch run's batch (the
    stream's step end, with partial rollout): the first step then waited for good, and the second returned the
    first's groups under its own index. Now the second is a RunError saying steps run one at a time; the first
    returns its own groups, and the next step runs as usual."""
    from pdsr_sdk import RolloutSession
    from pdsr_sdk.rollout.data import PromptRecord

    cfg = fake_config(tiny_model_dir, **({"over_provision": 0.5, "max_staleness": 1} if streaming else {}))

    async def scenario():
        async with RolloutSession(cfg) as session:
            first = asyncio.create_task(session.astep([{"id": "a", "prompt": "a"}, {"id": "b", "prompt": "b"}]))
            await asyncio.sleep(0)   # the first step has begun: it awaits the engines
            assert not first.done()
            with pytest.raises(RunError, match=r"step: another step is running on this session; steps run one at "
                                               r"a time: call it after that step returns"):
                await session.astep(["x", "y"])
            with pytest.raises(RunError, match=r"generate: another step is running"):
                await session.generate([PromptRecord("g", "g", [1, 2, 3])])
            out = await asyncio.wait_for(first, WAIT_S)
            after = await session.astep([{"id": "c", "prompt": "c"}, {"id": "d", "prompt": "d"}], last=streaming)
            return out, after

    out, after = asyncio.run(scenario())
    assert sorted(g.prompt_id for g in out.groups) == ["a", "b"]
    assert all(len(g.samples) == 2 and all(s.token_ids for s in g.samples) for g in out.groups)
    assert after.step == out.step + 1 and sorted(g.prompt_id for g in after.groups) == ["c", "d"]
