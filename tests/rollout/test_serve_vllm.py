"""``pdsr serve``'s server on real vLLM engines (CPU build, tiny model), with the real ``openai`` client: a plain
chat request, named samples (chat and completions) whose every turn's prompt, as vLLM received it, is their
recorded trajectory, and a streamed chat request."""

from __future__ import annotations

import asyncio
import queue

import httpx
import pytest

from pdsr_sdk.engines.request_observer import PromptLog
from support import WAIT_S, requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # uses the shared real engines (tests/conftest.py)


def test_openai_client_on_real_engines(engine_loop, vllm_pair, tiny_model_dir):
    import openai

    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    session = RolloutSession(RolloutConfig(model=str(tiny_model_dir), sampling={"max_tokens": 200}), engines=vllm_pair)
    ready: queue.Queue = queue.Queue()

    async def serve():
        logs = [PromptLog() for _ in vllm_pair]
        for e, plog in zip(vllm_pair, logs):
            e.observer = plog
        try:
            async with session:
                await session.aserve(port=0, on_ready=ready.put, model_name="tiny")
                tok = session.tokenizer
        finally:
            log = [x for plog in logs for x in plog.entries]
            for e in vllm_pair:
                e.observer = None
        return log, tok

    running = asyncio.run_coroutine_threadsafe(serve(), engine_loop)
    try:
        port = ready.get(timeout=WAIT_S)
        base = f"http://127.0.0.1:{port}/v1"
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=WAIT_S)
        plain = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                               max_tokens=8, n=2)
        assert len(plain.choices) == 2 and 0 < plain.usage.completion_tokens <= 16
        convo = [{"role": "user", "content": "Add 2 and 3."}]
        for turn in range(3):
            r = client.chat.completions.create(model="tiny", messages=convo, max_tokens=10,
                                               extra_headers={"X-Pdsr-Sample": "agent-1"})
            convo += [{"role": "assistant", "content": r.choices[0].message.content},
                      {"role": "user" if turn else "tool", "content": f"result {turn}"}]
        row = httpx.post(f"{base}/pdsr/samples/agent-1/end", json={"reward": 1.0}, timeout=WAIT_S).json()
        # completions: each prompt is the previous one, the returned text and the environment's text
        first = prompt = "Count with me: one, two,"
        env = [" three? Go on:", "\nNext line"]
        for turn in range(3):
            c = client.completions.create(model="tiny", prompt=prompt, max_tokens=10,
                                          extra_headers={"X-Pdsr-Sample": "c-1"})
            if turn < 2:
                prompt += c.choices[0].text + env[turn]
        crow = httpx.post(f"{base}/pdsr/samples/c-1/end", json={"reward": 0.5}, timeout=WAIT_S).json()
        chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                                     max_tokens=8, stream=True))
    finally:
        session.stop_serving()
    log, tok = running.result(WAIT_S)
    assert row["reward"] == 1.0 and [t["role"] for t in row["turns"]] == ["assistant",
                                                                          "environment"] * 2 + ["assistant"]
    prompt, response = row["prompt_token_ids"], row["response_token_ids"]
    mine = [ids for rid, ids in log if rid.startswith("sample-agent-1/")]
    assert len(mine) >= 3
    assert all(ids == prompt + response[:len(ids) - len(prompt)] for ids in mine)   # token-exact, vLLM's view
    assert sum(row["response_mask"]) == sum(t["num_tokens"] for t in row["turns"] if t["role"] == "assistant")

    # the completions sample: token-exact as vLLM saw it, its prompt and environment text encoded once each
    prompt, response = crow["prompt_token_ids"], crow["response_token_ids"]
    assert crow["reward"] == 0.5 and [t["role"] for t in crow["turns"]] == ["assistant", "environment"] * 2 + [
        "assistant"]
    assert prompt == tok(first)["input_ids"]
    mine = [ids for rid, ids in log if rid.startswith("sample-c-1/")]
    assert len(mine) >= 3
    assert all(ids == prompt + response[:len(ids) - len(prompt)] for ids in mine)
    spans = [response[t["start_token"]:t["start_token"] + t["num_tokens"]] for t in crow["turns"]
             if t["role"] == "environment"]
    assert spans == [tok(text, add_special_tokens=False)["input_ids"] for text in env]
    # the stream: its role, then the turn's tokens as they came (tests/rollout/test_serve_stream_vllm.py), then its
    # finish reason
    assert chunks[0].choices[0].delta.role == "assistant" and {c.object for c in chunks} == {"chat.completion.chunk"}
    ids = [i for c in chunks[1:] for i in c.choices[0].token_ids]
    assert 0 < len(ids) <= 8
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == tok.decode(ids, skip_special_tokens=True)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
