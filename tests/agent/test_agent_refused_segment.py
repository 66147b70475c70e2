"""A turn the engine refuses part-way (its continuation segment: fake turn engine) ends there: its entry keeps the
tokens it sampled and says ``failed`` (the engine refusing a turn's start: tests/agent/test_agent_ends_vllm.py)."""

from __future__ import annotations

from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch
from test_agent_session import PROMPTS, config
from turn_fakes import TurnEngine


class ContinuationRefusingEngine(TurnEngine):
    """A :class:`TurnEngine` that refuses every request continuing a turn (a turn's second segment on)."""

    def submit(self, req):
        if req.continued_tokens:
            self.clock.call_later(0.0, lambda rid=req.request_id: self.listener.on_request_failed(
                self, rid, "VLLMValidationError: refused mid-turn"))
            return
        super().submit(req)


async def two_turns(agent):
    await agent.generate()
    await agent.generate(ids=[7])
    return 1.0


@requires_torch
def test_a_turn_refused_part_way_ends_there_with_its_tokens(tiny_model_dir):
    cfg = config(tiny_model_dir, segments={"min_tokens": 2, "max_tokens": 2})
    engine = cfg.engines[0].model_copy(update={"backend": "test_agent_refused_segment:ContinuationRefusingEngine"})
    cfg = cfg.model_copy(update={"engines": [engine]})
    with RolloutSession(cfg) as session:
        out = session.step(PROMPTS[:1], agent=two_turns)
    for row in out.table.to_pylist():
        assert row["finish_reason"] == "failed" and "refused mid-turn" in row["error"] and row["reward"] is None
        assert [(t["role"], t["num_tokens"], t["finish_reason"]) for t in row["turns"]] == [("assistant", 2, "failed")]
        assert row["response_length"] == 2 and row["response_mask"] == [1, 1]
