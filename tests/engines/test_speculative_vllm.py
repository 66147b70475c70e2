"""Speculative decoding is exact (issue 50, item 2): real vLLM CPU engines on the tiny model in float32, one
without speculation (the reference) and one with ``ngram``, started once for this module and
test_speculative_group_vllm.py (``speculative_engines`` in tests/conftest.py).

- greedy: the same tokens, except that a sample may part from the reference at a position where the
  reference's top two log-probs are within 1e-5 (the tiny random model has near-ties; such positions are
  collected and printed, ``-s`` shows them);
- the engine log-probs of the same ids, with speculation and without, within 1e-4 (trainers use them for
  importance weights);
- sampling (temperature 1): the drafted tokens are verified and some accepted, counted by the engine
  (``VllmEngine.speculation_stats``), and the log-probs streamed for the sampled ids are the reference
  model's log-probs of those ids (scored as a prompt by the engine without speculation). Without pdsr's fix
  of vLLM's CPU sampler (pdsr_sdk/engines/vllm_fixes.py) this part fails: NaN, 0 and -log(1024) log-probs,
  and tokens the model gives e^-33.

n-gram lookup drafts only where the sequence's last n-gram occurred before, and a draft is accepted only where
the model goes on the same way. The built-in tiny model is initialised wide so that its greedy output wanders:
on it ngram drafted 20 tokens over 1200 greedy ones and the model accepted none (measured 2026-11-27), which
would leave the accepted path untested. So the engines load a variant built here from the same config,
tokenizer and seed, initialised narrower (0.04: greedy output repeats a token for a while, then moves on) and
with its final norm scaled by 10 (logits x 10, so that at temperature 1 the top token has ~0.9 of the mass and
sampled outputs repeat too). Greedy argmax is what it would be at any logit scale.
"""

from __future__ import annotations

import asyncio
import math
import shutil
from pathlib import Path

import pytest

from support import WAIT_S, requires_vllm, run_on
from pdsr_sdk.dispatch.types import SegmentRequest
from pdsr_sdk.rollout.config import SamplingConfig
from pdsr_sdk.rollout.data import PromptRecord, build_groups

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines (started once, shared)

PROMPTS = [
    [5, 6, 7, 8, 9] * 8,
    [11, 12, 13] * 10 + [14],
    list(range(20, 36)) * 3,
    [100, 200, 300, 400] * 6 + [100, 200],
    [17, 23, 17, 23, 29] * 5 + [17],
    [300 + i % 7 for i in range(40)],
]
MAX_TOKENS = 200
TIE = 1e-5        # top-two log-probs this close: a legitimate place for the greedy paths to part
LOGPROB_TOL = 1e-4


class Recorder:
    """An EngineListener collecting each request's ids and log-probs."""

    def __init__(self):
        self.tokens: dict[str, list[int]] = {}
        self.logprobs: dict[str, list[float]] = {}
        self.ends: dict[str, str] = {}
        self.speculation: dict[str, tuple[int, int]] = {}
        self.dead: list = []

    def on_tokens(self, engine, rid, n, ids, lps):
        self.tokens.setdefault(rid, []).extend(ids)
        self.logprobs.setdefault(rid, []).extend(lps)

    def on_segment_end(self, engine, rid, reason, *, speculation=None):
        if speculation is not None:
            self.speculation[rid] = speculation
        self.ends[rid] = reason

    def on_engine_dead(self, engine, error):
        self.dead.append(error)


