"""``session.aserve()`` on fake engines (tests/turn_fakes.py), with the real ``openai`` client: the OpenAI routes,
named samples (chat and completions) recorded token-exact across requests, their end and reward, streams, and
bad requests."""

from __future__ import annotations

import contextlib
import json
import queue
import threading

import httpx
import pytest

from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession
from support import WAIT_S, requires_torch, requires_vllm
from turn_fakes import turn_length

openai = pytest.importorskip("openai")


@contextlib.contextmanager
def serving(session, **serve_kwargs):
    """``session.serve`` in a thread for the block: an openai client on it (no retries), and its base URL."""
    ready: queue.Queue = queue.Queue()
    thread = threading.Thread(target=session.serve, kwargs={"port": 0, "on_ready": ready.put, **serve_kwargs})
    thread.start()
    try:
        base = f"http://127.0.0.1:{ready.get(timeout=WAIT_S)}/v1"
        yield openai.OpenAI(base_url=base, api_key="none", max_retries=0), base
    finally:
        session.stop_serving()
        thread.join(WAIT_S)


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": 64},
                        agent={"env_timeout_s": 30},
                        engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:TurnEngine",
                                  "max_model_len": 256, "max_num_seqs": 4}])
    with RolloutSession(cfg) as session, serving(session, model_name="tiny") as (client, base):
        yield session, client, base


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
    # a route or method not served: OpenAI's error body (FastAPI's was {"detail": "Not Found"})
    for method, path, status in (("POST", "/responses", 404), ("GET", "/chat/completions", 405)):
        r = httpx.request(method, base + path, timeout=WAIT_S)
        assert r.status_code == status and r.json()["error"]["code"] == status
        assert r.json()["error"]["message"].startswith(f"{method} /v1{path}: ")
        assert "POST /v1/chat/completions" in r.json()["error"]["message"]


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
    convo = [{"role": "user", "content": "What is\n6*7?"}, {"role": "assistant", "content": r.choices[0].message.content},
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


@requires_torch
def test_a_request_an_engine_refuses_is_an_error_naming_why(tiny_model_dir):
    """Not a 200 with an empty answer and finish reason 'stop'; the server goes on serving."""
    from turn_fakes import REFUSED_ID

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": 16},
                        engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:RefusingTurnEngine",
                                  "max_model_len": 256, "max_num_seqs": 4}])
    with RolloutSession(cfg) as session, serving(session) as (client, _):
        with pytest.raises(openai.BadRequestError, match=f"2 of 2 choices failed: engine 'f0' refused request "
                                                         f".*token {REFUSED_ID} refused"):
            client.completions.create(model="tiny", prompt=[5, REFUSED_ID], max_tokens=4, n=2)
        with pytest.raises(openai.BadRequestError, match="1 of 1 choices failed: engine 'f0' refused"):
            client.completions.create(model="tiny", prompt=[REFUSED_ID], max_tokens=4, stream=True)
        assert len(client.completions.create(model="tiny", prompt=[5, 6], max_tokens=4).choices[0].token_ids) == 4


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
    assert refused is not None and "response tokens are spent" in str(refused)
    assert "end it with POST /v1/pdsr/samples/spent-1/end" in str(refused)
    with pytest.raises(openai.ConflictError, match="response tokens are spent"):   # again: the same answer
        client.chat.completions.create(model="tiny", messages=convo + [{"role": "user", "content": "more"}],
                                       extra_body={"pdsr_sample": "spent-1"})
    assert not httpx.get(f"{base}/pdsr/samples/spent-1", timeout=WAIT_S).json()["finished"]
    row = httpx.post(f"{base}/pdsr/samples/spent-1/end", json={"reward": 0.5}, timeout=WAIT_S).json()
    assert row["finished"] and row["reward"] == 0.5 and row["error"] is None
    assert row["turns"][-1]["role"] == "assistant"   # the refused turn's tool message is not in the trajectory
    assert len(row["response_token_ids"]) <= 64
    again = httpx.post(f"{base}/pdsr/samples/spent-1/end", json={"reward": 0.5}, timeout=WAIT_S)
    assert again.status_code == 200 and again.json()["reward"] == 0.5   # ending twice with its reward: the same row
    other = httpx.post(f"{base}/pdsr/samples/spent-1/end", json={"reward": 1.0}, timeout=WAIT_S)
    assert other.status_code == 409 and "the reward 1.0 was not taken" in other.json()["error"]["message"]


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
    ("presence_penalty", 0.5, r"presence_penalty 0\.5: pdsr does not apply"),
    ("logprobs", True, r"logprobs True: pdsr's responses carry no log-probs .*response_logprobs"),
    ("top_logprobs", 5, r"top_logprobs 5: pdsr's responses carry no log-probs"),
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
    with pytest.raises(openai.BadRequestError, match=r"logprobs 0: pdsr's responses carry no log-probs"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, logprobs=0)   # 0: the sampled token's
    with pytest.raises(openai.BadRequestError, match=r"best_of 3: pdsr returns every sample"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, best_of=3)
    # any model name: one model is served, and the response names it
    r = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert r.model == "tiny"


