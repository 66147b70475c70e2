"""Sampling options verl and vLLM users set (stop_token_ids, ...) on real engines, with small segments and with one
request per sample: the session's shared fp32 pair, greedy, so a segmented run's tokens equal an unsegmented one's,
and each is checked against a reference cut from a run without the option."""

from __future__ import annotations

import pytest

from segment_checks import SEGMENT, SPLIT, WHOLE, records, split_stop
from support import requires_vllm, run_on
from pdsr_sdk.rollout.config import RolloutConfig

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s

MAX_TOKENS = 40


def _records(tok):
    return records(tok, [f"Question {i}: what is {i} plus {2 * i + 5}?" for i in range(4)])


def _run(engine_loop, engines, model_dir, segments, **sampling):
    """The samples by key; each's row of the step's table (the trajectories schema) is ``sample.row``."""
    from pdsr_sdk.rollout.session import RolloutSession

    config = RolloutConfig(model=str(model_dir), policy="baseline", segments=segments,
                           sampling={"n": 1, "max_tokens": MAX_TOKENS, "temperature": 0.0, **sampling})

    async def run():
        async with RolloutSession(config, engines=engines) as session:
            out = await session.astep(_records(session.tokenizer))
            rows = {f"{r['prompt_id']}/{r['sample_index']}": r for r in out.table.to_pylist()}
            for s in out.samples:
                s.row = rows[s.key]
            return {s.key: s for s in out.samples}
    return run_on(engine_loop, run(), timeout=300)


def _cut(token_ids, stop_ids):
    """The response up to and including its first stop token (vLLM keeps it), and whether it has one."""
    for i, t in enumerate(token_ids):
        if t in stop_ids:
            return token_ids[:i + 1], True
    return token_ids, False


def _later_token(samples):
    """A token id first sampled past the first segment (so a continuation request meets it)."""
    for s in samples.values():
        for i, t in enumerate(s.token_ids):
            if i >= SEGMENT and t not in s.token_ids[:i]:
                return t
    return None


def test_stop_token_ids_end_a_sample_where_their_token_is_sampled_in_any_segment(engine_loop, engines,
                                                                                 tiny_model_dir):
    free = _run(engine_loop, engines, tiny_model_dir, WHOLE)
    stop_id = _later_token(free)
    assert stop_id is not None, {k: s.token_ids for k, s in free.items()}
    other = 0 if stop_id != 0 else 1   # a second id never sampled: a list of several is read as a set
    whole = _run(engine_loop, engines, tiny_model_dir, WHOLE, stop_token_ids=[other, stop_id])
    split = _run(engine_loop, engines, tiny_model_dir, SPLIT, stop_token_ids=[other, stop_id])
    hits = 0
    for key, ref in free.items():
        want, hit = _cut(ref.token_ids, {stop_id, other})
        for got in (whole[key], split[key]):
            assert got.token_ids == want and got.finish_reason == ("stop" if hit else ref.finish_reason), key
            # which stop ended it: the token id (vLLM's stop_reason), in the table as its digits
            assert got.stop_reason == (stop_id if hit else ref.stop_reason), key
            assert got.row["stop_reason"] == (None if got.stop_reason is None else str(got.stop_reason))
            assert len(got.logprobs) == len(got.token_ids)
        hits += hit and len(split[key].segments) > 1
    assert hits, "no sample met its stop token in a continuation"
    # extra EOS ids: ignore_eos ignores them as it ignores the model's EOS (a forced-length replay runs to its length)
    past_eos = _run(engine_loop, engines, tiny_model_dir, WHOLE, ignore_eos=True)
    ignored = _run(engine_loop, engines, tiny_model_dir, SPLIT, stop_token_ids=[stop_id], ignore_eos=True)
    assert {k: s.token_ids for k, s in ignored.items()} == {k: s.token_ids for k, s in past_eos.items()}
    assert all(len(s.token_ids) == MAX_TOKENS for s in ignored.values())


def test_stop_reason_names_the_stop_string_vllm_or_a_segment_boundary_check_found(engine_loop, engines,
                                                                                   tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    free = _run(engine_loop, engines, tiny_model_dir, WHOLE, ignore_eos=True)
    stops = {key: split_stop(tok, s.token_ids) for key, s in free.items()}
    stop = next((v for v in stops.values() if v), None)
    assert stop, f"no response of the tiny model has a stop string across a boundary: {stops}"
    decoy = "\x00never"   # a second stop string that never occurs: the reason is the one that matched
    whole = _run(engine_loop, engines, tiny_model_dir, WHOLE, ignore_eos=True, stop=[decoy, stop])
    split = _run(engine_loop, engines, tiny_model_dir, SPLIT, ignore_eos=True, stop=[decoy, stop])
    for key, ref in whole.items():
        got = split[key]
        assert got.token_ids == ref.token_ids and got.finish_reason == ref.finish_reason, key
        assert ref.stop_reason == (stop if ref.finish_reason == "stop" else None), key
        assert got.stop_reason == ref.stop_reason and got.row["stop_reason"] == ref.stop_reason, key
    assert all(split[key].stop_reason == stop and len(split[key].segments) > 1
               for key, v in stops.items() if v == stop)


def test_repetition_penalty_is_the_same_in_segments_as_in_one_request(engine_loop, engines, tiny_model_dir):
    # vLLM counts a request's prompt tokens too, and a continuation's prompt holds the response so far
    plain = _run(engine_loop, engines, tiny_model_dir, WHOLE, ignore_eos=True)
    whole = _run(engine_loop, engines, tiny_model_dir, WHOLE, ignore_eos=True, repetition_penalty=1.5)
    split = _run(engine_loop, engines, tiny_model_dir, SPLIT, ignore_eos=True, repetition_penalty=1.5)
    assert {k: s.token_ids for k, s in whole.items()} != {k: s.token_ids for k, s in plain.items()}
    for key, ref in whole.items():
        assert split[key].token_ids == ref.token_ids and len(split[key].segments) > 1, key


def test_min_p_shapes_the_distribution_the_recorded_logprobs_are_of(engine_loop, engines, tiny_model_dir):
    # min_p 1 keeps only the most likely token: sampling at temperature 1 is then greedy, and the recorded
    # (processed) log-prob of every token is that of a one-token distribution, 0, where without min_p it is not
    greedy = _run(engine_loop, engines, tiny_model_dir, WHOLE, ignore_eos=True)
    free = _run(engine_loop, engines, tiny_model_dir, WHOLE, ignore_eos=True, temperature=1.0)
    kept = _run(engine_loop, engines, tiny_model_dir, SPLIT, ignore_eos=True, temperature=1.0, min_p=1.0)
    assert {k: s.token_ids for k, s in kept.items()} == {k: s.token_ids for k, s in greedy.items()}
    assert all(lp == pytest.approx(0.0, abs=1e-5) for s in kept.values() for lp in s.logprobs)
    assert min(lp for s in free.values() for lp in s.logprobs) < -1.0
