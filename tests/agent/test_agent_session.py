"""The agent API through a session, on fake engines (tests/turn_fakes.py): turns, the chat template's tokens
between them, rewards from the agent or the reward function, and failures kept to their sample."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pdsr_sdk.agent import AgentDone, AgentError
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch

PROMPTS = [{"id": f"q{i}", "prompt": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(3)]


def config(tiny_model_dir, **kw) -> RolloutConfig:
    kw.setdefault("batch_size", 3)
    return RolloutConfig(model=str(tiny_model_dir), policy="v3", reward="math_boxed",
                         sampling={"n": 4, "max_tokens": 200},
                         engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:TurnEngine",
                                   "max_model_len": 512, "max_num_seqs": 4}], **kw)


async def tool_agent(agent):
    first = await agent.generate()
    assert first.finish_reason == "stop" and first.token_ids[-1] == 2
    added = agent.append([{"role": "tool", "content": "42"}], tool_name="calc")
    assert agent.tokenizer.decode(added) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    await agent.generate()
    return 0.5 + agent.sample_index


async def until_done(agent):
    """Generates until AgentDone (the turn limit), lets it propagate."""
    await agent.generate()
    while True:
        await agent.generate(ids=[7, 8])


async def bad_agent(agent):
    await agent.generate()
    k = agent.sample_index
    if k == 1:
        raise KeyError("tool")
    if k == 2:
        await asyncio.sleep(3600)
    if k == 3:
        return {"no": "score"}
    return None


@requires_torch
def test_turns_rewards_and_the_summary(tiny_model_dir):
    with RolloutSession(config(tiny_model_dir)) as session:
        out = session.step(PROMPTS, agent=tool_agent)
    rows = out.table.to_pylist()
    assert len(rows) == 12
    for row in rows:
        assert [t["role"] for t in row["turns"]] == ["assistant", "environment", "assistant"]
        assert row["turns"][1]["tool_name"] == "calc"
        assert row["reward"] == 0.5 + row["sample_index"] and row["error"] is None
        assert row["response_mask"].count(0) == row["turns"][1]["num_tokens"]
    assert out.summary["turns_mean"] == 2 and out.summary["agent_failed"] == 0
    assert out.summary["turns"] == 24
    # as a trainer's batch: the loss mask leaves out the tool's tokens, which stay in the attention mask
    from pdsr_sdk.rollout.padded import trainer_batch

    full = trainer_batch(out, pad_token_id=0, numpy=True)
    batch = full.tensors
    assert full.non_tensors["__num_turns__"].tolist() == [4] * 12   # verl's count: the prompt and three turns
    for i, (s, row) in enumerate(zip(out.samples, rows)):
        n = len(s.token_ids)
        assert (batch["response_mask"][i][:n].tolist() == row["response_mask"]
                and not batch["response_mask"][i][n:].any())
        assert batch["attention_mask"][i][-batch["responses"].shape[1]:][:n].all()
        assert batch["token_level_scores"][i][n - 1] == pytest.approx(row["reward"])
        # the environment's tokens: no version (as padding), log-prob 0 (padding: -1)
        env = batch["response_mask"][i][:n] == 0
        assert env.any() and (batch["token_versions"][i][:n][env] == -1).all()
        assert (batch["token_versions"][i][:n][~env] >= 0).all() and (batch["rollout_log_probs"][i][:n][env] == 0).all()


@requires_torch
def test_the_turn_limit_ends_a_sample_and_the_reward_function_scores_it(tiny_model_dir):
    cfg = config(tiny_model_dir, agent={"max_turns": 3, "function": "test_agent_session:until_done"})
    with RolloutSession(cfg) as session:
        out = session.step(PROMPTS[:1])
    for s, row in zip(out.samples, out.table.to_pylist()):
        assert sum(t.role == "assistant" for t in s.turns) == 3
        assert s.finish_reason == "stop" and row["reward"] == 0.0 and row["reward_error"] is None


@requires_torch
def test_failures_stay_with_their_sample(tiny_model_dir):
    with RolloutSession(config(tiny_model_dir, agent={"env_timeout_s": 0.5})) as session:
        out = session.step(PROMPTS, agent=bad_agent)
    rows = out.table.to_pylist()
    for row in rows:
        k = row["sample_index"]
        if k == 0:
            assert row["finish_reason"] == "stop" and row["error"] is None and row["reward"] == 0.0
        else:
            assert row["finish_reason"] == "failed" and row["reward"] is None
            assert {1: "KeyError: 'tool'", 2: "env_timeout_s (0.5 s)", 3: "without 'score'"}[k] in row["error"]
    assert out.summary["agent_failed"] == 9


async def exiting_tool_agent(agent):
    """Sample 1's tool runs the model's code in this process, and the code calls sys.exit (as code RL's often does)."""
    await agent.generate()
    if agent.sample_index == 1:
        await asyncio.to_thread(exec, "import sys; sys.exit(3)")
    await agent.generate([{"role": "tool", "content": "ok"}])
    return 1.0


@requires_torch
def test_a_tool_that_calls_sys_exit_fails_its_sample_only(tiny_model_dir):
    """SystemExit is no Exception: it went through the agent's task and stopped the session's event loop, and the
    step hung (the sync form) or the caller's loop ended with it (the async form)."""
    async def go():
        async with RolloutSession(config(tiny_model_dir)) as session:
            return await asyncio.wait_for(session.astep(PROMPTS[:2], agent=exiting_tool_agent), 60)

    out = asyncio.run(go())
    for row in out.table.to_pylist():
        if row["sample_index"] == 1:
            assert row["finish_reason"] == "failed" and row["error"] == "the agent raised SystemExit: 3"
        else:
            assert row["error"] is None and row["reward"] == 1.0
    assert out.summary["agent_failed"] == 2


@requires_torch
def test_misuse_is_clear(tiny_model_dir):
    async def append_first(agent):
        agent.append(ids=[1])

    async def first_with_messages(agent):
        await agent.generate([{"role": "user", "content": "x"}])

    async def zero_tokens(agent):
        await agent.generate()
        await agent.generate(ids=[7], max_tokens=0)

    async def first_bounded(agent):   # the first turn ran before the agent: its max_tokens used to be ignored
        await agent.generate(max_tokens=5)

    async def first_bounded_by_the_budget(agent):   # no lower than the limit the first turn ran under: taken
        await agent.generate(max_tokens=200)
        return 1.0

    with RolloutSession(config(tiny_model_dir)) as session:
        for fn, expect in ((append_first, "take it with `await agent.generate()`"),
                           (first_with_messages, "the first turn runs on the data row's prompt"),
                           (zero_tokens, "generate(max_tokens=0): a turn's limit is a positive int"),
                           (first_bounded, "generate(max_tokens=5) cannot bound the first turn: it runs on the data "
                                           "row's prompt before the agent starts, under agent.turn_max_tokens "
                                           "(--turn-max-tokens; not set: the budget, sampling.max_tokens, so up to "
                                           "200 tokens)")):
            rows = session.step(PROMPTS[:1], agent=fn).table.to_pylist()
            assert len(rows) == 4 and all(expect in r["error"] for r in rows)
        out = session.step(PROMPTS[:1], agent=first_bounded_by_the_budget)
        assert [(r["error"], r["reward"]) for r in out.table.to_pylist()] == [(None, 1.0)] * 4
    with RolloutSession(config(tiny_model_dir, agent={"turn_max_tokens": 50})) as session:
        rows = session.step(PROMPTS[:1], agent=first_bounded).table.to_pylist()
        assert len(rows) == 4 and all("(--turn-max-tokens; now 50, so up to 50 tokens)" in r["error"] for r in rows)
    with pytest.raises(ConfigError, match="async def run"):
        RolloutSession(config(tiny_model_dir), agent=lambda agent: None)
    assert issubclass(AgentError, Exception) and issubclass(AgentDone, Exception)


async def structured_tool_agent(agent):
    """Sample 0 appends a tool's result as text parts, 1 as a dict (as a tool returns it), 2 a message not in a list."""
    await agent.generate()
    content = {0: [{"type": "text", "text": "x = 42"}, "done"], 1: {"x": 42}}.get(agent.sample_index)
    message = {"role": "tool", "content": content}
    agent.append([message] if agent.sample_index != 2 else message)
    await agent.generate()
    return 1.0


@requires_torch
def test_a_tools_content_is_text_or_a_clear_error(tiny_model_dir):
    """A dict result was rendered as Python's repr ({'x': 42}) into the trajectory, with no word; text parts were
    rendered as a list's repr; a lone message was iterated as its keys (a ValueError from dict()). Text parts are
    now joined with newlines, as vLLM's server joins them, and the others fail their sample naming the message."""
    with RolloutSession(config(tiny_model_dir)) as session:
        out = session.step(PROMPTS[:1], agent=structured_tool_agent)
        tok = session.tokenizer
    rows = {r["sample_index"]: r for r in out.table.to_pylist()}
    env = rows[0]["turns"][1]
    env_ids = rows[0]["response_token_ids"][env["start_token"]:env["start_token"] + env["num_tokens"]]
    assert tok.decode(env_ids) == "\n<|im_start|>tool\nx = 42\ndone<|im_end|>\n<|im_start|>assistant\n"
    assert rows[1]["finish_reason"] == "failed" and "messages[0].content must be a string" in rows[1]["error"]
    assert "got dict {'x': 42}" in rows[1]["error"]
    assert rows[2]["finish_reason"] == "failed" and "append takes a list of messages" in rows[2]["error"]
    assert rows[3]["error"] is None and rows[3]["reward"] == 1.0


def _rollout_agent(tiny_model_dir, tmp_path, *flags: str) -> tuple[list[dict], Any]:
    """``pdsr rollout --agent ...`` on the fake turn engine (2 prompts, 200 tokens a sample): its rows and path."""
    import pyarrow.parquet as pq
    import yaml
    from click.testing import CliRunner

    from pdsr_cli.main import cli

    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"model": str(tiny_model_dir), "engines": [
        {"name": "f0", "pool": "fast", "backend": "turn_fakes:TurnEngine", "max_model_len": 512, "max_num_seqs": 4}]}))
    out = tmp_path / "mt.parquet"
    r = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), *flags, "--batch-size", "2", "--limit", "2",
                                 "--max-tokens", "200", "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    return pq.read_table(out).to_pylist(), out