def build_repetitive_model(base: Path, out_dir: Path) -> Path:
    """The tiny model's architecture, tokenizer and seed; initialised at 0.04 and its logits scaled by 10."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shutil.copytree(base, out_dir)
    config = Qwen2Config.from_pretrained(base)
    config.initializer_range = 0.04
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.norm.weight.mul_(10.0)
    model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def engines(speculative_engines):
    """(reference, ngram) engines on the repetitive variant of the tiny model, one core each, float32: two of the
    session's ``speculative_engines`` (tests/conftest.py), with this module's listener."""
    ref, ngram = speculative_engines["ref-0"], speculative_engines["ngram-0"]
    recorder = Recorder()
    for e in (ref, ngram):
        e.bind(recorder)
    return ref, ngram, recorder


async def start_all(*engines) -> None:
    await asyncio.gather(*(e.start() for e in engines))


def request(rid: str, ids: list[int], temperature: float, max_tokens: int = MAX_TOKENS) -> SegmentRequest:
    g = build_groups([PromptRecord(rid, rid, list(ids))], 1, max_tokens)[0]
    return SegmentRequest(request_id=rid, context_ids=list(ids), context_len=len(ids), max_tokens=max_tokens,
                          ignore_eos=True, sampling=SamplingConfig(temperature=temperature), sample=g.samples[0])


async def stream(engine, recorder: Recorder, rids_prompts: dict[str, list[int]], temperature: float) -> None:
    """pdsr's own path: submit, stream DELTA outputs to the listener, wait for every segment's end."""
    for rid, ids in rids_prompts.items():
        engine.submit(request(rid, ids, temperature))
    await ended(recorder, list(rids_prompts))


async def ended(recorder: Recorder, rids: list[str]) -> None:
    """Wait until every request of ``rids`` has ended (no engine dying meanwhile)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + WAIT_S
    while not all(rid in recorder.ends for rid in rids) and not recorder.dead:
        assert loop.time() < end, "engine did not finish in time"
        await asyncio.sleep(0.02)
    assert not recorder.dead, recorder.dead


async def reference_greedy(engine, prompts: dict[str, list[int]]) -> dict[str, list[tuple[int, float, float]]]:
    """The reference's greedy tokens, each with its log-prob and the gap between the top two log-probs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2, detokenize=False)

    async def one(rid, ids):
        final = None
        async for out in engine._llm.generate(TokensPrompt(prompt_token_ids=ids), params, rid):
            final = out
        comp = final.outputs[0]
        steps = []
        for tok, lps in zip(comp.token_ids, comp.logprobs):
            top = sorted((lp.logprob for lp in lps.values()), reverse=True)
            steps.append((tok, lps[tok].logprob, top[0] - top[1]))
        return rid, steps

    return dict(await asyncio.gather(*(one(rid, ids) for rid, ids in prompts.items())))


async def prompt_logprobs(engine, rid: str, ids: list[int], n_prompt: int) -> list[float]:
    """The reference model's log-prob of each of ``ids[n_prompt:]`` given what precedes it (scored as a prompt)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    final = None
    async for out in engine._llm.generate(TokensPrompt(prompt_token_ids=ids), params, rid):
        final = out
    return [final.prompt_logprobs[i][ids[i]].logprob for i in range(n_prompt, len(ids))]


def check_sampled_logprobs(engine_loop, ref, rec, scored: list[tuple[str, list[int]]]) -> None:
    """Each sampled request of ``scored`` ((request id, prompt ids), recorded by ``rec``) ran to MAX_TOKENS, and
    the log-prob it reported for each token is, within LOGPROB_TOL, what the reference engine ``ref`` gives the
    token when it scores the whole trajectory as a prompt."""
    async def rescore():
        return await asyncio.gather(*(prompt_logprobs(ref, f"score-{rid}", ids + rec.tokens[rid], len(ids))
                                      for rid, ids in scored))

    worst = 0.0
    for (rid, ids), want in zip(scored, run_on(engine_loop, rescore())):
        got = rec.logprobs[rid]
        assert rec.ends[rid] == "length" and len(got) == len(want) == MAX_TOKENS
        assert all(math.isfinite(x) and x <= 0 for x in got), (rid, got)
        worst = max(worst, max(abs(a - b) for a, b in zip(got, want)))
        # drawn at the model's temperature: no token the model gives under e^-25 (all 1024 such tokens
        # together: 1.4e-8 a draw); with vLLM's CPU fallback unfixed (vllm_fixes.py) tokens at e^-33 came out
        assert min(want) > -25, (rid, min(want))
    print(f"sampling: largest log-prob difference to the reference's scoring {worst:.3g}")
    assert worst <= LOGPROB_TOL


