"""``session.aserve()`` on fake engines, with the real ``openai`` client: tools and the chat template, completions
samples, streams, drafting and a server that cannot listen (the ``served`` fixture: tests/rollout/conftest.py)."""

from __future__ import annotations

import json

import httpx
import pytest

from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession
from support import WAIT_S, requires_torch, requires_vllm

openai = pytest.importorskip("openai")

from serve_client import serving  # noqa: E402


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
        client.chat.completions.create(model="tiny", messages=convo, max_tokens=3,
                                       extra_body={"pdsr_sample": "fields-1"})
        row = httpx.post(f"{base}/pdsr/samples/fields-1/end", json={"reward": 1.0}, timeout=WAIT_S).json()
        env = row["turns"][1]
        env_ids = row["response_token_ids"][env["start_token"]:env["start_token"] + env["num_tokens"]]
        # the first turn was cut at its 4 tokens: its end of turn is the environment's
        assert tok.decode(env_ids) == ("<|im_end|>\n<|im_start|>assistant\n@c1 calc<|im_end|>\n<|im_start|>tool calc "
                                       "c1\n42<|im_end|>\n<|im_start|>assistant\n")
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
            client.chat.completions.create(model="tiny", messages=convo + [tool],
                                           extra_body={"pdsr_sample": "strict-1"})
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
def test_streams_start_with_the_role_and_end_with_usage(served):
    """A stream on an engine that reports a turn's tokens at its end (tests/rollout/test_serve_stream_held.py and
    test_serve_stream_vllm.py: token by token): per choice its role chunk, then its finish chunk carrying the turn;
    a named sample's turn: its tokens, then its finish (the turn ends after its tokens are reported: in the chunk
    that carries them, or the next)."""
    session, client, base = served
    tok = session.tokenizer
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True, stream_options={"include_usage": True}))
    assert [c.object for c in chunks] == ["chat.completion.chunk"] * 3 and len({c.id for c in chunks}) == 1
    role, closing, usage = chunks
    assert role.choices[0].delta.role == "assistant" and role.choices[0].delta.content == ""
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert role.model_extra["prompt_token_ids"] == tok(rendered, add_special_tokens=False)["input_ids"]
    ids = closing.choices[0].token_ids
    assert closing.choices[0].delta.content == tok.decode(ids, skip_special_tokens=True) != ""
    assert role.choices[0].finish_reason is None and role.usage is None and closing.usage is None
    assert closing.choices[0].finish_reason == "stop" and closing.choices[0].stop_reason is None
    assert usage.choices == [] and usage.usage.completion_tokens == len(ids)
    # completions, named, no usage asked: the turn's tokens, then its finish
    body = {"model": "tiny", "prompt": "Once", "max_tokens": 3, "stream": True, "pdsr_sample": "stream-1"}
    events = _events(httpx.post(f"{base}/completions", json=body, timeout=WAIT_S))
    assert {e["object"] for e in events} == {"text_completion"} and all("usage" not in e for e in events)
    choices = [e["choices"][0] for e in events]
    ids = [i for c in choices for i in c["token_ids"]]
    assert len(ids) == 3 and "".join(c["text"] for c in choices) == tok.decode(ids, skip_special_tokens=True)
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["length"]
    assert choices[-1]["stop_reason"] is None and choices[0]["prompt_token_ids"] == tok("Once")["input_ids"]
    assert _end(base, "stream-1")["response_token_ids"] == ids
    # n = 2: both role chunks first, then each choice's finish chunk
    events = _events(httpx.post(f"{base}/chat/completions", json={"model": "tiny", "n": 2, "stream": True,
                                                                 "messages": [{"role": "user", "content": "x"}]},
                                timeout=WAIT_S))
    assert [e["choices"][0]["finish_reason"] for e in events] == [None, None, "stop", "stop"]
    assert sorted(e["choices"][0]["index"] for e in events[:2]) == sorted(e["choices"][0]["index"]
                                                                          for e in events[2:]) == [0, 1]


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
        with serving(session, model_name="pdsr") as (client, _):
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


@requires_vllm
def test_a_turn_that_calls_tools_finishes_with_tool_calls(tiny_model_dir):
    """With a tool parser, a turn that ended calling tools has finish reason 'tool_calls', as OpenAI's has (it was
    'stop'); one cut at its limit stays 'length', and one with no call 'stop' (a stream's:
    tests/rollout/test_serve_stream_held.py)."""
    from types import SimpleNamespace

    from pdsr_sdk.dispatch.types import LENGTH, STOP, Group, Sample
    from pdsr_sdk.rollout.data import load_tokenizer
    from pdsr_sdk.rollout.serve import ChatServer

    tok = load_tokenizer(tiny_model_dir)
    server = ChatServer(SimpleNamespace(tokenizer=tok, hooks=SimpleNamespace(on_group_done=[], on_fatal=[])),
                        tool_parser="hermes")
    call = tok('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>',
               add_special_tokens=False)["input_ids"]
    group = Group(prompt_id="p", prompt_token_ids=[1], prompt_text="", n=3)
    turns = [(call + [tok.eos_token_id], STOP), (call, LENGTH), (tok("no call", add_special_tokens=False)["input_ids"]
                                                                  + [tok.eos_token_id], STOP)]
    group.samples = [Sample(group=group, index=i, max_tokens=64, token_ids=ids, finish_reason=reason)
                     for i, (ids, reason) in enumerate(turns)]
    response = server._chat_response(group.samples, [1])
    assert [c["finish_reason"] for c in response["choices"]] == ["tool_calls", "length", "stop"]
    assert response["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "calculator"
