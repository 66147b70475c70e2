"""``session.aserve()`` on fake engines (tests/turn_fakes.py), with the real ``openai`` client: the OpenAI routes,
named samples recorded token-exact across requests, their end and reward, and bad requests."""

from __future__ import annotations

import queue
import threading

import httpx
import pytest

from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession
from support import WAIT_S, requires_torch
from turn_fakes import turn_length

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": 64},
                        agent={"env_timeout_s": 30},
                        engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:TurnEngine",
                                  "max_model_len": 256, "max_num_seqs": 4}])
    with RolloutSession(cfg) as session:
        ready: queue.Queue = queue.Queue()
        thread = threading.Thread(target=session.serve, kwargs={"port": 0, "on_ready": ready.put,
                                                                "model_name": "tiny"})
        thread.start()
        port = ready.get(timeout=WAIT_S)
        base = f"http://127.0.0.1:{port}/v1"
        yield session, openai.OpenAI(base_url=base, api_key="none", max_retries=0), base
        session.stop_serving()
        thread.join(WAIT_S)


@requires_torch
def test_models_chat_and_completions(served):
    session, client, _ = served
    assert [m.id for m in client.models.list().data] == ["tiny"]
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=2)
    assert len(r.choices) == 2 and all(c.finish_reason == "stop" for c in r.choices)
    assert r.usage.completion_tokens == sum(5 + 3 * i for i in range(2))   # turn_length of samples 0 and 1
    c = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=3)
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 3


@requires_torch
def test_a_named_sample_is_recorded_token_exact_and_ends_with_its_reward(served):
    session, client, base = served
    tok = session.tokenizer
    convo = [{"role": "user", "content": "What is 2+2?"}]
    first = client.chat.completions.create(model="tiny", messages=convo, extra_headers={"X-Pdsr-Sample": "s1"})
    convo += [{"role": "assistant", "content": first.choices[0].message.content},
              {"role": "tool", "content": "4"}]
    second = client.chat.completions.create(model="tiny", messages=convo, max_tokens=3,
                                            extra_body={"pdsr_sample": "s1"})
    assert second.choices[0].finish_reason == "length"
    row = httpx.post(f"{base}/pdsr/samples/s1/end", json={"reward": 0.75}, timeout=WAIT_S).json()
    assert row["finished"] and row["reward"] == 0.75
    assert [t["role"] for t in row["turns"]] == ["assistant", "environment", "assistant"]
    first_ids = row["response_token_ids"][:row["turns"][0]["num_tokens"]]
    assert row["turns"][0]["num_tokens"] == turn_length_of_first()
    env = row["turns"][1]
    env_ids = row["response_token_ids"][env["start_token"]:env["start_token"] + env["num_tokens"]]
    assert first_ids[-1] == tok.eos_token_id   # the sampled end of turn is kept; the newline after it is template
    assert tok.decode(env_ids) == "\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n"
    assert row["response_mask"] == [1] * len(first_ids) + [0] * len(env_ids) + [1] * 3


def turn_length_of_first() -> int:
    class _G:
        position = 0

    class _S:
        index = 0
        group = _G()
    return turn_length(_S())


@requires_torch
def test_bad_requests_get_clear_errors(served):
    session, client, base = served
    with pytest.raises(openai.BadRequestError, match="stream=true is not supported"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], stream=True)
    with pytest.raises(openai.BadRequestError, match="exceeds the engines' context"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=5000)
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}],
                                   extra_body={"pdsr_sample": "s2"})
    with pytest.raises(openai.BadRequestError, match="message 0 differs from the recorded conversation"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "b"}] * 3,
                                       extra_body={"pdsr_sample": "s2"})
    assert httpx.get(f"{base}/pdsr/samples/nope", timeout=WAIT_S).status_code == 404
    bad = httpx.post(f"{base}/pdsr/samples/s2/end", json={"reward": "high"}, timeout=WAIT_S)
    assert bad.status_code == 400 and "finite number" in bad.json()["error"]["message"]