#: the tiny model's ChatML template, with a request's tools described in a first system turn (as Qwen's does)
TOOLS_TEMPLATE = ("{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t['function']['name'] }} "
                  "{% endfor %}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                  "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                  "{% endif %}")
CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "evaluates arithmetic",
                                               "parameters": {"type": "object", "properties": {}}}}


@requires_torch
def test_a_requests_tools_reach_the_chat_template(served):
    """OpenAI's `tools` go to the chat template, as vLLM's server passes them: the model is told its tools (they
    were dropped, and a tool-calling template rendered the prompt without them)."""
    session, client, base = served
    tok = session.tokenizer
    saved, tok.chat_template = tok.chat_template, TOOLS_TEMPLATE
    try:
        convo = [{"role": "user", "content": "What is 6*7?"}]
        expect = tok.apply_chat_template(convo, tools=[CALCULATOR], tokenize=False, add_generation_prompt=True)
        assert expect.startswith("<|im_start|>system\nTools: calculator ")
        plain = client.chat.completions.create(model="tiny", messages=convo, tools=[CALCULATOR], max_tokens=2)
        assert plain.usage.prompt_tokens == len(tok(expect, add_special_tokens=False)["input_ids"])
        r = client.chat.completions.create(model="tiny", messages=convo, tools=[CALCULATOR],
                                           extra_body={"pdsr_sample": "tools-1"})
        convo += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "tool", "content": "42"}]
        client.chat.completions.create(model="tiny", messages=convo, tools=[CALCULATOR], max_tokens=3,
                                       extra_body={"pdsr_sample": "tools-1"})
        row = httpx.post(f"{base}/pdsr/samples/tools-1/end", json={"reward": 1.0}, timeout=WAIT_S).json()
        assert tok.decode(row["prompt_token_ids"], skip_special_tokens=False) == expect
        env = row["turns"][1]
        env_ids = row["response_token_ids"][env["start_token"]:env["start_token"] + env["num_tokens"]]
        assert tok.decode(env_ids) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
        with pytest.raises(openai.BadRequestError, match="tools must be a list of objects"):
            client.chat.completions.create(model="tiny", messages=convo, extra_body={"tools": "calculator"})
    finally:
        tok.chat_template = saved


