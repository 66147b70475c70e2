"""``pdsr serve`` shutting down with requests in flight (Ctrl-C: the session's loop cancels ``aserve``, then the
session closes): a plain request, a ``stream=true`` request and a named sample's turn, plain and streamed, held
part-way on a fake engine (tests/stream_fakes.py), each get a 503 telling the HTTP client the server is shutting down
and to send the request again to a running server (a stream that started: its error chunk, then ``[DONE]``), not
the SDK's words for a closed session. Events are ordered by what the engine reports, never by time."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.serve import SHUTTING_DOWN
from pdsr_sdk.rollout.session import RolloutSession
from support import WAIT_S, requires_torch

pytestmark = requires_torch

HI = [{"role": "user", "content": "hi"}]


async def post(client: httpx.AsyncClient, url: str, body: dict) -> tuple[int, list]:
    r = await client.post(url, json=body)
    return r.status_code, [r.json()]


async def stream(client: httpx.AsyncClient, url: str, body: dict) -> tuple[int, list]:
    """A streamed request's status and its events (chunks, then '[DONE]'), or its error body."""
    async with client.stream("POST", url, json={**body, "stream": True}) as r:
        if r.status_code != 200:
            return r.status_code, [json.loads(await r.aread())]
        return 200, [line[6:] if line == "data: [DONE]" else json.loads(line[6:])
                     async for line in r.aiter_lines() if line.startswith("data: ")]


def assert_shutting_down(status: int, events: list, streamed: bool, at: int) -> None:
    """The 503 as the response (a plain request, a stream with no token sent) or as a stream's last chunk."""
    if streamed and at > 0:
        *chunks, error, done = events
        assert status == 200 and done == "[DONE]" and chunks and all("error" not in c for c in chunks), events
    else:
        assert status == 503, events
        (error,) = events
    assert error["error"] == {"message": SHUTTING_DOWN, "type": "ServiceUnavailableError", "param": None,
                              "code": 503}, error


@pytest.mark.parametrize("at", [0, 2], ids=["before-any-token", "after-2-tokens"])
def test_requests_in_flight_at_shutdown_get_a_503_saying_so(tiny_model_dir, at):
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": 16},
                        agent={"env_timeout_s": 600},
                        engines=[{"name": "f0", "pool": "fast", "backend": "stream_fakes:ScriptEngine",
                                  "max_model_len": 1024, "max_num_seqs": 4}])

    async def main() -> list:
        session = RolloutSession(cfg)
        await session.start()
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        serving = asyncio.ensure_future(session.aserve(port=0, model_name="m", on_ready=ready.set_result))
        try:
            url = f"http://127.0.0.1:{await asyncio.wait_for(ready, WAIT_S)}/v1/chat/completions"
            engine = session.engines[0]
            engine.play([40, 41, 42, 43])
            engine.hold(at)
            body = {"model": "m", "messages": HI}
            async with httpx.AsyncClient(timeout=WAIT_S) as client:
                requests = [asyncio.ensure_future(r) for r in (
                    post(client, url, body), post(client, url, {**body, "pdsr_sample": "s1"}),
                    stream(client, url, body), stream(client, url, {**body, "pdsr_sample": "s2"}))]
                assert await asyncio.to_thread(engine.wait_held, 4, WAIT_S), "the four never reached the hold"
                serving.cancel()   # as pdsr serve's Ctrl-C does, then the session closes
                await session.close()
                return await asyncio.wait_for(asyncio.gather(*requests), WAIT_S)
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            if not session.closed:
                await session.close()

    plain, named, streamed, named_streamed = asyncio.run(main())
    assert_shutting_down(*plain, streamed=False, at=at)
    assert_shutting_down(*named, streamed=False, at=at)
    assert_shutting_down(*streamed, streamed=True, at=at)
    assert_shutting_down(*named_streamed, streamed=True, at=at)
