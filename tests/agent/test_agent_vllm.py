"""Multi-turn rollouts on real vLLM engines (CPU build, tiny model, float32): token-exact trajectories, the
environment's tokens masked, engine log-probs against the trainer's recomputation, failures kept to their sample."""

from __future__ import annotations

import asyncio

import pytest

from pdsr_sdk.engines.request_observer import PromptLog
from support import requires_vllm, run_on

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # uses the shared real engines (tests/conftest.py)

PROMPTS = [{"id": f"q{i}", "prompt": f"What is {i} + {i}? Use the calculator.", "ground_truth": str(2 * i)}
           for i in range(3)]


async def calculator_agent(agent):
    """Three model turns: the prompt, after a tool result, after a user turn."""
    await agent.generate()
    agent.append([{"role": "tool", "content": "42"}], tool_name="calculator")
    await agent.generate(max_tokens=12)
    last = await agent.generate([{"role": "user", "content": "So, the final answer?"}], max_tokens=12)
    return {"score": float(len(last.token_ids) > 0), "turns": agent.turns}


async def failing_agent(agent):
    await agent.generate()
    k = agent.sample_index
    if k == 1:
        raise RuntimeError("the tool crashed")
    if k == 2:
        await asyncio.sleep(3600)   # hangs past env_timeout_s
    if k == 3:
        return "not a reward"
    agent.append(ids=[10, 11, 12])
    await agent.generate(max_tokens=4)
    return None   # the reward function scores it


def _session(tiny_model_dir, engines, **agent):
    from pdsr_sdk.config import load_config
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    cfg = load_config(RolloutConfig, None, {
        "model": str(tiny_model_dir), "sampling.n": 4, "sampling.max_tokens": 96, "sampling.temperature": 1.0,
        "policy": "v3", "reward": "math_boxed", **{f"agent.{k}": v for k, v in agent.items()}})
    return RolloutSession(cfg, engines=engines)


@pytest.fixture(scope="module")
def multi_turn(engine_loop, vllm_pair, tiny_model_dir):
    """One step of calculator_agent over the shared engines, with every request's prompt ids as vLLM got them."""
    async def go():
        logs = [PromptLog() for _ in vllm_pair]
        for e, log in zip(vllm_pair, logs):
            e.observer = log
        try:
            async with _session(tiny_model_dir, vllm_pair, turn_max_tokens=16) as session:
                result = await session.astep(PROMPTS, agent=calculator_agent)
                return result, [x for log in logs for x in log.entries], session.tokenizer
        finally:
            for e in vllm_pair:
                e.observer = None
    return run_on(engine_loop, go())


def test_every_turn_prompt_vllm_received_is_the_trajectory(multi_turn):
    result, log, tokenizer = multi_turn
    samples = {s.key: s for s in result.samples}
    mismatches = 0
    for rid, got in log:
        s = samples[rid.split("#")[0]]
        prompt = s.group.prompt_token_ids
        mismatches += got != prompt + s.token_ids[:len(got) - len(prompt)]
    assert mismatches == 0
    # every turn after the first starts from the previous turns' ids and the environment's: one request at least
    assert len(log) >= sum(sum(t.role == "assistant" for t in s.turns) for s in result.samples)
    for s in result.samples:
        assert [t.role for t in s.turns] == ["assistant", "environment"] * 2 + ["assistant"]
        assert s.finish_reason in ("stop", "length")


def test_decode_then_encode_is_not_the_sampled_ids_and_pdsr_keeps_the_sampled(multi_turn):
    result, log, tokenizer = multi_turn
    differs = 0
    for s in result.samples:
        first = s.turns[0]
        ids = s.token_ids[first.start_token:first.start_token + first.num_tokens]
        text = tokenizer.decode(ids, skip_special_tokens=False)
        differs += tokenizer(text, add_special_tokens=False)["input_ids"] != ids
    assert differs > 0   # the tiny model samples token sequences that do not survive decode-encode


