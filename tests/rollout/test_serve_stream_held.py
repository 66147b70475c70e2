"""``pdsr serve``'s streams on an engine that reports each token as it makes it and holds a response part-way until
the test releases it (tests/stream_fakes.py; one server for the module, v2 with ``on_break: restart`` and a stop
string). What a stream sent is read while its response is held, never by time: a restart after tokens were sent
ends the stream with an error chunk, one before any is no error; text that may become a stop string is held back."""

from __future__ import annotations

import json

import httpx
import pytest

from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession
from support import WAIT_S, requires_torch

pytestmark = requires_torch

openai = pytest.importorskip("openai")

from serve_client import serving  # noqa: E402

CAP = 200         # v2's breaker_tokens: a fast sample past it breaks and starts over on heavy
STOP = "</answer>"
ANSWER = "The answer is 42"
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
    with RolloutSession(cfg) as session, serving(session, model_name="tiny") as (client, base):
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
