"""docs/agents.md's "Coming from verl's agent loop, SkyRL or rLLM": its gym-like environment, wrapped as the agent
function, run as the page gives it on the fake turn engine (tests/turn_fakes.py); each sample's reward and turns
are checked against the environment replayed on the row's own sampled text, and verl's AgentLoopOutput fields
against the row."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch
from test_agent_session import config

DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"
PROMPTS = [{"id": f"q{i}", "prompt": f"Guess a digit ({i}).", "answer": str(i)} for i in range(3)]


def doc_agent() -> dict:
    section = DOC.read_text().split("## Coming from verl's agent loop, SkyRL or rLLM", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(code, str(DOC), "exec"), scope)   # the page's code, as a reader copies it
    return scope


def replay(env_cls, answer, texts):
    """The environment stepped on each model turn's text, apart from pdsr: (rewards, observations, done)."""
    env = env_cls()
    env.reset(answer)
    rewards, obs, done = [], [], False
    for text in texts:
        o, r, done = env.step(text)
        rewards.append(r)
        obs.append(o)
        if done:
            break
    return rewards, obs, done


@requires_torch
@pytest.mark.parametrize("max_turns", [2, 4])
def test_the_pages_environment_agent_runs_and_its_rows_are_verls_fields(tiny_model_dir, max_turns):
    from pdsr_sdk.rollout.padded import trainer_batch

    scope = doc_agent()
    with RolloutSession(config(tiny_model_dir, agent={"max_turns": max_turns})) as session:
        out = session.step(PROMPTS, agent=scope["run"])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = out.table.to_pylist()
    seen = set()
    for row in rows:
        assert row["error"] is None and row["finish_reason"] in ("stop", "length")
        ids, mask, turns = row["response_token_ids"], row["response_mask"], row["turns"]
        model = [t for t in turns if t["role"] == "assistant"]
        texts = [tok.decode(ids[t["start_token"]:t["start_token"] + t["num_tokens"]], skip_special_tokens=True)
                 for t in model]
        rewards, obs, done = replay(scope["GuessEnv"], row["ground_truth"], texts)
        assert len(rewards) == len(model)            # one step per model turn, none after the last
        assert row["reward"] == rewards[-1]
        # done ends the sample; otherwise only the turn limit does (3 tries, so max_turns 2 always hits it)
        assert done or len(model) == max_turns
        env_spans = [tok.decode(ids[t["start_token"]:t["start_token"] + t["num_tokens"]])
                     for t in turns if t["role"] == "environment"]
        assert len(env_spans) == len(model) - 1 and all(o in s for o, s in zip(obs, env_spans))
        assert sum(mask) == sum(t["num_tokens"] for t in model) and len(mask) == len(ids)
        assert len(model) <= min(max_turns, 3)
        seen.add((done, rewards[-1]))
    # both ends are taken: a right guess (reward 1), and a wrong last one (the tries or the turn limit)
    assert {(True, 1.0)} < seen and any(r == 0.0 for _, r in seen)
    batch = trainer_batch(out, pad_token_id=0, numpy=True)
    assert batch.non_tensors["__num_turns__"].tolist() == [1 + len(r["turns"]) for r in rows]
    for i, row in enumerate(rows):   # AgentLoopOutput's prompt_ids / response_ids / response_mask, padded
        resp = batch.tensors["responses"][i][:len(row["response_token_ids"])].tolist()
        assert resp == row["response_token_ids"]
        assert batch.tensors["response_mask"][i][:len(resp)].tolist() == row["response_mask"]
        assert batch.tensors["rollout_log_probs"][i][:len(resp)].tolist() == pytest.approx(row["response_logprobs"])
