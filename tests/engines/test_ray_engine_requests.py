"""One engine in a Ray actor (``fast-ray-0``, tests/engines/conftest.py) serving requests itself, beside the local
``fast-0``: a stream aborted mid-way, the engine's load, and a request the engine refuses. Greedy float32, so every
stream is a prefix of the local greedy reference."""

from __future__ import annotations

from ray_checks import Collector, engine_test, greedy_request
from support import run_on


@engine_test
def test_abort_mid_stream_delivers_every_token_then_abort_and_load_is_reported(ray_engines, reference, engine_loop):
    ray0 = ray_engines[0]
    prompt = reference["prompts"]["p0"]
    col = Collector()

    async def go():
        ray0.bind(col)
        ray0.submit(greedy_request("long", prompt, 900))
        ray0.submit(greedy_request("short", prompt, 7))
        await col.wait(lambda: len(col.tokens.get("long", ())) >= 20 and "short" in col.ends)
        seen_load = ray0.load()
        ray0.abort("long")
        ray0.abort("no-such-request")       # ignored
        await col.wait(lambda: "long" in col.ends)
        return seen_load

    load = run_on(engine_loop, go())
    assert col.ends == {"short": "length", "long": "abort"}
    long = col.tokens["long"]
    assert 20 <= len(long) < 900
    # greedy: the aborted stream is the start of the reference continuation (as far as it goes)
    ref = reference["tokens"]["p0"]
    assert long[:len(ref)] == ref[:len(long)] and col.tokens["short"] == ref[:7]
    assert len(col.logprobs["long"]) == len(long) and all(lp <= 0 for lp in col.logprobs["long"])
    assert load.running >= 1 and load.kv_cache_usage and load.kv_cache_usage > 0
    assert not col.dead


@engine_test
def test_a_request_the_engine_refuses_fails_alone_and_the_engine_goes_on(ray_engines, reference, engine_loop):
    """vLLM refusing one request (a token id out of the vocabulary, at add_request) is that request's failure,
    heard as ``on_request_failed`` from the Ray actor as from a local engine, not the engine's death: a request
    beside it runs to its end."""

    class Refusals(Collector):
        def __init__(self):
            super().__init__()
            self.failed: dict[str, str] = {}

        def on_request_failed(self, engine, rid, error):
            self.failed[rid] = error
            self.changed.set()

    prompt = reference["prompts"]["p0"]
    for engine in (ray_engines[0], ray_engines[2]):   # in a Ray actor; local
        col = Refusals()

        async def go():
            engine.bind(col)
            engine.submit(greedy_request("bad", [10**7], 4))
            engine.submit(greedy_request("good", prompt, 5))
            await col.wait(lambda: "bad" in col.failed or col.dead)
            assert not col.dead, f"{engine.name}: {col.dead}"
            await col.wait(lambda: "good" in col.ends)

        run_on(engine_loop, go())
        assert "VLLMValidationError: Token id 10000000 is out of vocabulary" in col.failed["bad"], engine.name
        assert col.ends == {"good": "length"} and col.tokens["good"] == reference["tokens"]["p0"][:5]
        assert not col.dead