@requires_torch
def test_pdsr_rollout_agent_writes_multi_turn_rows(tiny_model_dir, tmp_path):
    import json

    rows, out = _rollout_agent(tiny_model_dir, tmp_path, "--agent", "test_agent_session:bad_agent",
                               "--agent-timeout", "0.5", "--max-turns", "3", "--n", "4")
    assert len(rows) == 8 and sum(row["finish_reason"] == "failed" for row in rows) == 6
    assert all(row["turns"][0]["role"] == "assistant" for row in rows)
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["stats"]["agent_failed"] == 6 and summary["stats"]["turns"] == 8


@requires_torch
def test_pdsr_rollout_turn_max_tokens_and_max_turns_bound_each_turn(tiny_model_dir, tmp_path):
    """agent.turn_max_tokens had no flag (a config file only), so a first turn could take the whole budget."""
    rows, _ = _rollout_agent(tiny_model_dir, tmp_path, "--agent", "test_agent_session:slow_env_agent",
                             "--turn-max-tokens", "4", "--max-turns", "2", "--n", "2")
    assert len(rows) == 4
    for row in rows:   # two turns (the agent asks for a third: AgentDone ends the sample), each cut at 4 tokens
        turns = [t for t in row["turns"] if t["role"] == "assistant"]
        assert [(t["num_tokens"], t["finish_reason"]) for t in turns] == [(4, "length")] * 2, row["turns"]
    from click.testing import CliRunner

    from pdsr_cli.main import cli

    assert "--turn-max-tokens N" in CliRunner().invoke(cli, ["rollout", "--help"]).output


