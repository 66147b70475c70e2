"""``session.aserve()`` on fake engines (tests/turn_fakes.py), with the real ``openai`` client: the OpenAI routes,
named samples recorded token-exact across requests, their end and reward, and bad requests (the ``served``
fixture: tests/rollout/conftest.py)."""

from __future__ import annotations

from http import HTTPStatus

import httpx
import pytest

from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession
from support import WAIT_S, requires_torch
from turn_fakes import turn_length

openai = pytest.importorskip("openai")

from serve_client import serving  # noqa: E402


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
    with pytest.raises(openai.BadRequestError, match="stream_options must be an object"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], stream=True,
                                       extra_body={"stream_options": "yes"})
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
    # a route or method not served: an error body listing the routes (FastAPI's was {"detail": "Not Found"})
    for method, path, status in (("POST", "/responses", 404), ("GET", "/chat/completions", 405)):
        r = httpx.request(method, base + path, timeout=WAIT_S)
        assert r.status_code == status and r.json()["error"]["code"] == status
        assert r.json()["error"]["message"].startswith(f"{method} /v1{path}: ")
        assert "POST /v1/chat/completions" in r.json()["error"]["message"]


@requires_torch
def test_a_changed_message_is_named_even_when_the_request_adds_none(served):
    """A request repeating the recorded conversation with a message changed (and nothing new) said only that it
    added no message; it names the message that differs, as a longer request's error does."""
    session, client, base = served
    convo = [{"role": "user", "content": "a"}]
    r = client.chat.completions.create(model="tiny", messages=convo, extra_body={"pdsr_sample": "s-changed"})
    convo.append({"role": "assistant", "content": r.choices[0].message.content})
    for sent in ([{"role": "user", "content": "b"}, convo[1]], [{"role": "user", "content": "b"}]):
        with pytest.raises(openai.BadRequestError, match="message 0 differs from the recorded conversation"):
            client.chat.completions.create(model="tiny", messages=sent, extra_body={"pdsr_sample": "s-changed"})
    with pytest.raises(openai.BadRequestError, match="no new message after the recorded conversation"):
        client.chat.completions.create(model="tiny", messages=convo, extra_body={"pdsr_sample": "s-changed"})


@requires_torch
def test_an_end_with_an_unknown_field_is_a_400_and_the_sample_goes_on(served):
    """POST .../end with {"rewrd": 1} ended the sample scored by the session's reward function (0 here), the
    misspelt reward dropped without a word; it is a 400 naming the field, and the sample still takes its reward."""
    session, client, base = served
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}],
                                   extra_body={"pdsr_sample": "s-typo"})
    bad = httpx.post(f"{base}/pdsr/samples/s-typo/end", json={"rewrd": 1.0}, timeout=WAIT_S)
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"]["param"] == "rewrd" and "unknown field(s) rewrd" in bad.json()["error"]["message"]
    assert not httpx.get(f"{base}/pdsr/samples/s-typo", timeout=WAIT_S).json()["finished"]
    row = httpx.post(f"{base}/pdsr/samples/s-typo/end", json={"reward": 1.0}, timeout=WAIT_S).json()
    assert row["finished"] and row["reward"] == 1.0


@requires_torch
def test_a_sample_id_with_a_slash_can_be_read_and_ended_and_an_empty_one_is_a_400(served):
    """A sample named "run-1/env-0/3" was recorded, but its GET and end routes were 404s (raw or %2F-quoted): its
    reward could never be sent. An empty ID (header or body) was taken as no name, the turn silently not recorded."""
    session, client, base = served
    name = "run-1/env-0/3"
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}],
                                   extra_body={"pdsr_sample": name})
    got = httpx.get(f"{base}/pdsr/samples/{name}", timeout=WAIT_S)
    assert got.status_code == 200 and got.json()["prompt_id"] == f"sample-{name}"
    row = httpx.post(f"{base}/pdsr/samples/run-1%2Fenv-0%2F3/end", json={"reward": 0.5}, timeout=WAIT_S).json()
    assert row["finished"] and row["reward"] == 0.5 and row["prompt_id"] == f"sample-{name}"
    for how in ({"extra_headers": {"X-Pdsr-Sample": ""}}, {"extra_body": {"pdsr_sample": ""}}):
        with pytest.raises(openai.BadRequestError, match="a sample's ID .* is a non-empty string, got ''"):
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}], **how)
        with pytest.raises(openai.BadRequestError, match="a sample's ID .* is a non-empty string, got ''"):
            client.completions.create(model="tiny", prompt="a", max_tokens=2, **how)


