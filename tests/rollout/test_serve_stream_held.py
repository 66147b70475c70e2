"""``pdsr serve``'s streams on an engine that reports each token as it makes it and holds a response part-way until
the test releases it (tests/stream_fakes.py; one server for the module, v2 with ``on_break: restart``, a stop string
and ``--tool-parser hermes``). What a stream sent is read while its response is held, never by time: a restart
after tokens were sent ends the stream with an error chunk, one before any is no error; text that may become a stop
string or a tool call is held back; a named sample's turn streams as it comes and is recorded as without ``stream``;
tool calls come as ``delta.tool_calls`` after the content, each call's name first, then its arguments as they are
written."""

from __future__ import annotations

import json
from contextlib import contextmanager

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


@contextmanager
def served(model_dir, tool_parser: str):
    """(session, openai client, base URL, tokenizer, engines by name) of ``session.serve`` on a fast and a heavy
    ScriptEngine."""
    settings = {"v2": {"breaker_tokens": CAP, "breaker_time_s": None, "on_break": "restart", "steal": False}}
    engines = [{"name": name, "pool": pool, "backend": "stream_fakes:ScriptEngine", "max_model_len": 1024,
                "max_num_seqs": 4} for name, pool in (("f0", "fast"), ("h0", "heavy"))]
    cfg = RolloutConfig(model=str(model_dir), policy="v2", policy_settings=settings,
                        sampling={"max_tokens": 256, "stop": [STOP]}, agent={"env_timeout_s": 60}, engines=engines)
    with RolloutSession(cfg) as session, serving(session, model_name="tiny", tool_parser=tool_parser) as (client,
                                                                                                        base):
        yield session, client, base, session.tokenizer, {e.name: e for e in session.engines}


@pytest.fixture(scope="module")
def held(tiny_model_dir):
    with served(tiny_model_dir, "hermes") as server:
        yield server


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


def accumulated(stream, on_chunk=None):
    """The openai client's accumulated choice of a stream and its chunks (``on_chunk(chunks)`` after each)."""
    state, chunks = ChatCompletionStreamState(), []
    for chunk in stream:
        state.handle_chunk(chunk)
        chunks.append(chunk)
        if on_chunk is not None:
            on_chunk(chunks)
    return state.current_completion_snapshot.choices[0], chunks


def held_stream(client, engines, k, **request):
    """A chat streamed with the engine held after ``k`` tokens: the chunks received by then (read while it is held),
    and the accumulated choice and every chunk once released."""
    engines["f0"].hold(k)
    seen = []

    def at_hold(chunks):
        if sum(len(c.choices[0].model_extra.get("token_ids") or []) for c in chunks) == k:
            assert engines["f0"].held.wait(WAIT_S)
            seen.extend(chunks)
            engines["f0"].release()

    got, chunks = accumulated(client.chat.completions.create(**request, stream=True), at_hold)
    return seen, got, chunks


def entries(chunks) -> list:
    return [t for c in chunks for t in c.choices[0].delta.tool_calls or []]


def same_message(got, plain) -> None:
    """The streamed choice is the answer without stream: content, calls (their arguments text too), finish."""
    assert (got.finish_reason, got.message.content) == (plain.finish_reason, plain.message.content)
    assert [(c.type, c.function.name, c.function.arguments) for c in got.message.tool_calls or []] == \
        [(c.type, c.function.name, c.function.arguments) for c in plain.message.tool_calls or []]
    assert len({c.id for c in got.message.tool_calls or []}) == len(plain.message.tool_calls or [])


