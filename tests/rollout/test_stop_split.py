"""A stop string that a segment boundary splits ends the sample where vLLM ends it in one request (real engines:
the session's shared fp32 pair, greedy, so a segmented run's tokens equal an unsegmented one's)."""

from __future__ import annotations

import pytest

from segment_checks import SPLIT, WHOLE, records, split_stop
from support import requires_vllm, run_on
from pdsr_sdk.rollout.config import RolloutConfig

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s

MAX_TOKENS = 48


def _records(tok):
    return records(tok, [f"Question {i}: what is {i} times {i + 3}?" for i in range(4)])


def test_a_stop_string_split_by_a_segment_boundary_ends_the_sample_as_one_request_does(engine_loop, engines,
                                                                                       tiny_model_dir):
    from pdsr_sdk.rollout.session import RolloutSession

    def config(segments, stop):
        return RolloutConfig(model=str(tiny_model_dir), policy="baseline", segments=segments,
                             sampling={"n": 1, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
                                       "stop": stop})

    async def run(segments, stop):
        async with RolloutSession(config(segments, stop), engines=engines) as session:
            out = await session.astep(_records(session.tokenizer))
            return {s.key: s for s in out.samples}, session.tokenizer

    free, tok = run_on(engine_loop, run(WHOLE, []), timeout=300)
    stops = {key: split_stop(tok, s.token_ids) for key, s in free.items()}
    stop = next((v for v in stops.values() if v), None)
    assert stop, f"no response of the tiny model has a stop string across a boundary: {stops}"
    one_request, _ = run_on(engine_loop, run(WHOLE, [stop]), timeout=300)       # vLLM finds it itself
    segmented, _ = run_on(engine_loop, run(SPLIT, [stop]), timeout=300)
    hit = [key for key, v in stops.items() if v == stop]
    for key in hit:
        assert one_request[key].finish_reason == "stop" and one_request[key].num_generated < MAX_TOKENS
        assert len(segmented[key].segments) > 1
    for key, ref in one_request.items():   # every sample, split stop or not, as in one request
        got = segmented[key]
        assert got.token_ids == ref.token_ids, key
        assert got.finish_reason == ref.finish_reason and len(got.logprobs) == len(ref.logprobs), key
