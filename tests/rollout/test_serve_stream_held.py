"""``pdsr serve``'s streams on an engine that reports each token as it makes it and holds a response part-way until
the test releases it (tests/stream_fakes.py; one server for the module, v2 with ``on_break: restart``, a stop string
and ``--tool-parser hermes``). What a stream sent is read while its response is held, never by time: a restart
after tokens were sent ends the stream with an error chunk, one before any is no error; text that may become a stop
string or a tool call is held back; a named sample's turn streams as it comes and is recorded as without ``stream``;
tool calls come as ``delta.tool_calls`` after the content."""

from __future__ import annotations

import json

import httpx
import pytest

from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession
from support import WAIT_S, requires_torch

pytestmark = requires_torch

openai = pytest.importorskip("openai")

from openai.lib.streaming.chat import ChatCompletionStreamState  # noqa: E402
from serve_client import serving  # noqa: E402

CAP = 200         # v2's breaker_tokens: a fast sample past it breaks and starts over on heavy
STOP = "</answer>"
ANSWER = "The answer is 42"
CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
CLOCK = '<tool_call>{"name": "clock", "arguments": {}}</tool_call>'
CALCULATOR = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def held(tiny_model_dir):
    """(session, openai client, base URL, tokenizer, engines by name) of ``session.serve`` on a fast and a heavy
    ScriptEngine."""
    settings = {"v2": {"breaker_tokens": CAP, "breaker_time_s": None, "on_break": "restart", "steal": False}}
    engines = [{"name": name, "pool": pool, "backend": "stream_fakes:ScriptEngine", "max_model_len": 1024,
                "max_num_seqs": 4} for name, pool in (("f0", "fast"), ("h0", "heavy"))]
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v2", policy_settings=settings,
                        sampling={"max_tokens": 256, "stop": [STOP]}, agent={"env_timeout_s": 60}, engines=engines)
    with RolloutSession(cfg) as session, serving(session, model_name="tiny", tool_parser="hermes") as (client, base):
        yield session, client, base, session.tokenizer, {e.name: e for e in session.engines}


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def play(engines, script, **kw):
    for e in engines.values():
        e.play(script, **kw)


def inside(tok, script: list[int], text: str) -> int:
    """The first k whose script[:k] decodes past ``text``, into what comes after it."""
    k = next(k for k in range(1, len(script)) if len(tok.decode(script[:k])) > len(text))
    assert tok.decode(script[:k]).startswith(text)
    return k


def sse(response: httpx.Response):
    """A stream's events as they come: its chunks, then '[DONE]'."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[6:] if line == "data: [DONE]" else json.loads(line[6:])


def read_tokens(events, k: int) -> list[dict]:
    """Chunks until the choice's first ``k`` tokens came (role chunk first)."""
    got = [next(events)]
    while sum(len(c["choices"][0].get("token_ids", [])) for c in got) < k:
        got.append(next(events))
    return got


def content(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))