@pytest.mark.parametrize("calls", [[CALC], [CALC, CLOCK]])
def test_a_chat_streams_its_content_then_each_calls_name_then_its_arguments(held, calls):
    """Content is streamed until a <tool_call> may have begun; held inside the first call's arguments, the stream
    has sent its name (index, id, type, arguments "") and the arguments so far, no finish yet. The fragments
    joined are each call's arguments, and the openai client's accumulated message is the answer without stream
    (finish tool_calls), for one call and for two."""
    _, client, _, tok, engines = held
    text = "Let me look." + "\n".join(calls)
    script = ids_of(tok, text) + [tok.eos_token_id]
    play(engines, script, ends=True)
    plain = client.chat.completions.create(model="tiny", messages=HI, tools=[CALCULATOR]).choices[0]
    assert plain.finish_reason == "tool_calls" and plain.message.content == "Let me look."
    k = inside(tok, script, text[:text.index("6*7")])
    seen, got, chunks = held_stream(client, engines, k, model="tiny", messages=HI, tools=[CALCULATOR])
    first, *more = entries(seen)
    assert "".join(c.choices[0].delta.content or "" for c in seen) == "Let me look."
    assert (first.index, first.type, first.function.name, first.function.arguments) == (0, "function",
                                                                                         "calculator", "")
    assert first.id and all((t.index, t.id, t.type, t.function.name) == (0, None, None, None) for t in more)
    so_far = "".join(t.function.arguments for t in more)
    assert so_far.startswith('{"expression": "') and plain.message.tool_calls[0].function.arguments.startswith(so_far)
    assert not so_far.endswith("}")
    assert all(c.choices[0].finish_reason is None for c in seen)
    same_message(got, plain)
    for i, call in enumerate(plain.message.tool_calls):
        assert "".join(t.function.arguments for t in entries(chunks) if t.index == i) == call.function.arguments
        assert [t.function.name for t in entries(chunks) if t.index == i and t.function.name] == [call.function.name]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("text, content, names", [
    # its arguments not an object: no name is sent, its text comes at the end
    ('Hmm.<tool_call>{"name": "calculator", "arguments": "6*7"}</tool_call>',
     'Hmm.<tool_call>{"name": "calculator", "arguments": "6*7"}</tool_call>', []),
    # not JSON before its name, then a well-formed call: the malformed one is left out
    ("Hmm.<tool_call>{name: calculator}</tool_call>" + CLOCK, "Hmm.", ["clock"]),
    # a name holding a lone surrogate (UTF-8 cannot carry it: the answer's body failed to encode, a 500)
    ('Hmm.<tool_call>{"name": "\\ud83d", "arguments": {}}</tool_call>',
     'Hmm.<tool_call>{"name": "\\ud83d", "arguments": {}}</tool_call>', []),
    ('Hmm.<tool_call>{"name": "a\\udfff", "arguments": {"x": 1}}</tool_call>' + CLOCK, "Hmm.", ["clock"]),
])
def test_a_malformed_call_streams_as_the_answer_without_stream(held, text, content, names):
    _, client, _, tok, engines = held
    play(engines, ids_of(tok, text) + [tok.eos_token_id], ends=True)
    plain = client.chat.completions.create(model="tiny", messages=HI, tools=[CALCULATOR]).choices[0]
    got, chunks = accumulated(client.chat.completions.create(model="tiny", messages=HI, tools=[CALCULATOR],
                                                             stream=True))
    assert plain.message.content == content and [c.function.name for c in plain.message.tool_calls or []] == names
    same_message(got, plain)


def test_a_call_streamed_then_cut_stays_as_sent(held):
    """A call whose name and arguments went out, then cut by the token limit before its </tool_call>: no call
    without stream (its text is the content, finish length); the stream cannot take it back, so it keeps the call
    as sent and its content ends where the call began, as vLLM's stream."""
    _, client, _, tok, engines = held
    script = ids_of(tok, "Let me look." + CALC) + [tok.eos_token_id]
    play(engines, script, ends=True)
    cut = dict(model="tiny", messages=HI, tools=[CALCULATOR], max_tokens=len(script) - 4)
    plain = client.chat.completions.create(**cut).choices[0]
    assert (plain.finish_reason, plain.message.tool_calls) == ("length", None)
    assert plain.message.content == tok.decode(script[:len(script) - 4])
    got, _ = accumulated(client.chat.completions.create(**cut, stream=True))
    (call,) = got.message.tool_calls
    assert (got.finish_reason, got.message.content, call.function.name) == ("length", "Let me look.", "calculator")
    assert '{"expression": "6*7"}'.startswith(call.function.arguments) and call.function.arguments


