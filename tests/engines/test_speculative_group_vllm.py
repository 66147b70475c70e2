"""Speculative method ``group`` is exact and drafts from finished siblings (issue 50, item 2): real vLLM CPU
engines in float32 on the repetitive variant of the tiny model (built as in test_speculative_vllm.py, whose
helpers this reuses), started once for this module and test_speculative_vllm.py (``speculative_engines`` in
tests/conftest.py): one without speculation (the reference), one with ``group`` and one with ``ngram`` (the same
requests, to compare acceptance).

Each prompt's group runs as pdsr runs a group whose samples finish at different times: the first sample alone
(nothing finished yet: its requests carry no corpus and draft nothing), then its siblings, whose requests carry
its response (``SamplingParams.extra_args``, built by ``VllmEngine`` from ``SegmentRequest.sample.group``).

- greedy: every sample's tokens are the reference's (parting only at a near-tie, as in test_speculative_vllm.py),
  log-probs within 1e-4; the siblings' responses equal the first's, so nearly every drafted token is accepted;
- sampling (temperature 1): drafts are made and accepted, and the streamed log-probs are the reference's scoring
  of the sampled ids.
"""

from __future__ import annotations

import pytest

from support import requires_vllm, run_on
from pdsr_sdk.dispatch.types import LENGTH, SegmentRequest
from pdsr_sdk.rollout.config import SamplingConfig
from pdsr_sdk.rollout.data import PromptRecord, build_groups
from test_speculative_vllm import (LOGPROB_TOL, MAX_TOKENS, PROMPTS, Recorder, check_sampled_logprobs, compare_greedy,
                                   ended, reference_greedy)

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines (started once, shared)

N = 4   # samples per group


@pytest.fixture(scope="module")
def group_engines(speculative_engines):
    """(reference, group, ngram) engines on the repetitive tiny model, float32: the session's
    ``speculative_engines`` (tests/conftest.py, shared with test_speculative_vllm.py), with this module's
    listener."""
    ref, group, ngram = (speculative_engines[name] for name in ("ref-0", "group-0", "ngram-0"))
    recorder = Recorder()
    for e in (ref, group, ngram):
        e.bind(recorder)
    return ref, group, ngram, recorder


async def run_group(engine, recorder: Recorder, tag: str, ids: list[int], temperature: float) -> list[str]:
    """One group of N samples of ``ids``: the first alone, then the rest with its response as their corpus. The
    samples' token ids are kept as the scheduler keeps them (a finished sample's are its siblings' corpus)."""
    g = build_groups([PromptRecord(tag, tag, list(ids))], N, MAX_TOKENS)[0]
    rids = [f"{tag}/{engine.name}/{s.index}" for s in g.samples]

    async def run(samples):
        for s, rid in samples:
            engine.submit(SegmentRequest(request_id=rid, context_ids=s.context_ids(), context_len=len(ids),
                                         max_tokens=MAX_TOKENS, ignore_eos=True,
                                         sampling=SamplingConfig(temperature=temperature), sample=s))
        await ended(recorder, [rid for _, rid in samples])
        for s, rid in samples:
            s.add_tokens(len(recorder.tokens[rid]), recorder.tokens[rid], None)
            s.finish_reason = LENGTH

    pairs = list(zip(g.samples, rids))
    await run(pairs[:1])
    await run(pairs[1:])
    return rids


def spent(engine, before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in engine.speculation_stats().items()}


def run_groups(engine_loop, engine, rec, prompts, temperature):
    before = engine.speculation_stats()
    rids = {tag: run_on(engine_loop, run_group(engine, rec, tag, ids, temperature)) for tag, ids in prompts.items()}
    return rids, spent(engine, before)