def test_a_restart_after_tokens_were_sent_ends_the_stream_with_an_error(held):
    """The fast sample is held after 4 tokens (streamed), then runs to the cap and starts over on heavy: the stream
    ends with vLLM's error chunk and [DONE]; the server answers the next requests."""
    session, client, base, tok, engines = held
    script = ids_of(tok, "abcdefghijklmnopqrstuvwxyz")
    play(engines, script)
    engines["f0"].hold(4)
    restarts = session.scheduler.stats["restarts"]
    body = {"model": "tiny", "messages": HI, "max_tokens": CAP + 16, "stream": True}
    with httpx.stream("POST", f"{base}/chat/completions", json=body, timeout=WAIT_S) as r:
        events = sse(r)
        first = read_tokens(events, 4)
        assert engines["f0"].held.wait(WAIT_S) and content(first) == tok.decode(script[:4])
        engines["f0"].release()
        rest = list(events)
    *chunks, error, done = rest
    assert done == "[DONE]" and all("error" not in c for c in chunks)
    assert error["error"]["code"] == 500 and "was started over by the dispatch policy" in error["error"]["message"]
    assert session.scheduler.stats["restarts"] == restarts + 1
    # healthy: a plain answer and a stream, both under the cap
    assert httpx.get(base.removesuffix("/v1") + "/health", timeout=WAIT_S).status_code == 200
    assert client.chat.completions.create(model="tiny", messages=HI, max_tokens=8).choices[0].message.content == \
        tok.decode(script[:8])
    streamed = list(client.chat.completions.create(model="tiny", messages=HI, max_tokens=8, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == tok.decode(script[:8])


def test_a_restart_before_any_token_was_sent_streams_the_new_tokens(held):
    """The fast engine reports its whole capped run at once: the sample starts over before the stream sent a token,
    and the stream carries the heavy engine's run, as the answer without stream."""
    session, client, _, tok, engines = held
    script = ids_of(tok, "0123456789")
    play(engines, script)
    engines["f0"].play(script, burst=CAP)
    restarts = session.scheduler.stats["restarts"]
    plain = client.chat.completions.create(model="tiny", messages=HI, max_tokens=CAP + 8)
    chunks = list(client.chat.completions.create(model="tiny", messages=HI, max_tokens=CAP + 8, stream=True))
    assert session.scheduler.stats["restarts"] == restarts + 2
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == plain.choices[0].message.content
    assert [i for c in chunks[1:] for i in c.choices[0].token_ids] == plain.choices[0].token_ids
    assert len(plain.choices[0].token_ids) == CAP + 8 and chunks[-1].choices[0].finish_reason == "length"


def test_text_that_may_be_a_stop_string_is_held_back_mid_stream(held):
    """Held where the text ends inside the stop string: the stream sent the answer up to it and no more; the rest
    comes with the finish chunk (the stop string too with include_stop_str_in_output)."""
    _, client, base, tok, engines = held
    script = ids_of(tok, ANSWER + STOP)
    play(engines, script, ends=True, stop_reason=STOP)
    k = inside(tok, script, ANSWER)
    engines["f0"].hold(k)
    body = {"model": "tiny", "messages": HI, "stream": True}
    with httpx.stream("POST", f"{base}/chat/completions", json=body, timeout=WAIT_S) as r:
        events = sse(r)
        first = read_tokens(events, k)
        assert engines["f0"].held.wait(WAIT_S) and content(first) == ANSWER
        engines["f0"].release()
        *rest, done = list(events)
    assert done == "[DONE]" and content(first + rest) == ANSWER
    assert (rest[-1]["choices"][0]["finish_reason"], rest[-1]["choices"][0]["stop_reason"]) == ("stop", STOP)
    assert client.chat.completions.create(model="tiny", messages=HI).choices[0].message.content == ANSWER
    chunks = list(client.completions.create(model="tiny", prompt="Q:", stream=True,
                                            extra_body={"include_stop_str_in_output": True}))
    assert "".join(c.choices[0].text for c in chunks) == ANSWER + STOP


def test_a_named_samples_turns_stream_as_they_come_and_are_recorded_as_without_stream(held):
    """Two turns of a named chat sample, streamed (the first held part-way: its tokens are sent and recorded
    before the turn ends), against the same two turns of a sample without stream: the same answers, chunk by
    chunk joined, and the same trajectory."""
    _, client, base, tok, engines = held
    script = ids_of(tok, "Hello there, friend.") + [tok.eos_token_id]
    play(engines, script, ends=True)

    def ask(sample_id: str, convo: list, stream: bool):
        body = {"model": "tiny", "messages": convo, "max_tokens": 32, "logprobs": True, "pdsr_sample": sample_id}
        if not stream:
            return httpx.post(f"{base}/chat/completions", json=body, timeout=WAIT_S).json()
        return httpx.stream("POST", f"{base}/chat/completions", timeout=WAIT_S,
                            json={**body, "stream": True, "stream_options": {"include_usage": True}})

    convo = list(HI)
    answers = []
    for turn in range(2):
        answers.append(ask("plain", convo, False))
        convo += [{"role": "assistant", "content": answers[-1]["choices"][0]["message"]["content"]},
                  {"role": "tool", "content": f"result {turn}", "name": "calc"}]
    convo = list(HI)
    for turn, plain in enumerate(answers):
        if not turn:
            engines["f0"].hold(3)
        with ask("streamed", convo, True) as r:
            events = sse(r)
            chunks = read_tokens(events, 3) if not turn else []
            if not turn:
                assert engines["f0"].held.wait(WAIT_S) and content(chunks) == tok.decode(script[:3])
                row = httpx.get(f"{base}/pdsr/samples/streamed", timeout=WAIT_S).json()
                assert not row["finished"] and row["response_token_ids"] == script[:3]
                engines["f0"].release()
            *chunks, usage, done = chunks + list(events)
        want = plain["choices"][0]
        role, *body = chunks
        assert done == "[DONE]" and role["prompt_token_ids"] == plain["prompt_token_ids"]
        assert len(body) > 1 and content(body) == want["message"]["content"] == "Hello there, friend."
        assert [i for c in body for i in c["choices"][0]["token_ids"]] == want["token_ids"]
        assert [x for c in body if c["choices"][0]["logprobs"] for x in c["choices"][0]["logprobs"]["content"]] == \
            want["logprobs"]["content"]
        assert body[-1]["choices"][0]["finish_reason"] == want["finish_reason"] == "stop"
        assert usage["usage"] == plain["usage"]
        convo += [{"role": "assistant", "content": content(body)}, {"role": "tool", "content": f"result {turn}",
                                                                    "name": "calc"}]
    rows = [httpx.post(f"{base}/pdsr/samples/{s}/end", json={"reward": 1.0}, timeout=WAIT_S).json()
            for s in ("plain", "streamed")]
    for key in ("prompt_token_ids", "response_token_ids", "response_mask", "response_logprobs", "reward",
                "finish_reason"):
        assert rows[0][key] == rows[1][key], key
    assert [(t["role"], t["num_tokens"], t.get("tool_name")) for t in rows[0]["turns"]] == \
        [(t["role"], t["num_tokens"], t.get("tool_name")) for t in rows[1]["turns"]]


def test_a_chat_with_a_tool_parser_streams_its_content_then_its_calls(held):
    """Content is streamed until a <tool_call> may have begun (held there), then each parsed call comes as a
    delta.tool_calls chunk and the finish reason is tool_calls: the openai client's accumulated message is the
    answer without stream. A call the token limit cut is no call: its text comes at the end, finish 'length'."""
    _, client, _, tok, engines = held
    script = ids_of(tok, "Let me look." + CALC + "\n" + CLOCK) + [tok.eos_token_id]
    play(engines, script, ends=True)
    plain = client.chat.completions.create(model="tiny", messages=HI, tools=[CALCULATOR]).choices[0]
    assert plain.finish_reason == "tool_calls" and plain.message.content == "Let me look."
    k = inside(tok, script, "Let me look.")
    engines["f0"].hold(k)
    stream = client.chat.completions.create(model="tiny", messages=HI, tools=[CALCULATOR], stream=True)
    state, chunks = ChatCompletionStreamState(), []
    for chunk in stream:
        state.handle_chunk(chunk)
        chunks.append(chunk)
        if sum(len(c.choices[0].model_extra.get("token_ids") or []) for c in chunks) == k:
            assert engines["f0"].held.wait(WAIT_S)
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Let me look."
            engines["f0"].release()
    got = state.get_final_completion().choices[0]
    assert got.finish_reason == "tool_calls" and got.message.content == plain.message.content
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in got.message.tool_calls] == \
        [(c.type, c.function.name, json.loads(c.function.arguments)) for c in plain.message.tool_calls] == \
        [("function", "calculator", {"expression": "6*7"}), ("function", "clock", {})]
    assert len({c.id for c in got.message.tool_calls}) == 2
    calls = [[t.index for t in c.choices[0].delta.tool_calls] for c in chunks if c.choices[0].delta.tool_calls]
    assert calls == [[0], [1]]
    # cut inside its first call: no call, the whole text at the end, as without stream
    cut = dict(model="tiny", messages=HI, tools=[CALCULATOR], max_tokens=len(ids_of(tok, "Let me look." + CALC)) - 3)
    plain = client.chat.completions.create(**cut).choices[0]
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(**cut, stream=True):
        state.handle_chunk(chunk)
    got = state.current_completion_snapshot.choices[0]   # (get_final_completion refuses a 'length' one)
    assert (got.finish_reason, got.message.content, got.message.tool_calls) == ("length", plain.message.content, None)
    assert got.message.content.startswith("Let me look.<tool_call>")


def test_only_a_hermes_tag_the_text_keeps_is_held_back(tiny_model_dir):
    """A chat's text streams held back before hermes's <tool_call>; where the tokenizer drops that tag from the text
    (a special token), or with another parser, whose tags pdsr does not read, it is held whole to the end."""
    from types import SimpleNamespace

    from pdsr_sdk.rollout.data import load_tokenizer
    from pdsr_sdk.rollout.serve_stream import TOOL_CALL_TAG, _text_holds

    tok = load_tokenizer(tiny_model_dir)
    server = SimpleNamespace(session=SimpleNamespace(tokenizer=tok), tool_parser="hermes")
    assert _text_holds(server, True, [STOP]) == (True, [STOP, TOOL_CALL_TAG])
    assert _text_holds(server, False, [STOP]) == (True, [STOP])   # completions: no parser
    tok.add_special_tokens({"additional_special_tokens": [TOOL_CALL_TAG]})
    assert _text_holds(server, True, [STOP]) == (False, [STOP])
    server.tool_parser = "llama3_json"
    assert _text_holds(server, True, []) == (False, [])
    server.tool_parser = None
    assert _text_holds(server, True, []) == (True, [])