def test_another_parser_streams_the_text_before_its_marker_and_its_calls_at_the_end(tiny_model_dir):
    """qwen3_json (vLLM's own reading of hermes calls): held after the content, the stream has sent it; the calls
    come whole at the turn's end, and the accumulated message is the answer without stream."""
    with served(tiny_model_dir, "qwen3_json") as (_, client, _, tok, engines):
        script = ids_of(tok, "Let me look." + CALC + "\n" + CLOCK) + [tok.eos_token_id]
        play(engines, script, ends=True)
        plain = client.chat.completions.create(model="tiny", messages=HI, tools=[CALCULATOR]).choices[0]
        k = inside(tok, script, "Let me look.<tool_call>")
        seen, got, chunks = held_stream(client, engines, k, model="tiny", messages=HI, tools=[CALCULATOR])
        assert "".join(c.choices[0].delta.content or "" for c in seen) == "Let me look." and not entries(seen)
        assert plain.finish_reason == "tool_calls" and len(plain.message.tool_calls) == 2
        same_message(got, plain)
        assert [[t.index for t in c.choices[0].delta.tool_calls] for c in chunks if c.choices[0].delta.tool_calls] \
            == [[0], [1]]


def test_only_a_marker_the_text_keeps_is_held_back(tiny_model_dir):
    """A chat's text streams held back before its parser's marker (hermes's <tool_call>, qwen3_json's too); where
    the tokenizer drops it from the text (a special token), or with a parser with no marker, it is held whole to
    the end."""
    from pdsr_sdk.rollout.data import load_tokenizer
    from pdsr_sdk.rollout.serve_deltas import text_holds

    tok = load_tokenizer(tiny_model_dir)
    tag = "<tool_call>"
    assert text_holds(tok, "hermes", True, [STOP]) == (True, [STOP, tag])
    assert text_holds(tok, "hermes", False, [STOP]) == (True, [STOP])   # completions: no parser
    assert text_holds(tok, None, True, []) == (True, [])
    assert text_holds(tok, "qwen3_json", True, []) == (True, [tag])
    assert text_holds(tok, "llama3_json", True, []) == (False, [])
    tok.add_special_tokens({"additional_special_tokens": [tag]})
    assert text_holds(tok, "hermes", True, [STOP]) == (False, [STOP])
    assert text_holds(tok, "qwen3_json", True, [STOP]) == (False, [STOP])


def test_non_ascii_arguments_are_written_as_vllm_writes_them_stream_or_not(held):
    """A call's raw and escaped CJK and emoji come as the characters themselves (json.dumps(ensure_ascii=False), as
    vLLM's tool parsers write them), a lone surrogate escaped (UTF-8 cannot carry it): in the answer's body, and
    in the openai client's message accumulated from the stream, which is the answer without stream; the stream's
    chunks carry them as UTF-8 too."""
    _, client, base, tok, engines = held
    call = ('<tool_call>{"name": "calculator", "arguments": {"城市": "北京\\u5929", "emoji": "\U0001f600\\ud83d'
            '\\ude00", "lone": "\\ud83d!"}}</tool_call>')
    script = ids_of(tok, "Let me look." + call) + [tok.eos_token_id]
    assert tok.decode(script[:-1]) == "Let me look." + call
    play(engines, script, ends=True)
    want = '{"城市": "北京天", "emoji": "\U0001f600\U0001f600", "lone": "\\ud83d!"}'
    body = {"model": "tiny", "messages": HI, "tools": [CALCULATOR]}
    raw = httpx.post(f"{base}/chat/completions", json=body, timeout=WAIT_S)
    assert raw.status_code == 200 and "北京天".encode() in raw.content   # UTF-8 on the wire, as vLLM's body
    assert raw.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == want
    plain = client.chat.completions.create(**body).choices[0]
    assert plain.message.tool_calls[0].function.arguments == want
    got, _ = accumulated(client.chat.completions.create(**body, stream=True))
    same_message(got, plain)
    with httpx.stream("POST", f"{base}/chat/completions", json={**body, "stream": True}, timeout=WAIT_S) as r:
        wire = r.read()
    assert "北".encode() in wire and b"\\u5317" not in wire   # the stream's chunks are UTF-8 too, as vLLM's
    assert b"\\ud83d!" in wire   # the lone surrogate escaped: UTF-8 cannot carry it
