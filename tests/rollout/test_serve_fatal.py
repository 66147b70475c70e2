"""``pdsr serve`` when its session fails with requests in flight: the only engine of the pool dies (a real fatal
error, through the scheduler's ``on_fatal``) while a plain request, a ``stream=true`` request and a named sample's
turn, plain and streamed, wait on it (tests/stream_fakes.py holds their responses part-way, then dies). Each gets
vLLM's 500 (a stream that started: its error chunk then ``[DONE]``), not a wait with no end; then a new request
gets the 500 and /health a 503. Events are ordered by what the engine reports (all four responses held), never by
time; a request that would hang fails the test at ``WAIT_S``."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession
from support import WAIT_S, requires_torch

pytestmark = requires_torch

pytest.importorskip("openai")

from serve_client import serving  # noqa: E402

HI = [{"role": "user", "content": "hi"}]
LOST = "died and no live engine is left in pool 'fast' to take its 4 unfinished request(s)"


def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(url, json=body, timeout=WAIT_S)


def stream(url: str, body: dict) -> tuple[int, list]:
    """A streamed request's status and its events (chunks, then '[DONE]'), or its error body."""
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=WAIT_S) as r:
        if r.status_code != 200:
            return r.status_code, [json.loads(r.read())]
        return 200, [line[6:] if line == "data: [DONE]" else json.loads(line[6:])
                     for line in r.iter_lines() if line.startswith("data: ")]


def assert_streamed_500(status: int, events: list, at: int) -> None:
    """A stream's 500: its response when no token was sent yet (``at`` 0), else its last chunk before [DONE]."""
    if at == 0:   # the stream had not started: its response is the error, as the request's without stream
        assert status == 500
        assert_500(events[0])
    else:
        *chunks, error, done = events
        assert status == 200 and done == "[DONE]" and all("error" not in c for c in chunks)
        assert_500(error)
        assert sum(len(c["choices"][0].get("token_ids", [])) for c in chunks) <= at


def assert_500(body: dict) -> None:
    error = body["error"]
    assert (error["type"], error["code"]) == ("InternalServerError", 500) and LOST in error["message"], body


@pytest.mark.parametrize("at", [0, 2], ids=["before-any-token", "after-2-tokens"])
def test_requests_in_flight_when_the_session_fails_get_vllms_500(tiny_model_dir, at):
    """Held at ``at`` tokens, the engine dies: the plain request and the named turn get the 500; the streams (plain,
    a named turn) get it as their response (no token yet) or as their last chunk before [DONE] (tokens were sent)."""
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": 16},
                        agent={"env_timeout_s": 600},
                        engines=[{"name": "f0", "pool": "fast", "backend": "stream_fakes:ScriptEngine",
                                  "max_model_len": 1024, "max_num_seqs": 4}])
    with RolloutSession(cfg) as session, serving(session, model_name="m") as (_, base):
        engine = session.engines[0]
        engine.play([40, 41, 42, 43])
        engine.hold(at)
        url = f"{base}/chat/completions"
        body = {"model": "m", "messages": HI}
        with ThreadPoolExecutor(4) as pool:
            plain = pool.submit(post, url, body)
            named = pool.submit(post, url, {**body, "pdsr_sample": "s1"})
            streamed = pool.submit(stream, url, body)
            named_streamed = pool.submit(stream, url, {**body, "pdsr_sample": "s2"})
            assert engine.wait_held(4, WAIT_S), "the four responses never reached the hold"
            engine.die()
            plain, named, streamed, named_streamed = (f.result(WAIT_S)
                                                      for f in (plain, named, streamed, named_streamed))
        assert plain.status_code == 500 and named.status_code == 500, (plain.text, named.text)
        assert_500(plain.json())
        assert_500(named.json())
        assert_streamed_500(*streamed, at)
        assert_streamed_500(*named_streamed, at)
        # a new request, plain or a named sample's next turn, gets the 500 at once; /health says why not ready
        assert_500(post(url, body).json())
        assert_500(post(url, {**body, "pdsr_sample": "s3"}).json())
        r = httpx.post(f"{base}/pdsr/samples/s1/end", json={"reward": 1.0}, timeout=WAIT_S)
        assert r.status_code == 500 and LOST in r.json()["error"]["message"]
        assert httpx.get(base.removesuffix("/v1") + "/health", timeout=WAIT_S).status_code == 503