#: the tiny model's ChatML template rendering a tool result's name and tool_call_id and an assistant message's tool
#: calls, as Mistral's (and some Llama) templates do
TOOL_FIELDS_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>tool {{ m['name'] }} {{ m['tool_call_id'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% elif m['tool_calls'] %}<|im_start|>assistant\n{% for c in m['tool_calls'] %}"
    "@{{ c['id'] }} {{ c['function']['name'] }}{% endfor %}<|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}")


@requires_torch
def test_a_named_samples_new_messages_keep_the_fields_the_template_renders(served):
    """A named sample's new messages kept only role and content: a tool result's tool_call_id and name and an
    assistant message's tool_calls reached the template as nothing. They go to it as the client sent them (as on a
    plain request, and as vLLM's server passes them), and the tool's name labels the environment's span."""
    session, client, base = served
    tok = session.tokenizer
    saved, tok.chat_template = tok.chat_template, TOOL_FIELDS_TEMPLATE
    try:
        call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
        convo = [{"role": "user", "content": "What is 6*7?"}]
        r = client.chat.completions.create(model="tiny", messages=convo, max_tokens=4,
                                           extra_body={"pdsr_sample": "fields-1"})
        convo += [{"role": "assistant", "content": r.choices[0].message.content},
                  {"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "calc"}]
        client.chat.completions.create(model="tiny", messages=convo, max_tokens=3, extra_body={"pdsr_sample": "fields-1"})
        row = httpx.post(f"{base}/pdsr/samples/fields-1/end", json={"reward": 1.0}, timeout=WAIT_S).json()
        env = row["turns"][1]
        env_ids = row["response_token_ids"][env["start_token"]:env["start_token"] + env["num_tokens"]]
        # the first turn was cut at its 4 tokens: its end of turn is the environment's
        assert tok.decode(env_ids) == ("<|im_end|>\n<|im_start|>assistant\n@c1 calc<|im_end|>\n<|im_start|>tool calc c1\n42"
                                       "<|im_end|>\n<|im_start|>assistant\n")
        assert env["role"] == "environment" and env["tool_name"] == "calc"
        # a plain request renders them too
        plain = client.chat.completions.create(model="tiny", messages=convo, max_tokens=2)
        expect = tok.apply_chat_template(convo[:1] + [{**convo[1], "content": convo[1]["content"] or ""},
                                                      {**convo[2], "content": ""}, convo[3]],
                                         tokenize=False, add_generation_prompt=True)
        assert "<|im_start|>tool calc c1\n" in expect and "@c1 calc" in expect
        assert plain.usage.prompt_tokens == len(tok(expect, add_special_tokens=False)["input_ids"])
    finally:
        tok.chat_template = saved


#: the tiny model's ChatML template refusing a role, as Gemma's refuses every role but user and assistant
STRICT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('Conversation roles must "
                   "be user or assistant') }}{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                   "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@requires_torch
def test_messages_the_chat_template_refuses_are_a_400_and_the_sample_goes_on(served):
    """A template's refusal was a 500 without a reason on a plain request, and failed a named sample (409); it is
    a 400 with the template's message, and the named sample takes the next request."""
    session, client, base = served
    tok = session.tokenizer
    saved, tok.chat_template = tok.chat_template, STRICT_TEMPLATE
    try:
        tool = {"role": "tool", "content": "42"}
        with pytest.raises(openai.BadRequestError, match="the chat template refused the messages: Conversation roles "
                                                         "must be user or assistant"):
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}, tool])
        convo = [{"role": "user", "content": "What is 6*7?"}]
        r = client.chat.completions.create(model="tiny", messages=convo, extra_body={"pdsr_sample": "strict-1"})
        convo.append({"role": "assistant", "content": r.choices[0].message.content})
        with pytest.raises(openai.BadRequestError, match="'strict-1': the chat template refused the new messages: "
                                                         "Conversation roles must be user or assistant"):
            client.chat.completions.create(model="tiny", messages=convo + [tool], extra_body={"pdsr_sample": "strict-1"})
        r = client.chat.completions.create(model="tiny", messages=convo + [{"role": "user", "content": "42"}],
                                           max_tokens=3, extra_body={"pdsr_sample": "strict-1"})
        assert len(r.choices[0].token_ids) == 3
        row = httpx.post(f"{base}/pdsr/samples/strict-1/end", json={"reward": 1.0}, timeout=WAIT_S).json()
        assert row["reward"] == 1.0 and row["error"] is None
        assert [t["role"] for t in row["turns"]] == ["assistant", "environment", "assistant"]
        env = row["turns"][1]
        env_ids = row["response_token_ids"][env["start_token"]:env["start_token"] + env["num_tokens"]]
        assert tok.decode(env_ids) == "\n<|im_start|>user\n42<|im_end|>\n<|im_start|>assistant\n"
    finally:
        tok.chat_template = saved


def _end(base: str, sample_id: str) -> dict:
    return httpx.post(f"{base}/pdsr/samples/{sample_id}/end", json={"reward": 1.0}, timeout=WAIT_S).json()


@requires_torch
def test_a_completions_sample_extended_by_token_ids(served):
    session, client, base = served
    prompt = session.tokenizer("The answer is", add_special_tokens=False)["input_ids"]
    first_prompt, env = list(prompt), [[11, 12, 13], [14]]
    answers = []
    for turn in range(3):
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=4,
                                      extra_headers={"X-Pdsr-Sample": "ids-1"})
        answers.append(r.choices[0].token_ids)
        assert len(answers[-1]) == 4 and r.choices[0].finish_reason == "length"
        assert r.usage.prompt_tokens == len(prompt)   # the whole trajectory before this turn
        if turn < 2:
            prompt = prompt + answers[-1] + env[turn]
    with pytest.raises(openai.BadRequestError, match=r"'ids-1'.* token 2 differs \(recorded"):
        client.completions.create(model="tiny", prompt=prompt[:2] + [7] + prompt[3:] + [5],
                                  extra_headers={"X-Pdsr-Sample": "ids-1"})
    with pytest.raises(openai.BadRequestError, match="'ids-1': the prompt has nothing new"):
        client.completions.create(model="tiny", prompt=prompt + answers[-1], extra_headers={"X-Pdsr-Sample": "ids-1"})
    with pytest.raises(openai.BadRequestError, match="started with a prompt of token ids"):
        client.completions.create(model="tiny", prompt="text", extra_headers={"X-Pdsr-Sample": "ids-1"})
    row = _end(base, "ids-1")
    assert row["prompt_token_ids"] == first_prompt
    assert row["response_token_ids"] == answers[0] + env[0] + answers[1] + env[1] + answers[2]
    assert row["response_mask"] == [1] * 4 + [0] * 3 + [1] * 4 + [0] + [1] * 4
    assert [t["role"] for t in row["turns"]] == ["assistant", "environment"] * 2 + ["assistant"]


