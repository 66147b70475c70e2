"""A bucketed update_weights that an engine fails part-way (fake engines that record what they load): the error
names the engine and says the engines hold a partial update, every engine's open reload is ended, and the session
refuses to generate (steps, next_version, served requests) until a whole update (the buckets and the data checks on
real engines: tests/engines/test_weights_buckets.py)."""

from __future__ import annotations

import contextlib

import pytest

from fakes import FakeEngine
from support import requires_torch
from pdsr_sdk.errors import EngineError, RunError

pytestmark = requires_torch


class LoadingEngine(FakeEngine):
    """A fake engine that takes weights: it records each load (bucket index or None, and whether the prefix cache
    was reset) and each end of an open reload, and refuses the bucket ``fail_at``."""

    def __init__(self, *args, fail_at: int | None = None, **kw):
        super().__init__(*args, **kw)
        self.fail_at = fail_at
        self.loads: list = []
        self.ends = 0

    async def update_weights(self, weights, *, reset_prefix_cache: bool = True) -> None:
        index = None if weights.bucket is None else weights.bucket.index
        if index is not None and index == self.fail_at:
            raise EngineError(self.name, f"update_weights: bucket {index} failed here")
        self.loads.append((index, [n for n, _ in weights.items], reset_prefix_cache))

    async def end_weights(self) -> None:
        self.ends += 1


@contextlib.contextmanager
def loading_session(tiny_model_dir, engines: list[LoadingEngine], **settings):
    """A session (baseline policy, ``settings``) on the fake loading ``engines``, their clocks on its loop."""
    from pdsr_sdk.dispatch.clock import LoopClock
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="baseline", **settings)
    with RolloutSession(cfg, engines=engines) as session:
        for e in engines:
            e.clock = LoopClock(session._thread.loop)
        yield session


def test_an_engine_failing_a_bucket_leaves_a_partial_update_that_nothing_generates_from(tiny_model_dir, tiny_weights):
    sd = tiny_weights[0]
    few = 3 * max(t.numel() * t.element_size() for t in sd.values())
    engines = [LoadingEngine("fast-0", "fast", None), LoadingEngine("heavy-0", "heavy", None, fail_at=2)]
    with loading_session(tiny_model_dir, engines, batch_size=1,
                         sampling={"n": 2, "max_tokens": 8, "ignore_eos": True}) as session:
        with pytest.raises(EngineError, match=r"engine 'heavy-0': update_weights: bucket 2 failed here \(the engines "
                                              r"had loaded up to 3 bucket\(s\) of this update: they now hold a "
                                              r"partial"):
            session.update_weights(sd, bucket_bytes=few)
        partial = [list(e.loads) for e in engines], [e.ends for e in engines]
        assert session.policy_version == 0
        for call in (lambda: session.step(["a"]), session.next_version):
            with pytest.raises(RunError, match="the engines hold a partial weight update"):
                call()
        engines[1].fail_at = None
        assert session.update_weights(sd, bucket_bytes=few) == 1
        whole = [list(e.loads[len(p):]) for e, p in zip(engines, partial[0])]
        out = session.step(["a"])
    # the healthy engine loaded buckets 0-2, the failing one 0-1; each then had its open reload ended
    assert [[i for i, _, _ in loads] for loads in partial[0]] == [[0, 1, 2], [0, 1]] and partial[1] == [1, 1]
    # the whole update: every tensor once, in order, the prefix cache reset with the last bucket only
    for loads in whole:
        assert [n for _, names, _ in loads for n in names] == [n for n in sd if n != "lm_head.weight"]
        assert [reset for _, _, reset in loads] == [False] * (len(loads) - 1) + [True]
        assert [i for i, _, _ in loads] == list(range(len(loads))) and len(loads) > 2
    assert len(out.samples) == 2 and {seg.policy_version for s in out.samples for seg in s.segments} == {1}


def test_a_served_request_is_refused_while_the_weights_are_partial(tiny_model_dir, tiny_weights):
    """``session.serve``: a request gets a 503 saying why while the engines hold a partial update, and is served
    once a whole update completes."""
    openai = pytest.importorskip("openai")
    from serve_client import serving

    sd = tiny_weights[0]
    engines = [LoadingEngine("fast-0", "fast", None, fail_at=1), LoadingEngine("heavy-0", "heavy", None)]
    with loading_session(tiny_model_dir, engines, sampling={"max_tokens": 8}) as session:
        with pytest.raises(EngineError, match="partial update"):
            session.update_weights(iter(sd.items()), bucket_bytes=1 << 20)
        with serving(session, model_name="tiny") as (client, _):
            with pytest.raises(openai.APIStatusError, match="partial weight update") as info:
                client.completions.create(model="tiny", prompt="Hi", max_tokens=4)
            assert info.value.status_code == 503 and "engine(s) 'fast-0' having failed bucket" in str(info.value)
            engines[0].fail_at = None
            session.update_weights(sd)
            done = client.completions.create(model="tiny", prompt="Hi", max_tokens=4)
    assert done.choices[0].finish_reason in ("stop", "length") and done.usage.completion_tokens >= 1


def test_an_update_cancelled_while_the_engines_load_leaves_nothing_generating(tiny_model_dir, tiny_weights):
    """A trainer that gives up on an update (``asyncio.wait_for(session.aupdate_weights(...), timeout)``, Ctrl-C)
    cancels it while the engines load: the engine processes go on loading, so the engines may hold the new weights,
    part of them or the old ones. It used to leave the session as if nothing had happened (policy version not
    bumped, weights_partial None), so the next step sampled from the new weights (on real engines: their log-probs
    were the new weights' to 2e-5) and stamped its segments with the old version. Now the engines count as holding
    a partial update: steps and next_version are refused until a whole update, which makes the session whole."""
    import asyncio
    import threading

    sd = tiny_weights[0]
    loading = threading.Event()

    class SlowEngine(LoadingEngine):
        async def update_weights(self, weights, *, reset_prefix_cache: bool = True) -> None:
            if self.fail_at == "hang":
                loading.set()
                await asyncio.sleep(60)
            await super().update_weights(weights, reset_prefix_cache=reset_prefix_cache)

    engines = [SlowEngine("fast-0", "fast", None), SlowEngine("heavy-0", "heavy", None, fail_at="hang")]
    with loading_session(tiny_model_dir, engines, batch_size=1,
                         sampling={"n": 2, "max_tokens": 8, "ignore_eos": True}) as session:
        for version, bucket_bytes in ((1, None), (2, 1 << 16)):   # one block, in buckets
            loading.clear()
            engines[1].fail_at = "hang"

            async def cancelled_midway():
                task = asyncio.ensure_future(session.aupdate_weights(sd, bucket_bytes=bucket_bytes))
                while not loading.is_set():
                    await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

            asyncio.run_coroutine_threadsafe(cancelled_midway(), session._thread.loop).result(60)
            assert session.policy_version == version - 1 and "cancelled" in (session.weights_partial or "")
            for refused in (lambda: session.step(["a"]), session.next_version):
                with pytest.raises(RunError, match="the engines hold a partial weight update.*cancelled"):
                    refused()
            engines[1].fail_at = None
            assert session.update_weights(sd, bucket_bytes=bucket_bytes) == version
            assert session.weights_partial is None
            out = session.step(["a"])
            assert {seg.policy_version for s in out.samples for seg in s.segments} == {version}
