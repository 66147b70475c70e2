"""How a multi-turn sample ends, on the shared real vLLM engines (tiny model): a sample its response budget ends says
``length`` (as a trainer's overlong filter reads it), one its turn limit ends keeps its last turn's reason, one whose
agent returns after a stopped turn says ``stop``, and a turn the engine refuses leaves no empty turn in the row.

Every token id is a stop token here, so each turn is one sampled token ending ``stop``: the budget and the turn limit,
not the model, decide where each sample ends."""

from __future__ import annotations

import pytest

from pdsr_sdk.agent import AgentDone
from support import requires_vllm, run_on

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # uses the shared real engines (tests/conftest.py)

BUDGET, MAX_TURNS = 7, 4


async def ending_agent(agent):
    """One case a prompt: how its sample ends (see the test)."""
    case = agent.prompt_id
    await agent.generate()
    if case == "stop":
        return 1.0
    if case == "env-over":    # the tool's output does not fit in what is left; AgentDone propagates
        await agent.generate(ids=[7] * (agent.tokens_left + 1))
    if case == "spent":       # 1, 4, 7 tokens: the budget is spent at the fourth turn; the agent catches AgentDone
        try:
            while True:
                await agent.generate(ids=[7, 7])
        except AgentDone:
            return 0.5
    if case == "turns":       # 1, 2, 3, 4 tokens: the turn limit comes first
        while True:
            await agent.generate(ids=[])
    return None


def run_step(engine_loop, vllm_pair, tiny_model_dir, cases, agent, **session_kw):
    """One step of ``agent`` on a prompt per case (its id), every token id a stop token."""
    from pdsr_sdk.config import load_config
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.preflight import model_vocab_size
    from pdsr_sdk.rollout.session import RolloutSession

    vocab = model_vocab_size(tiny_model_dir)
    cfg = load_config(RolloutConfig, None, {
        "model": str(tiny_model_dir), "sampling.n": 2, "sampling.max_tokens": BUDGET, "policy": "v3",
        "reward": "math_boxed", "agent.max_turns": MAX_TURNS, "sampling.stop_token_ids": list(range(vocab))})
    prompts = [{"id": c, "prompt": "Hi", "ground_truth": "1", "extra_info": {"vocab": vocab}} for c in cases]

    async def go():
        async with RolloutSession(cfg, engines=vllm_pair) as session:
            for k, v in session_kw.items():
                setattr(session.agents, k, v)
            return await session.astep(prompts, agent=agent)

    return run_on(engine_loop, go()), vocab


def test_a_budget_end_says_length_and_a_turn_limit_end_its_last_turns(engine_loop, vllm_pair, tiny_model_dir):
    """Samples its budget ended (the environment's output not fitting, or the model's turns and the environment's
    spending it; AgentDone propagated or caught) said ``stop``, their last turn's reason: an overlong filter kept them
    as complete."""
    from pdsr_sdk.rollout.padded import trainer_batch

    out, _ = run_step(engine_loop, vllm_pair, tiny_model_dir, ["stop", "env-over", "spent", "turns"], ending_agent)
    rows = out.table.to_pylist()
    assert len(rows) == 8
    for row in rows:
        case, turns = row["prompt_id"], row["turns"]
        model = [t for t in turns if t["role"] == "assistant"]
        assert all(t["num_tokens"] == 1 and t["finish_reason"] == "stop" for t in model), (case, turns)
        assert row["response_mask"] == [int(t["role"] == "assistant") for t in turns for _ in range(t["num_tokens"])]
        expect = {"stop": ("stop", 1, 1), "env-over": ("length", 1, 1), "spent": ("length", 3, BUDGET),
                  "turns": ("stop", MAX_TURNS, MAX_TURNS)}[case]
        assert (row["finish_reason"], len(model), row["response_length"]) == expect, (case, row)
        assert row["error"] is None and row["reward"] == {"stop": 1.0, "spent": 0.5}.get(case, 0.0)
    batch = trainer_batch(out, pad_token_id=0, numpy=True)
    assert batch.non_tensors["finish_reasons"].tolist() == [r["finish_reason"] for r in rows]


async def refused_agent(agent):
    """Sample 0's next turn carries an id the engine refuses; sample 1's is one of the vocabulary."""
    await agent.generate()
    await agent.generate(ids=[agent.info["extra_info"]["vocab"] + 5 if agent.sample_index == 0 else 7])
    return 1.0


def test_a_turn_the_engine_refuses_leaves_no_empty_turn(engine_loop, vllm_pair, tiny_model_dir):
    """The refused turn's entry stayed in ``turns`` with no token and no finish reason: a trainer counting turns
    (verl's ``__num_turns__``) counted a model turn that never ran. The session's own check of the ids is off here, as
    if it had missed one."""
    out, vocab = run_step(engine_loop, vllm_pair, tiny_model_dir, ["refused"], refused_agent, vocab=lambda: None)
    rows = {r["sample_index"]: r for r in out.table.to_pylist()}
    refused, ok = rows[0], rows[1]
    assert refused["finish_reason"] == "failed" and refused["reward"] is None
    assert "refused request" in refused["error"] and "out of vocabulary" in refused["error"]
    # the model's first turn, then the environment's id as appended (masked): nothing of the refused turn
    assert [(t["role"], t["num_tokens"], t["finish_reason"]) for t in refused["turns"]] == [
        ("assistant", 1, "stop"), ("environment", 1, None)]
    assert refused["response_token_ids"][1:] == [vocab + 5] and refused["response_mask"] == [1, 0]
    assert [(t["role"], t["num_tokens"]) for t in ok["turns"]] == [("assistant", 1), ("environment", 1),
                                                                   ("assistant", 1)]
    assert ok["finish_reason"] == "stop" and ok["reward"] == 1.0
    # verl's count: the prompt and each span (it counted the refused turn too)
    from pdsr_sdk.rollout.padded import trainer_batch

    samples = sorted(out.samples, key=lambda s: s.index)
    assert trainer_batch(samples, pad_token_id=0, numpy=True).non_tensors["__num_turns__"].tolist() == [3, 4]