@requires_torch
def test_text_parts_are_joined_as_vllm_joins_them(served):
    """Content given as text parts (as smolagents and Claude Code-style clients send every message) was a 400; it is
    joined with newlines, as vLLM's server passes it to a template of string content. A named sample's later request
    may send the same message as parts or as a string. An image part or a dict is a 400 naming the message."""
    session, client, base = served
    tok = session.tokenizer
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "6*7?"}]}]
    expect = tok.apply_chat_template([{"role": "user", "content": "What is\n6*7?"}], tokenize=False,
                                     add_generation_prompt=True)
    r = client.chat.completions.create(model="tiny", messages=parts, max_tokens=2, extra_body={"pdsr_sample": "parts"})
    assert r.usage.prompt_tokens == len(tok(expect, add_special_tokens=False)["input_ids"])
    convo = [{"role": "user", "content": "What is\n6*7?"}, {"role": "assistant",
                                                            "content": r.choices[0].message.content},
             {"role": "tool", "content": [{"type": "text", "text": "42"}]}]
    client.chat.completions.create(model="tiny", messages=convo, max_tokens=2, extra_body={"pdsr_sample": "parts"})
    row = httpx.post(f"{base}/pdsr/samples/parts/end", json={"reward": 1.0}, timeout=WAIT_S).json()
    assert tok.decode(row["prompt_token_ids"]) == expect
    env = row["turns"][1]
    assert tok.decode(row["response_token_ids"][env["start_token"]:env["start_token"] + env["num_tokens"]]).endswith(
        "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\].content\[1\] is a 'image_url' part"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [parts[0]["content"][0],
                                                                                           image]}])
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\].content must be a string, a list of text parts"):
        client.chat.completions.create(model="tiny", messages=[parts[0], {"role": "tool", "content": {"x": 1}}])


@requires_torch
def test_token_ids_out_of_the_vocabulary_are_a_400_naming_the_id(served):
    """vLLM refuses them; the answer was a 200 with empty choices and finish reason 'stop'."""
    session, client, _ = served
    vocab = len(session.tokenizer)
    with pytest.raises(openai.BadRequestError, match=f"the prompt: token id {vocab} is out of the vocabulary "
                                                     f"\\(ids 0 to {vocab - 1}\\)"):
        client.completions.create(model="tiny", prompt=[1, 2, vocab], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="token id -1 is out of the vocabulary"):
        client.completions.create(model="tiny", prompt=[-1], max_tokens=4)
    prompt = [5, 6, 7]
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, extra_body={"pdsr_sample": "vocab-1"})
    with pytest.raises(openai.BadRequestError, match=f"'vocab-1': the prompt: token id {vocab + 5} is out"):
        client.completions.create(model="tiny", prompt=prompt + r.choices[0].token_ids + [vocab + 5],
                                  max_tokens=4, extra_body={"pdsr_sample": "vocab-1"})
    r = client.completions.create(model="tiny", prompt=prompt + r.choices[0].token_ids + [8], max_tokens=4,
                                  extra_body={"pdsr_sample": "vocab-1"})   # the sample goes on
    assert len(r.choices[0].token_ids) == 4


def refusing(tiny_model_dir, max_tokens: int) -> RolloutConfig:
    """A session on one fake engine that refuses every request holding turn_fakes.REFUSED_ID."""
    return RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": max_tokens},
                         engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:RefusingTurnEngine",
                                   "max_model_len": 256, "max_num_seqs": 4}])


@requires_torch
def test_a_request_an_engine_refuses_is_an_error_naming_why(tiny_model_dir):
    """Not a 200 with an empty answer and finish reason 'stop'; the server goes on serving."""
    from turn_fakes import REFUSED_ID

    with RolloutSession(refusing(tiny_model_dir, 16)) as session, serving(session, model_name="tiny") as (client, _):
        with pytest.raises(openai.BadRequestError, match=f"2 of 2 choices failed: engine 'f0' refused request "
                                                         f".*token {REFUSED_ID} refused"):
            client.completions.create(model="tiny", prompt=[5, REFUSED_ID], max_tokens=4, n=2)
        with pytest.raises(openai.BadRequestError, match="1 of 1 choices failed: engine 'f0' refused"):
            client.completions.create(model="tiny", prompt=[REFUSED_ID], max_tokens=4, stream=True)
        assert len(client.completions.create(model="tiny", prompt=[5, 6], max_tokens=4).choices[0].token_ids) == 4