def compare_greedy(want, rec, rid: str, method: str) -> tuple[tuple[str, int, float] | None, float, int]:
    """Request ``rid``'s greedy tokens (recorded by ``rec``, with ``method``) against the reference's ``want``
    ((token, log-prob, top-two gap) per position): they may part only at a near-tie. Returns (where they parted,
    or None; the largest log-prob difference before that; the positions compared)."""
    assert rec.ends[rid] == "length" and len(rec.tokens[rid]) == len(want) == MAX_TOKENS
    return compare_tokens(want, rec.tokens[rid], rec.logprobs[rid], rid, method)


def compare_tokens(want, got: list[int], got_lps: list[float], name: str,
                   method: str) -> tuple[tuple[str, int, float] | None, float, int]:
    """``got`` (greedy ids with ``method``, and their log-probs) against the reference's first ``len(got)``
    positions of ``want``, as :func:`compare_greedy` compares them."""
    assert len(got) == len(got_lps) <= len(want), (name, len(got), len(got_lps), len(want))
    worst, compared = 0.0, 0
    for pos, ((tok, lp, gap), g, glp) in enumerate(zip(want, got, got_lps)):
        if g != tok:
            assert gap <= TIE, (f"{name}: token {pos} is {g} with {method}, {tok} without, and the reference's top "
                                f"two log-probs are {gap:.3g} apart (more than {TIE})")
            return (name, pos, gap), worst, compared
        worst = max(worst, abs(glp - lp))
        compared += 1
    return None, worst, compared