async def slow_env_agent(agent):
    """Three turns with a tool that takes a while: samples are between turns when steps end."""
    await agent.generate()
    for _ in range(2):
        await asyncio.sleep(0.02 * (1 + agent.sample_index))
        await agent.generate([{"role": "tool", "content": "42"}])


@requires_torch
def test_partial_rollout_carries_multi_turn_samples_across_steps(tiny_model_dir):
    """Over-provisioned steps: groups a step's end leaves carry into the next, their agents going on; every
    consumed sample holds its three turns, token-exact (the engine checks every request's context), with the
    policy version of each sampled span, and none is restarted."""
    cfg = config(tiny_model_dir, over_provision=1.0, step_groups=2, batch_size=2)
    prompts = iter([{"id": f"q{i}", "prompt": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(12)])
    versions = set()
    with RolloutSession(cfg, agent=slow_env_agent) as session:
        steps = []
        for k in range(4):
            steps.append(session.step(prompts if k == 0 else (), last=k == 3))
            session.policy_version = k + 1
    consumed = [s for out in steps for s in out.samples]
    assert len(consumed) == sum(len(out.groups) * 4 for out in steps) and len(steps[0].groups) == 2
    for s in consumed:
        assert [t.role for t in s.turns] == ["assistant", "environment"] * 2 + ["assistant"]
        assert s.restarts == 0 and s.finish_reason == "stop"
        sampled = [i for i, m in enumerate(s.response_mask) if m]
        assert len(sampled) == sum(seg.num_tokens for seg in s.segments)
        versions |= {seg.policy_version for seg in s.segments if seg.num_tokens}
    assert max(out.summary["carried_groups"] for out in steps[:-1]) > 0   # steps did leave groups in flight
    assert len(versions) > 1


def test_an_agent_with_a_staleness_bound_is_refused(tiny_model_dir):
    from pdsr_sdk.errors import ConfigValueError

    with pytest.raises(ConfigValueError, match="a multi-turn sample is never restarted"):
        config(tiny_model_dir, over_provision=1.0, max_staleness=1, agent={"function": "test_agent_session:tool_agent"})
    with pytest.raises(ConfigValueError, match="a multi-turn sample is never restarted"):
        RolloutSession(config(tiny_model_dir, over_provision=1.0, max_staleness=2), agent=tool_agent)
    config(tiny_model_dir, over_provision=1.0, agent={"function": "test_agent_session:tool_agent"})   # no bound: fine