@requires_torch
def test_a_named_sample_that_fails_in_a_turn_is_a_409_naming_it(tiny_model_dir):
    """While a turn of it is asked for: the waiting request is a 409 naming the sample and why it ended, whatever
    other samples and plain requests the server has finished meanwhile."""
    from turn_fakes import REFUSED_ID

    with RolloutSession(refusing(tiny_model_dir, 64)) as session, serving(session, model_name="tiny") as (client, _):
        kept = {}
        for name in ("a", "b", "c"):   # named samples the server keeps, then plain requests it finishes
            kept[name] = client.completions.create(model="tiny", prompt=[5, 6], max_tokens=4,
                                                   extra_body={"pdsr_sample": name})
            assert len(client.completions.create(model="tiny", prompt=[7], max_tokens=2).choices[0].token_ids) == 2
        ids = [5, 6] + kept["b"].choices[0].token_ids + [REFUSED_ID]   # b's next turn: the engine refuses it
        with pytest.raises(openai.APIStatusError) as info:
            client.completions.create(model="tiny", prompt=ids, max_tokens=4, extra_body={"pdsr_sample": "b"})
        assert info.value.status_code == 409
        message = info.value.body["message"] if isinstance(info.value.body, dict) else str(info.value)
        assert "sample 'b' ended (failed" in message and f"token {REFUSED_ID} refused" in message
        ids = [5, 6] + kept["a"].choices[0].token_ids + [REFUSED_ID]   # streamed: the same 409, before any event
        with pytest.raises(openai.ConflictError, match=f"sample 'a' ended .failed.*token {REFUSED_ID} refused"):
            client.completions.create(model="tiny", prompt=ids, max_tokens=4, stream=True,
                                      extra_body={"pdsr_sample": "a"})
        ids = [5, 6] + kept["c"].choices[0].token_ids + [8]   # the others go on
        r = client.completions.create(model="tiny", prompt=ids, max_tokens=4, extra_body={"pdsr_sample": "c"})
        assert len(r.choices[0].token_ids) == 4


@requires_torch
def test_a_sample_out_of_tokens_still_takes_its_reward(served):
    """A turn asked for past the sample's budget (64 tokens here) is a 409 that says so; the sample then waits
    for its end, and the end's reward is its reward (it was dropped: the sample ended at the refused turn)."""
    session, client, base = served
    convo = [{"role": "user", "content": "Go."}]
    refused = None
    for _ in range(20):
        try:
            r = client.chat.completions.create(model="tiny", messages=convo, extra_body={"pdsr_sample": "spent-1"})
        except openai.ConflictError as exc:
            refused = exc
            break
        convo += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "tool", "content": "ok"}]
    # the tool's tokens do not fit in what is left (or nothing is left): the budget is named either way
    assert refused is not None and "response tokens (sampling.max_tokens)" in str(refused)
    assert "end it with POST /v1/pdsr/samples/spent-1/end" in str(refused)
    with pytest.raises(openai.ConflictError, match=r"response tokens \(sampling\.max_tokens\)"):   # again: the same
        client.chat.completions.create(model="tiny", messages=convo + [{"role": "user", "content": "more"}],
                                       extra_body={"pdsr_sample": "spent-1"})
    assert not httpx.get(f"{base}/pdsr/samples/spent-1", timeout=WAIT_S).json()["finished"]
    row = httpx.post(f"{base}/pdsr/samples/spent-1/end", json={"reward": 0.5}, timeout=WAIT_S).json()
    assert row["finished"] and row["reward"] == 0.5 and row["error"] is None
    assert row["finish_reason"] == "length"   # its budget ended it, as an agent's (a trainer's overlong filter)
    assert row["turns"][-1]["role"] == "assistant"   # the refused turn's tool message is not in the trajectory
    assert len(row["response_token_ids"]) <= 64
    again = httpx.post(f"{base}/pdsr/samples/spent-1/end", json={"reward": 0.5}, timeout=WAIT_S)
    assert again.status_code == 200 and again.json()["reward"] == 0.5   # ending twice with its reward: the same row
    other = httpx.post(f"{base}/pdsr/samples/spent-1/end", json={"reward": 1.0}, timeout=WAIT_S)
    assert other.status_code == 409 and "the reward 1.0 was not taken" in other.json()["error"]["message"]
    assert other.json()["error"]["type"] == HTTPStatus.CONFLICT.phrase   # as vLLM's server types a 409