def test_greedy_outputs_and_logprobs_match_without_speculation(engine_loop, engines):
    ref, ngram, rec = engines
    prompts = {f"greedy-{i}": ids for i, ids in enumerate(PROMPTS)}
    before = ngram.speculation_stats()
    expected = run_on(engine_loop, reference_greedy(ref, {f"ref-{k}": v for k, v in prompts.items()}))
    run_on(engine_loop, stream(ngram, rec, prompts, temperature=0.0))
    after = ngram.speculation_stats()

    ties, worst, compared = [], 0.0, 0
    for rid in prompts:
        tie, w, n = compare_greedy(expected[f"ref-{rid}"], rec, rid, "ngram")
        ties += [tie] if tie else []
        worst, compared = max(worst, w), compared + n
    drafted = after["drafted_tokens"] - before["drafted_tokens"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    print(f"\ngreedy: {compared} tokens compared, largest log-prob difference {worst:.3g}; parted at near-ties "
          f"{ties or 'nowhere'}; drafted {drafted}, accepted {accepted}")
    assert worst <= LOGPROB_TOL
    assert compared >= len(prompts) * MAX_TOKENS // 2     # the comparison is not emptied by early partings
    assert drafted > 0 and 0 < accepted <= drafted         # the speculative path ran, and was used


def test_sampling_accepts_drafts_and_reports_the_models_logprobs(engine_loop, engines):
    ref, ngram, rec = engines
    prompts = {f"sample-{i}-{j}": ids for i, ids in enumerate(PROMPTS) for j in range(2)}
    before = ngram.speculation_stats()
    run_on(engine_loop, stream(ngram, rec, prompts, temperature=1.0))
    after = ngram.speculation_stats()
    delta = {k: after[k] - before[k] for k in after}
    print(f"\nsampling: {delta}")
    assert delta["drafts"] > 0 and delta["drafted_tokens"] >= delta["drafts"]
    assert 0 < delta["accepted_tokens"] <= delta["drafted_tokens"]
    # each request's own counts (its span's drafted / accepted tokens in the trajectories, which
    # `pdsr simulate calibrate` fits a verify step's cost from) add up to the engine's counters
    per_request = [rec.speculation[rid] for rid in prompts]
    assert sum(d for d, _ in per_request) == delta["drafted_tokens"]
    assert sum(a for _, a in per_request) == delta["accepted_tokens"]

    check_sampled_logprobs(engine_loop, ref, rec, list(prompts.items()))


def test_drafting_waits_until_the_batch_has_thinned(engine_loop, engines, speculative_engines):
    """``speculative_settings.max_batch_size``: ``ngram-2`` drafts only while it runs at most 2 sequences (vLLM's
    batch-size schedule, drafting no tokens above it). Six greedy requests, four short: while all six run nothing
    is drafted, once the short ones end the two long ones draft. The tokens are ``ngram-0``'s (no limit), which
    drafts from the start."""
    ref, ngram, rec = engines
    limited = speculative_engines["ngram-2"]
    limited.bind(rec)
    lengths = [24, 24, 24, 24, 120, MAX_TOKENS]

    async def run(engine):
        rids = [f"thin-{engine.name}-{i}" for i in range(len(lengths))]
        for rid, ids, n in zip(rids, PROMPTS, lengths):
            engine.submit(request(rid, ids, 0.0, n))
        await ended(rec, rids)
        return rids

    def drafted(engine):
        before = engine.speculation_stats()["drafted_tokens"]
        rids = run_on(engine_loop, run(engine))
        return rids, engine.speculation_stats()["drafted_tokens"] - before

    full_rids, full = drafted(ngram)
    thin_rids, thin = drafted(limited)
    print(f"\ndrafted tokens: {full} with no limit, {thin} with max_batch_size 2")
    for a, b, n in zip(full_rids, thin_rids, lengths):
        assert rec.tokens[a] == rec.tokens[b] and len(rec.tokens[b]) == n
    assert 0 < thin < full


async def top_k_logprobs(engine, rid: str, ids: list[int], n_prompt: int, k: int, temperature: float) -> list[float]:
    """The log-prob of each of ``ids[n_prompt:]`` in the model's distribution at ``temperature`` cut to its ``k``
    most likely tokens (vLLM's processed log-probs), from the reference's top-k prompt log-probs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=1.0, max_tokens=1, prompt_logprobs=k, detokenize=False)
    final = None
    async for out in engine._llm.generate(TokensPrompt(prompt_token_ids=ids), params, rid):
        final = out
    want = []
    for i in range(n_prompt, len(ids)):
        step = final.prompt_logprobs[i]
        top = sorted((lp.logprob for lp in step.values()), reverse=True)[:k]
        norm = top[0] / temperature + math.log(sum(math.exp((x - top[0]) / temperature) for x in top))
        want.append(step[ids[i]].logprob / temperature - norm)
    return want


def test_sampling_with_top_k_alone_runs_and_reports_the_cut_distribution(engine_loop, engines):
    """Top-k without top-p: vLLM's CPU rejection sampler cuts the drafted positions through ``apply_top_k_only``,
    which failed on an engine step where no request drafted (zero rows: 'max(): Expected reduction dim ...') and
    killed the engine core, until pdsr's fix (vllm_fixes.py). The tokens drawn are among the top k, and their
    log-probs are those of the model's distribution at the temperature cut to its top k."""
    ref, ngram, rec = engines
    k, temperature = 5, 1.5
    prompts = {f"topk-{i}": ids for i, ids in enumerate(PROMPTS[:4])}
    before = ngram.speculation_stats()

    async def sample():
        for rid, ids in prompts.items():
            g = build_groups([PromptRecord(rid, rid, list(ids))], 1, MAX_TOKENS)[0]
            ngram.submit(SegmentRequest(request_id=rid, context_ids=list(ids), context_len=len(ids),
                                        max_tokens=MAX_TOKENS, ignore_eos=True, sample=g.samples[0],
                                        sampling=SamplingConfig(temperature=temperature, top_k=k)))
        await ended(rec, list(prompts))
        return await asyncio.gather(*(top_k_logprobs(ref, f"score-{rid}", ids + rec.tokens[rid], len(ids), k,
                                                     temperature) for rid, ids in prompts.items()))

    wants = run_on(engine_loop, sample())
    accepted = ngram.speculation_stats()["accepted_tokens"] - before["accepted_tokens"]
    worst = 0.0
    for rid, want in zip(prompts, wants):
        got = rec.logprobs[rid]
        assert rec.ends[rid] == "length" and len(got) == len(want) == MAX_TOKENS
        worst = max(worst, max(abs(a - b) for a, b in zip(got, want)))
    print(f"\ntop-k sampling: {accepted} drafted tokens accepted, largest log-prob difference {worst:.3g}")
    assert accepted > 0 and worst <= LOGPROB_TOL