@requires_torch
def test_a_completions_sample_extended_by_text(served):
    session, client, base = served
    tok = session.tokenizer
    first = "Once upon a time"
    prompt, answers, new_texts = first, [], [" there was", "\n<|im_start|>user\nmore"]
    for turn in range(3):
        r = client.completions.create(model="tiny", prompt=prompt, extra_body={"pdsr_sample": "text-1"})
        c = r.choices[0]
        answers.append(c.token_ids)
        # the turn ends with the sampled end of text; the text skips it, so the client's text never holds it
        assert c.token_ids[-1] == tok.eos_token_id and c.text == tok.decode(c.token_ids, skip_special_tokens=True)
        if turn < 2:
            prompt += c.text + new_texts[turn]
    nothing_new = prompt + c.text
    with pytest.raises(openai.BadRequestError, match="'text-1': the prompt has nothing new after the recorded text"):
        client.completions.create(model="tiny", prompt=nothing_new, extra_body={"pdsr_sample": "text-1"})
    at = len(first) + 2
    with pytest.raises(openai.BadRequestError, match=f"'text-1': the prompt does not extend the recorded text .*"
                                                     f"character {at} differs"):
        client.completions.create(model="tiny", prompt=nothing_new[:at] + "#" + nothing_new[at + 1:] + "!",
                                  extra_body={"pdsr_sample": "text-1"})
    with pytest.raises(openai.BadRequestError, match="'text-1' was started on /v1/completions"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       extra_body={"pdsr_sample": "text-1"})
    row = _end(base, "text-1")
    env = [tok(t, add_special_tokens=False)["input_ids"] for t in new_texts]
    assert tok.decode(env[1]).startswith("\n<|im_start|>user") and len(env[1]) < len(new_texts[1])   # special kept
    assert row["prompt_token_ids"] == tok(first, add_special_tokens=True)["input_ids"]
    assert row["response_token_ids"] == answers[0] + env[0] + answers[1] + env[1] + answers[2]   # never re-encoded