@requires_torch
@pytest.mark.parametrize("bad, expect", [({"n": 0}, "n must be a positive integer, got 0"),
                                         ({"max_tokens": 0}, "max_tokens must be a positive integer, got 0"),
                                         ({"max_completion_tokens": 0}, "max_tokens must be a positive integer, got 0"),
                                         ({"max_tokens": -3}, "max_tokens must be a positive integer, got -3")])
def test_zero_choices_or_tokens_are_a_400_not_the_default(served, bad, expect):
    """n = 0 and max_tokens = 0 were taken as absent: 1 choice, the whole budget."""
    _, client, _ = served
    with pytest.raises(openai.BadRequestError, match=expect):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], extra_body=bad)
    with pytest.raises(openai.BadRequestError, match=expect):
        client.completions.create(model="tiny", prompt="x", extra_body=bad)
    ok = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                        extra_body={"n": None, "max_tokens": None})
    assert len(ok.choices) == 1   # null: the defaults


@requires_torch
@pytest.mark.parametrize("field, value, expect", [
    ("temperature", 0, r"temperature 0: this session samples every request with temperature 1\.0; .*--temperature"),
    ("top_p", 0.9, r"top_p 0\.9: this session samples every request with top_p 1\.0; .*--top-p"),
    ("top_k", 20, r"top_k 20: this session samples every request with top_k 0; .*sampling\.top_k"),
    ("stop", ["\n"], r"stop \['\\n'\]: this session samples every request with stop \[\]; .*sampling\.stop"),
    ("seed", 7, r"seed 7: pdsr does not apply a request's seed"),
    ("presence_penalty", 0.5, r"presence_penalty 0\.5: this session samples every request with presence_penalty 0\.0"),
    ("top_logprobs", 5, r"top_logprobs 5: pdsr records the log-prob of each sampled token only"),
    ("echo", True, r"echo True: pdsr answers with the sampled text alone"),
    ("suffix", "end", r"suffix 'end': pdsr answers with the sampled text alone"),
    ("response_format", {"type": "json_object"}, r"response_format .*json_object.*: pdsr answers with the sampled"),
])
def test_a_sampling_field_the_session_does_not_sample_with_is_a_400_naming_it(served, field, value, expect):
    """temperature=0 or logprobs=true were answered as if applied: the session's sampling, no log-probs."""
    _, client, _ = served
    with pytest.raises(openai.BadRequestError, match=expect):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       extra_body={field: value})
    with pytest.raises(openai.BadRequestError, match=expect):   # a named sample's turn too
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       extra_body={field: value, "pdsr_sample": f"sampling-{field}"})
    if field not in ("logprobs", "top_logprobs"):
        with pytest.raises(openai.BadRequestError, match=expect):
            client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={field: value})


@requires_torch
def test_sampling_fields_equal_to_the_sessions_or_null_pass(served):
    _, client, _ = served
    same = {"temperature": 1, "top_p": 1.0, "top_k": -1, "stop": [], "seed": None, "logprobs": False,
            "top_logprobs": 0, "presence_penalty": 0, "frequency_penalty": 0.0, "best_of": 1, "echo": False,
            "suffix": None, "response_format": {"type": "text"}}
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       extra_body=same)
    assert len(r.choices) == 1
    r = client.completions.create(model="tiny", prompt="x", max_tokens=2, logprobs=None, temperature=1.0, stop=None)
    assert len(r.choices) == 1
    with pytest.raises(openai.BadRequestError, match=r"logprobs 1: pdsr records the log-prob of each sampled"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, logprobs=1)   # 1: an alternative
    with pytest.raises(openai.BadRequestError, match=r"best_of 3: pdsr returns every sample"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, best_of=3)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert r.model == "tiny"   # the served name (another is a 404: tests/rollout/test_serve_vllm_compat.py)


#: the tiny model's ChatML template, with a request's tools described in a first system turn (as Qwen's does)
