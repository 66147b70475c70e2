"""``session.serve`` answering many requests on fake engines (tests/turn_fakes.py) with the real ``openai`` client:
what the session keeps stays the same, however many requests a server running for days has answered."""

from __future__ import annotations

import pytest

from support import requires_torch

openai = pytest.importorskip("openai")

from serve_client import serving  # noqa: E402

pytestmark = requires_torch


def kept(session) -> dict[str, int]:
    sched = session.scheduler
    return {"reward_jobs": len(session.rewards._jobs), "open_groups": len(sched._open),
            "agent_fns": len(session.agents._fns), "outcomes": len(session.agents.outcomes)}


def test_a_server_keeps_the_same_after_60_requests_as_after_20(tiny_model_dir):
    """Every finished sample of a request was handed to the reward runner (a named sample's reward is read from
    it), and the runner kept each one, its tokens and log-probs, for good: a plain request's samples are never
    read again. Their jobs now go when the request's group is done: after 60 requests the session keeps what it
    kept after 20, nothing."""
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": 64},
                        engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:TurnEngine",
                                  "max_model_len": 256, "max_num_seqs": 4}])
    with RolloutSession(cfg) as session, serving(session, model_name="tiny") as (client, _):
        sizes = []
        for i in range(60):
            if i % 2:
                r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"hi {i}"}],
                                                   n=2)
                assert len(r.choices) == 2
            else:
                c = client.completions.create(model="tiny", prompt=f"Once upon a time {i}", max_tokens=3)
                assert c.usage.completion_tokens == 3
            if i + 1 in (20, 60):
                sizes.append(session._call(_kept_on_loop(session), "kept"))
    assert sizes[0] == sizes[1] == {"reward_jobs": 0, "open_groups": 0, "agent_fns": 0, "outcomes": 0}


async def _kept_on_loop(session) -> dict[str, int]:
    return kept(session)   # read on the session's loop, between its callbacks