def test_group_greedy_is_exact_and_accepts_the_siblings_response(engine_loop, group_engines):
    ref, group, ngram, rec = group_engines
    prompts = {f"greedy-{i}": ids for i, ids in enumerate(PROMPTS)}
    expected = run_on(engine_loop, reference_greedy(ref, {f"ref-{k}": v for k, v in prompts.items()}))
    rids, counts = run_groups(engine_loop, group, rec, prompts, 0.0)
    _, ngram_counts = run_groups(engine_loop, ngram, rec, prompts, 0.0)

    ties, worst, compared = [], 0.0, 0
    for tag, tag_rids in rids.items():
        for rid in tag_rids:
            tie, w, n = compare_greedy(expected[f"ref-{tag}"], rec, rid, "group")
            ties += [tie] if tie else []
            worst, compared = max(worst, w), compared + n
    print(f"\ngreedy: {compared} tokens compared, largest log-prob difference {worst:.3g}; parted at near-ties "
          f"{ties or 'nowhere'}\n  group {counts}\n  ngram {ngram_counts}")
    assert worst <= LOGPROB_TOL
    assert compared >= len(prompts) * N * MAX_TOKENS // 2
    # the siblings repeat the first response: group drafts nearly all of it, and the model accepts what it drafts
    siblings_tokens = len(prompts) * (N - 1) * MAX_TOKENS
    assert counts["accepted_tokens"] >= siblings_tokens // 2, counts
    assert counts["accepted_tokens"] >= 0.9 * counts["drafted_tokens"], counts
    assert counts["accepted_tokens"] > ngram_counts["accepted_tokens"], (counts, ngram_counts)


def test_group_sampling_accepts_drafts_and_reports_the_models_logprobs(engine_loop, group_engines):
    ref, group, ngram, rec = group_engines
    prompts = {f"sample-{i}": ids for i, ids in enumerate(PROMPTS)}
    rids, counts = run_groups(engine_loop, group, rec, prompts, 1.0)
    _, ngram_counts = run_groups(engine_loop, ngram, rec, prompts, 1.0)
    print(f"\nsampling:\n  group {counts}\n  ngram {ngram_counts}")
    assert counts["drafts"] > 0 and counts["drafted_tokens"] >= counts["drafts"]
    assert 0 < counts["accepted_tokens"] <= counts["drafted_tokens"]

    check_sampled_logprobs(engine_loop, ref, rec, [(rid, ids) for tag, ids in prompts.items() for rid in rids[tag]])


def test_drafts_outside_the_vocabulary_never_reach_the_model(engine_loop, group_engines):
    """A history from another tokenizer or model (``--draft-history``, ``pdsr serve``'s requests) can hold ids the
    model does not have: past its vocabulary, or negative. The drafter proposes only the tokens before the first such
    id (an id the model cannot sample is never accepted), so the request runs as without them: the reference's
    greedy tokens, with drafts accepted."""
    ref, group, ngram, rec = group_engines
    ids = PROMPTS[1]
    want = run_on(engine_loop, reference_greedy(ref, {"ref-oov": ids}))["ref-oov"]
    vocab = ref._llm.vllm_config.model_config.get_vocab_size()
    seq = list(ids) + [tok for tok, _, _ in want]
    strange = (vocab + 3, -1)
    g = build_groups([PromptRecord("oov", "oov", list(ids))], 1, MAX_TOKENS)[0]
    # the response with an id the model does not have after every fifth token, eight times (outvoting the row's
    # own context): a window that matches drafts its true next tokens up to such an id, or the id first
    history = [t for j, tok in enumerate(seq[len(ids):]) for t in ([tok] if j % 5 < 4 else [tok, strange[j % 2]])]
    g.draft_responses = [history] * 8
    s, before = g.samples[0], group.speculation_stats()

    async def go():
        group.submit(SegmentRequest(request_id="oov", context_ids=s.context_ids(), context_len=len(ids),
                                    max_tokens=MAX_TOKENS, ignore_eos=True, sampling=SamplingConfig(temperature=0.0),
                                    sample=s))
        await ended(rec, ["oov"])   # the engine did not die

    run_on(engine_loop, go())
    counts = spent(group, before)
    tie, worst, compared = compare_greedy(want, rec, "oov", "group")
    print(f"\nout-of-vocabulary history: {counts}; {compared} tokens as the reference's, parted at {tie}")
    assert worst <= LOGPROB_TOL and compared >= MAX_TOKENS // 2
    assert 0 < counts["accepted_tokens"] <= counts["drafted_tokens"], counts
