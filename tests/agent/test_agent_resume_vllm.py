"""``pdsr rollout --agent ... --resume`` on the shared real vLLM engines (tests/conftest.py): a multi-turn run stopped
after its first batch resumes to a file with every group once, the first batch's rows as they were written, and
every row a whole multi-turn trajectory (the model's turns, the tool's tokens between them masked out). The refusals
of a resume with another agent or limits: tests/agent/test_agent_resume.py (fake engines). A ``--steps`` run
stopped after its first step, with a multi-turn group carried, runs that group again from its prompt on
``--resume`` (docs/agents.md, "Across steps": an agent cannot be resumed in the middle of its conversation)."""

from __future__ import annotations

import asyncio
import json

import pyarrow.parquet as pq
import pytest

from support import requires_vllm, run_on

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # uses the shared real engines (tests/conftest.py)

TURN = 6   # each model turn's token limit
TOOL = "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"   # what the tool's message renders to


#: prompts whose agent waits on its environment after the first turn until the run stops (a carried group)
HELD: set = set()


async def two_turn_agent(agent):
    """A model turn, the tool's answer, another model turn; the reward function scores the sample."""
    await agent.generate()   # the first turn ran under agent.turn_max_tokens
    if agent.prompt_id in HELD:
        await asyncio.sleep(3600)   # cancelled when the run stops
    agent.append([{"role": "tool", "content": "42"}], tool_name="calculator")
    await agent.generate()
    return None


class SimulatedCrash(Exception):
    """(not KeyboardInterrupt: raised inside a task it would stop the shared test loop itself)"""


def run(engine_loop, engines, tiny_model_dir, data, out, **over):
    from pdsr_sdk.config import load_config
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.run import run_rollout_async

    cfg = load_config(RolloutConfig, None, {
        "model": str(tiny_model_dir), "data.path": str(data), "sampling.n": 2, "sampling.max_tokens": 64,
        "batch_size": 2, "policy": "v3", "reward": "math_boxed", "output.path": str(out),
        "agent.function": "test_agent_resume_vllm:two_turn_agent", "agent.turn_max_tokens": TURN, **over})
    summary = run_on(engine_loop, run_rollout_async(cfg, engines=engines))
    return summary, pq.read_table(out).to_pylist()


def test_a_multi_turn_run_stopped_after_its_first_batch_resumes_with_every_group_once(
        engine_loop, vllm_pair, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from pdsr_sdk.rollout import run as run_module

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i} + {i}? Use the calculator.",
                                        "answer": str(2 * i)}) + "\n" for i in range(4)))
    out = tmp_path / "mt.parquet"
    calls = {"n": 0}
    real_generate = run_module.RolloutSession.generate

    async def generate_then_crash(self, records, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise SimulatedCrash()
        return await real_generate(self, records, **kw)

    run_module.RolloutSession.generate = generate_then_crash
    try:
        with pytest.raises(SimulatedCrash):
            run(engine_loop, vllm_pair, tiny_model_dir, data, out)
    finally:
        run_module.RolloutSession.generate = real_generate
    parts = sorted((tmp_path / "mt.parquet.parts").glob("part-*.parquet"))
    assert parts and not out.exists()
    first = {(r["prompt_id"], r["sample_index"]): r for f in parts for r in pq.read_table(f).to_pylist()}
    assert {p for p, _ in first} == {"q0", "q1"}

    summary, rows = run(engine_loop, vllm_pair, tiny_model_dir, data, out, **{"output.resume": True})
    assert summary.skipped_groups == 2 and summary.groups == 4 and summary.samples == 8
    keys = [(r["prompt_id"], r["sample_index"]) for r in rows]
    assert len(keys) == len(set(keys)) == 8 and {p for p, _ in keys} == {f"q{i}" for i in range(4)}
    assert {r["prompt_id"]: r["batch_index"] for r in rows} == {"q0": 0, "q1": 0, "q2": 1, "q3": 1}
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for r in rows:
        key = (r["prompt_id"], r["sample_index"])
        if key in first:   # the first batch's rows are kept as written, not generated again
            assert r["response_token_ids"] == first[key]["response_token_ids"], key
            assert r["response_logprobs"] == first[key]["response_logprobs"], key
        assert_whole(r, tok)


def assert_whole(r, tok):
    """``r`` is a whole two-turn trajectory: its spans cover the response, masked by role."""
    ids, mask = r["response_token_ids"], r["response_mask"]
    key = (r["prompt_id"], r["sample_index"])
    assert [t["role"] for t in r["turns"]] == ["assistant", "environment", "assistant"], key
    assert r["response_length"] == len(ids) == len(mask) == len(r["response_logprobs"])
    for t in r["turns"]:
        span = range(t["start_token"], t["start_token"] + t["num_tokens"])
        assert [mask[i] for i in span] == [int(t["role"] == "assistant")] * len(span), key
        if t["role"] == "assistant":
            assert 1 <= t["num_tokens"] <= TURN, key
        else:
            assert tok.decode([ids[i] for i in span]).endswith(TOOL), key
    assert sum(t["num_tokens"] for t in r["turns"]) == len(ids)
    assert r["reward"] in (0.0, 1.0) and r["reward_error"] is None and r["error"] is None


def test_a_steps_run_stopped_with_a_multi_turn_group_carried_runs_it_again_from_its_prompt(
        engine_loop, vllm_pair, tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from pdsr_sdk.rollout import run as run_module
    from pdsr_sdk.rollout.writer import carry_file

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(3)))
    out = tmp_path / "steps.parquet"
    opts = {"steps": 3, "step_groups": 1, "over_provision": 1.0}   # 2 groups in flight, 1 consumed a step

    def stop(*args, **kwargs):
        raise RuntimeError("stopped after a step")

    write = run_module.write_text_atomic
    monkeypatch.setattr(run_module, "write_text_atomic", stop)   # the summary's write after the first step
    HELD.add("q1")
    try:
        with pytest.raises(RuntimeError, match="stopped after a step"):
            run(engine_loop, vllm_pair, tiny_model_dir, data, out, **opts)
    finally:
        HELD.clear()
        monkeypatch.setattr(run_module, "write_text_atomic", write)
    before = pq.read_table(out.with_name(out.name + ".parts")).to_pylist()
    carry = pq.read_table(carry_file(out)).to_pylist()
    assert {r["prompt_id"] for r in before} == {"q0"}
    assert "q1" in {r["prompt_id"] for r in carry}
    held = [r for r in carry if r["prompt_id"] == "q1"]
    assert all(r["response_length"] and r["finish_reason"] is None for r in held)   # its first turns, unfinished

    summary, rows = run(engine_loop, vllm_pair, tiny_model_dir, data, out, **opts, **{"output.resume": True})
    got = {(r["prompt_id"], r["sample_index"]): r for r in rows}
    assert len(rows) == len(got) == 6 and {p for p, _ in got} == {"q0", "q1", "q2"}
    assert summary.skipped_groups == 1
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for r in rows:
        assert_whole(r, tok)
    for c in held:   # run again from its prompt: no token of the first run's version 0
        r = got[(c["prompt_id"], c["sample_index"])]
        assert 0 not in r["policy_versions"] and r["batch_index"] >= 1, r["policy_versions"]
    assert not carry_file(out).exists() and not out.with_name(out.name + ".parts").exists()
