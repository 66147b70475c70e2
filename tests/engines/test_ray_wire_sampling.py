"""What a Ray engine's messages carry for the sampling options (plain data, pickled as Ray pickles them, no Ray or
vLLM started): a request's stop_token_ids reach the actor's engine, and the stop string or stop token id that
ended a request reaches the orchestrator's listener as the local engine hands it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import pickle

from pdsr_sdk.dispatch.config import SamplingConfig
from pdsr_sdk.dispatch.types import SegmentRequest
from pdsr_sdk.engines.config import EngineSpec
from pdsr_sdk.engines.ray_actor import EngineActor, LoadSnapshot, PollResult, Submit


def _wire(message):
    return pickle.loads(pickle.dumps(message))


def test_stop_token_ids_cross_the_wire_with_the_request():
    sampling = SamplingConfig(stop=["</answer>"], stop_token_ids=[151645, 151643])
    request = SegmentRequest(request_id="q/0#1", context_ids=[1, 2, 3], context_len=3, max_tokens=8,
                             ignore_eos=False, sampling=sampling, sample=None)
    got = _wire(Submit.of(request)).request().sampling
    assert list(got.stop_token_ids) == [151645, 151643] and list(got.stop) == ["</answer>"]


class _Recorder:
    def __init__(self):
        self.ends = []

    def on_tokens(self, *args, **kwargs):
        pass

    def on_segment_end(self, engine, request_id, finish_reason, **kwargs):
        self.ends.append((request_id, finish_reason, kwargs))


class _Ref:
    def __init__(self, value):
        self._future = concurrent.futures.Future()
        self._future.set_result(value)

    def future(self):
        return self._future


class _Method:
    def __init__(self, answer):
        self.answer = answer

    def remote(self, *_):
        return _Ref(self.answer())


def test_a_stop_reason_reaches_the_orchestrators_listener_as_the_engine_gave_it():
    from pdsr_sdk.engines.ray_engine import RayEngine

    spec = EngineSpec(name="e", pool="fast")
    actor = EngineActor(spec, "model", None, 0, "processed_logprobs")   # its engine is never started
    actor.on_segment_end(actor.engine, "a", "stop", stop_reason=151645)
    actor.on_segment_end(actor.engine, "b", "stop", stop_reason="</answer>")
    actor.on_segment_end(actor.engine, "c", "stop")                      # the model's EOS: none
    actor.on_segment_end(actor.engine, "d", "length", speculation=(4, 2))
    polls = [PollResult([], list(actor._ends), None, LoadSnapshot(0, 0, None), 1)]

    engine = RayEngine(spec, model="model")
    recorder = _Recorder()
    engine._listener = recorder

    class Actor:
        def answer(self):
            if not polls:   # everything was handed over: the engine is closing
                engine._closing = True
                return PollResult([], [], None, LoadSnapshot(0, 0, None), 2)
            return _wire(polls.pop(0))

        @property
        def poll(self):
            return _Method(self.answer)

    engine._actor = Actor()
    asyncio.run(asyncio.wait_for(engine._poll_loop(), 30))
    assert recorder.ends == [("a", "stop", {"stop_reason": 151645}), ("b", "stop", {"stop_reason": "</answer>"}),
                             ("c", "stop", {}), ("d", "length", {"speculation": (4, 2)})]