@requires_torch
def test_a_chat_sample_refuses_completions(served):
    session, client, base = served
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}],
                                   extra_headers={"X-Pdsr-Sample": "chat-1"})
    with pytest.raises(openai.BadRequestError, match="'chat-1' was started on /v1/chat/completions"):
        client.completions.create(model="tiny", prompt="a", extra_headers={"X-Pdsr-Sample": "chat-1"})
    assert _end(base, "chat-1")["finished"]


def _events(response: httpx.Response) -> list:
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    lines = [line for line in response.text.split("\n\n") if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


@requires_torch
def test_streams_carry_the_whole_turn_in_one_chunk(served):
    session, client, base = served
    tok = session.tokenizer
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True, stream_options={"include_usage": True}))
    assert [c.object for c in chunks] == ["chat.completion.chunk"] * 3 and len({c.id for c in chunks}) == 1
    content, closing, usage = chunks
    ids = content.choices[0].token_ids
    assert content.choices[0].delta.role == "assistant"
    assert content.choices[0].delta.content == tok.decode(ids, skip_special_tokens=True) != ""
    assert content.choices[0].finish_reason is None and content.usage is None
    assert closing.choices[0].finish_reason == "stop" and closing.choices[0].delta.content is None
    assert usage.choices == [] and usage.usage.completion_tokens == len(ids)
    # completions, named, no usage asked: a content chunk and a finish chunk
    body = {"model": "tiny", "prompt": "Once", "max_tokens": 3, "stream": True, "pdsr_sample": "stream-1"}
    events = _events(httpx.post(f"{base}/completions", json=body, timeout=WAIT_S))
    assert [e["object"] for e in events] == ["text_completion"] * 2 and all("usage" not in e for e in events)
    assert events[0]["choices"][0]["text"] == tok.decode(events[0]["choices"][0]["token_ids"], skip_special_tokens=True)
    assert len(events[0]["choices"][0]["token_ids"]) == 3 and events[0]["choices"][0]["finish_reason"] is None
    assert events[1]["choices"] == [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]
    assert _end(base, "stream-1")["response_token_ids"] == events[0]["choices"][0]["token_ids"]
    # n = 2: each choice its content chunk and its finish chunk
    events = _events(httpx.post(f"{base}/chat/completions", json={"model": "tiny", "n": 2, "stream": True,
                                                                 "messages": [{"role": "user", "content": "x"}]},
                                timeout=WAIT_S))
    assert [(e["choices"][0]["index"], e["choices"][0]["finish_reason"]) for e in events] == [
        (0, None), (0, "stop"), (1, None), (1, "stop")]


@requires_torch
def test_a_served_request_drafts_from_earlier_responses_to_its_prompt(tiny_model_dir):
    """Speculative 'group' through the server: a request's group is given the responses the session kept for its
    prompt (``DraftHistory``), as a step's groups are; none for a prompt not seen before."""
    from pdsr_sdk.engines.group_drafter import DraftHistory

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": 64},
                        engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:TurnEngine",
                                  "max_model_len": 256, "max_num_seqs": 4}])
    with RolloutSession(cfg, draft_history=DraftHistory(per_prompt=3)) as session:
        done: list = []
        session.hooks.on_group_done.append(done.append)
        with serving(session) as (client, _):
            first = client.completions.create(model="pdsr", prompt=[5, 6, 7], n=2, max_tokens=8)
            client.completions.create(model="pdsr", prompt=[5, 6, 7], n=2, max_tokens=8)
            client.completions.create(model="pdsr", prompt=[9, 10], max_tokens=8)
    responses = [c.token_ids for c in first.choices]
    assert [g.draft_responses for g in done] == [[], responses, []]