def test_environment_tokens_are_the_templates_and_masked(multi_turn):
    result, _, tokenizer = multi_turn
    rows = result.table.to_pylist()
    for s, row in zip(result.samples, rows):
        mask = row["response_mask"]
        assert len(mask) == len(row["response_token_ids"]) == len(row["response_logprobs"])
        env = [t for t in s.turns if t.role == "environment"]
        assert env[0].tool_name == "calculator"
        tool_text = tokenizer.decode(s.token_ids[env[0].start_token:env[0].start_token + env[0].num_tokens])
        assert tool_text.endswith("<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")
        model_turn = s.turns[0]
        last_sampled = s.token_ids[model_turn.start_token + model_turn.num_tokens - 1]
        # the model's turn ended with <|im_end|>: the template's newline is the environment's; cut at the
        # turn's limit, the environment closes the turn itself
        expect_head = "\n<|im_start|>" if last_sampled == tokenizer.eos_token_id else "<|im_end|>\n<|im_start|>"
        assert tool_text.startswith(expect_head)
        for t in s.turns:
            span = mask[t.start_token:t.start_token + t.num_tokens]
            assert span == [1 if t.role == "assistant" else 0] * t.num_tokens
        assert sum(mask) == s.sampled_tokens and row["env_s"] is not None
        assert row["reward"] in (0.0, 1.0) and row["reward_extra"] == {"turns": 3}
    assert result.summary["turns_mean"] == 3 and result.summary["agent_failed"] == 0
    assert result.summary["tokens"] == sum(s.sampled_tokens for s in result.samples)


def test_engine_logprobs_match_the_trainers_recomputation(multi_turn, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    result, _, _ = multi_turn
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32).eval()
    diffs = []
    for s in result.samples:
        prompt = s.group.prompt_token_ids
        ids = torch.tensor([prompt + s.token_ids])
        with torch.no_grad():
            logits = model(ids).logits.float()
        lp = torch.log_softmax(logits[0, len(prompt) - 1:-1], -1).gather(-1, ids[0, len(prompt):, None])[:, 0]
        for i, m in enumerate(s.response_mask):
            if m:
                diffs.append(abs(lp[i].item() - s.logprobs[i]))
    assert diffs
    assert sum(diffs) / len(diffs) <= 1e-3 and max(diffs) <= 1e-2


def test_a_failing_agent_fails_its_sample_only(engine_loop, vllm_pair, tiny_model_dir):
    async def go():
        async with _session(tiny_model_dir, vllm_pair, turn_max_tokens=8, env_timeout_s=2.0) as session:
            return await session.astep(PROMPTS[:2], agent=failing_agent)

    result = run_on(engine_loop, go())
    rows = {(r["prompt_id"], r["sample_index"]): r for r in result.table.to_pylist()}
    assert len(rows) == 8
    for (pid, k), row in rows.items():
        if k == 0:
            assert row["finish_reason"] in ("stop", "length") and row["error"] is None
            assert row["response_mask"].count(0) == 3
        else:
            assert row["finish_reason"] == "failed" and row["reward"] is None
            expect = {1: "RuntimeError: the tool crashed", 2: "env_timeout_s", 3: "'not a reward'"}[k]
            assert expect in row["error"]
    assert result.summary["agent_failed"] == 6


def test_the_agent_tools_example_smoke_line(engine_loop, vllm_pair, tiny_model_dir):
    """examples/agent_tools.py --smoke's step, on the shared engines: every sample takes scripted turns, and every
    turn's prompt vLLM received is the trajectory."""
    from examples.agent_tools import config, parse, smoke
    from pdsr_sdk.rollout.session import RolloutSession

    async def go():
        async with RolloutSession(config(parse(["--smoke"])), engines=vllm_pair) as session:
            return await smoke(session, session.load_prompts())

    line = run_on(engine_loop, go())
    assert line["trajectories"] == 8 and line["failed"] == 0 and line["token_mismatches"] == 0
    assert line["turns_mean"] >= 2 and line["turn_requests"] >= line["turns_mean"] * 8
    assert line["tool_calls"] >= 0 and line["reward_mean"] is not None
