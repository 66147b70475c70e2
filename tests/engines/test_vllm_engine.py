"""The vLLM engine backend on its own: streaming, abort, load, an observer, and death reports (CPU build)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from support import WAIT_S, requires_vllm, run_on
from pdsr_sdk.dispatch.types import SegmentRequest
from pdsr_sdk.rollout.config import EngineSpec, SamplingConfig
from pdsr_sdk.rollout.data import PromptRecord, build_groups

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s


class Recorder:
    def __init__(self):
        self.tokens: dict[str, list[int]] = {}
        self.logprobs: dict[str, list[float]] = {}
        self.ends: dict[str, str] = {}
        self.dead: list = []
        self.event = asyncio.Event()

    def on_tokens(self, engine, rid, n, ids, lps):
        self.tokens.setdefault(rid, []).extend(ids)
        self.logprobs.setdefault(rid, []).extend(lps)

    def on_segment_end(self, engine, rid, reason):
        self.ends[rid] = reason
        self.event.set()

    def on_engine_dead(self, engine, error):
        self.dead.append(error)
        self.event.set()


class Observer:
    """A ``VllmEngine.observer``: the launches and the streamed outputs, by request."""

    def __init__(self):
        self.launched: list[str] = []
        self.streamed: dict[str, int] = {}
        self.finished: set[str] = set()

    def on_launch(self, request, extra_args):
        self.launched.append(request.request_id)
        return extra_args

    def on_output(self, request_id, output):
        self.streamed[request_id] = self.streamed.get(request_id, 0) + len(output.outputs[0].token_ids or ())
        if output.finished:
            self.finished.add(request_id)


def request(rid, max_tokens, *, ids=(5, 6, 7, 8, 9), ignore_eos=True):
    g = build_groups([PromptRecord("p", "p", list(ids))], 1, max_tokens)[0]
    return SegmentRequest(request_id=rid, context_ids=list(ids), context_len=len(ids), max_tokens=max_tokens,
                          ignore_eos=ignore_eos, sampling=SamplingConfig(temperature=1.0), sample=g.samples[0])


async def wait_for(pred, timeout=WAIT_S):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        if loop.time() > end:
            raise TimeoutError("engine did not report in time")
        await asyncio.sleep(0.02)


def test_stream_abort_and_death_are_reported(engine_loop, tiny_model_dir):
    """The CPU build's dtype (bf16 on a CPU with native bf16, which needs the AMX grant from pdsr's
    vLLM plugin), one engine on core 0: its worker (forked from the core) is bound to that core;
    a request streams to its max_tokens; an abort returns the tokens so far; a crashed
    engine core is reported with the engine's name, exit status and its own traceback."""
    import psutil

    from pdsr_sdk.engines.vllm_engine import VllmEngine

    engine = VllmEngine.from_spec(EngineSpec(name="doomed-0", pool="fast", devices=[0], max_num_seqs=4,
                                             max_model_len=2048), model=str(tiny_model_dir))
    rec = Recorder()
    engine.bind(rec)
    obs = Observer()
    engine.observer = obs

    async def scenario():
        await engine.start()
        workers = [p for p in psutil.Process(engine.core_processes()[0].pid).children() if "Worker" in p.name()]
        assert [w.cpu_affinity() for w in workers] == [[0]]
        engine.submit(request("full", 40))
        await wait_for(lambda: "full" in rec.ends)
        engine.submit(request("long", 1500))
        await wait_for(lambda: len(rec.tokens.get("long", [])) >= 5)
        engine.abort("long")
        await wait_for(lambda: "long" in rec.ends)
        # aborted in the tick it was submitted in, before vLLM has the request (which drops such an abort):
        # it still ends as aborted, and the engine is left idle, so its prefix cache can be reset
        engine.submit(request("early", 1500))
        engine.abort("early")
        await wait_for(lambda: "early" in rec.ends)
        await engine.reset_prefix_cache()
        load = engine.load()
        engine.submit(request("victim", 1500))
        await wait_for(lambda: len(rec.tokens.get("victim", [])) >= 5)
        procs = engine.core_processes()
        assert procs, "no engine-core process handle found"
        os.kill(procs[0].pid, signal.SIGSEGV)
        await wait_for(lambda: bool(rec.dead))
        return load

    try:
        load = run_on(engine_loop, scenario(), timeout=600)
    finally:
        run_on(engine_loop, engine.close())
    assert rec.ends["full"] == "length" and len(rec.tokens["full"]) == 40
    assert len(rec.logprobs["full"]) == 40 and all(lp <= 0 for lp in rec.logprobs["full"])
    assert obs.launched == ["full", "long", "early", "victim"]   # the observer saw every request the listener did
    assert obs.streamed["full"] == 40 and "full" in obs.finished
    assert obs.streamed["long"] == len(rec.tokens["long"])
    assert rec.ends["long"] == "abort" and 5 <= len(rec.tokens["long"]) < 1500
    assert rec.ends["early"] == "abort" and len(rec.tokens.get("early", [])) < 1500
    assert load.running >= 0 and (load.kv_cache_usage is None or 0.0 <= load.kv_cache_usage <= 1.0)
    assert "victim" not in rec.ends                     # a dead engine ends no request
    err = rec.dead[0]
    assert err.engine == "doomed-0" and "doomed-0" in str(err)
    assert err.exit_status == -signal.SIGSEGV
    assert err.remote_traceback and "Segmentation fault" in err.remote_traceback