@requires_torch
def test_a_server_that_cannot_listen_is_an_error_not_a_hang(tiny_model_dir, monkeypatch):
    """A port taken after the engines started, or uvicorn exiting its own way (sys.exit), ends ``aserve`` with a
    clean error: not a hang on a loop uvicorn's exit stopped. A bad port fails before any engine starts."""
    import asyncio
    import socket

    import uvicorn

    from pdsr_sdk.errors import ConfigError, RunError

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3",
                        engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:TurnEngine",
                                  "max_model_len": 256}])
    ready: list = []

    async def serve(session, port):
        await asyncio.wait_for(session.aserve(port=port, on_ready=ready.append), 20)

    async def main(taken_port):
        async with RolloutSession(cfg) as session:
            with pytest.raises(ConfigError, match=f"port: cannot listen on 127.0.0.1:{taken_port}: .*in use"):
                await serve(session, taken_port)

            async def exits(self, sockets=None):
                raise SystemExit(3)

            monkeypatch.setattr(uvicorn.Server, "serve", exits)
            with pytest.raises(RunError, match="the HTTP server on 127.0.0.1:0 failed .exit status 3."):
                await serve(session, 0)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        asyncio.run(main(taken.getsockname()[1]))
    assert not ready

    async def refuse(self, **_):
        raise AssertionError("engines started before the port was checked")

    monkeypatch.setattr(RolloutSession, "start", refuse)
    with pytest.raises(ConfigError, match=r"port: 65536 is not a port; expected 0-65535"):
        asyncio.run(RolloutSession(cfg).aserve(port=65536))


def test_stream_chunks_number_tool_calls():
    from pdsr_sdk.rollout.serve import stream_chunks

    call = {"id": "call-1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    response = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "usage": {},
                "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                             "finish_reason": "stop", "token_ids": [5]}]}
    content = stream_chunks(response, False)[0]["choices"][0]
    assert content["delta"]["tool_calls"] == [{"index": 0, **call}]
    assert response["choices"][0]["message"]["tool_calls"] == [call]   # the response itself is left as it was


@requires_vllm
def test_a_turn_that_calls_tools_finishes_with_tool_calls(tiny_model_dir):
    """With a tool parser, a turn that ended calling tools has finish reason 'tool_calls', as OpenAI's has (it was
    'stop'); one cut at its limit stays 'length', and one with no call 'stop'. The stream says the same."""
    from types import SimpleNamespace

    from pdsr_sdk.dispatch.types import LENGTH, STOP, Group, Sample
    from pdsr_sdk.rollout.data import load_tokenizer
    from pdsr_sdk.rollout.serve import ChatServer, stream_chunks

    tok = load_tokenizer(tiny_model_dir)
    server = ChatServer(SimpleNamespace(tokenizer=tok, hooks=SimpleNamespace(on_group_done=[])), tool_parser="hermes")
    call = tok('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>',
               add_special_tokens=False)["input_ids"]
    group = Group(prompt_id="p", prompt_token_ids=[1], prompt_text="", n=3)
    turns = [(call + [tok.eos_token_id], STOP), (call, LENGTH), (tok("no call", add_special_tokens=False)["input_ids"]
                                                                  + [tok.eos_token_id], STOP)]
    group.samples = [Sample(group=group, index=i, max_tokens=64, token_ids=ids, finish_reason=reason)
                     for i, (ids, reason) in enumerate(turns)]
    response = server._chat_response(group.samples, 1)
    assert [c["finish_reason"] for c in response["choices"]] == ["tool_calls", "length", "stop"]
    assert response["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "calculator"
    closing = [c["choices"][0]["finish_reason"] for c in stream_chunks(response, False)][1::2]
    assert closing == ["tool_calls", "length", "stop"]
