"""Speculative decoding under every policy and under partial rollout (issue 50, item 5): rollout sessions on two
real vLLM CPU engines drafting with ``group`` (``group-0`` in the fast pool, ``group-1`` in the heavy pool; the
session's ``speculative_engines``, tests/conftest.py), greedy in float32 on the repetitive tiny model
(test_speculative_vllm.py says why that model).

The policies cut samples into segments, some of which run on the other engine (the printout counts them), and
with partial rollout carry samples across steps and policy versions. A sample's draft corpus is rebuilt at each
segment's launch from its siblings as they stand then (docs/engines.md, "Speculative decoding"), so none of this may
change an output: every sample's tokens are the reference engine's greedy tokens without speculation (parting only at a
near-tie, as in test_speculative_vllm.py), its log-probs within 1e-4 of the reference's, and the engines report
drafted tokens accepted.
"""

from __future__ import annotations

import pytest

from support import requires_vllm, run_on
from pdsr_sdk.policies.resolve import runnable_policies
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.data import PromptRecord
from test_speculative_vllm import LOGPROB_TOL, MAX_TOKENS, PROMPTS, compare_tokens, reference_greedy

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines (started once, shared)

#: per prompt, the forced lengths of its 4 samples (ignore_eos): one long sample holds most groups, so siblings
#: finish while it runs and its later segments draft from them
LENGTHS = [[40, 40, 40, 160], [24, 120, 24, 24], [160, 32, 32, 32], [48, 48, 48, 48], [32, 32, 180, 32],
           [64, 16, 16, 16]]
KEYS = sorted(f"p{i}/{j}" for i in range(len(PROMPTS)) for j in range(4))
TOTAL = sum(map(sum, LENGTHS))   # tokens a run generates
ABORTED = ("moved", "abort", "pause", "engine_dead", "truncated")   # spans the dispatcher cut short


@pytest.fixture(scope="module")
def session_engines(speculative_engines, engine_loop):
    """(the reference's greedy tokens per prompt, the two ``group`` engines)."""
    ref = speculative_engines["ref-0"]
    pair = [speculative_engines["group-0"], speculative_engines["group-1"]]
    want = run_on(engine_loop, reference_greedy(ref, {f"p{i}": ids for i, ids in enumerate(PROMPTS)}))
    return want, pair


def records() -> list[PromptRecord]:
    return [PromptRecord(prompt_id=f"p{i}", text=f"p{i}", token_ids=list(ids), target_lengths=lengths)
            for i, (ids, lengths) in enumerate(zip(PROMPTS, LENGTHS))]


def config(tiny_model_dir, policy: str, **over) -> RolloutConfig:
    # the tiny model's folder gives the tokenizer (the repetitive variant the engines load shares it)
    return RolloutConfig(model=str(tiny_model_dir), policy=policy, speculative="group",
                         segments={"min_tokens": 16, "max_tokens": 32},
                         sampling={"n": 4, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}, **over)


def accepted(engines) -> int:
    return sum(e.speculation_stats()["accepted_tokens"] for e in engines)


def moved(samples) -> int:
    return sum(len({seg.engine for seg in s.segments if seg.num_tokens}) > 1 for s in samples)


def assert_exact(want, samples) -> tuple[list, int]:
    """Every sample's greedy tokens and log-probs against the reference's for its prompt; returns the near-tie
    partings and the tokens compared."""
    ties, compared = [], 0
    for s in samples:
        prompt = s.group.prompt_id
        assert s.num_generated == len(s.token_ids) == LENGTHS[int(prompt[1:])][s.index], s.key
        tie, worst, n = compare_tokens(want[prompt], s.token_ids, s.logprobs, s.key, "group")
        assert worst <= LOGPROB_TOL, (s.key, worst)
        ties += [tie] if tie else []
        compared += n
    return ties, compared


@pytest.mark.parametrize("policy", runnable_policies())
def test_every_policy_with_group_speculation_gives_the_greedy_outputs(policy, engine_loop, session_engines,
                                                                     tiny_model_dir):
    from pdsr_sdk.rollout.session import RolloutSession

    want, engines = session_engines
    before = accepted(engines)

    async def scenario():
        async with RolloutSession(config(tiny_model_dir, policy), engines=engines) as session:
            return await session.astep(records())

    out = run_on(engine_loop, scenario(), timeout=300)
    assert sorted(s.key for s in out.samples) == KEYS
    ties, compared = assert_exact(want, out.samples)
    print(f"\n{policy}: {compared} of {TOTAL} tokens compared, parted at near-ties {ties or 'nowhere'}, "
          f"{accepted(engines) - before} drafted tokens accepted, "
          f"{sum(len(s.segments) for s in out.samples)} segments, {moved(out.samples)} samples ran on both engines")
    assert compared >= TOTAL // 2
    assert accepted(engines) > before
    # each span the engine ran to its end records its drafted and accepted tokens (what `pdsr simulate
    # calibrate` fits a verify step's cost from); an aborted one (moved, stolen) has none from vLLM
    spans = [seg for s in out.samples for seg in s.segments if seg.num_tokens]
    ended = [seg for seg in spans if seg.end_reason not in ABORTED]
    assert ended and all(seg.drafted_tokens is not None for seg in ended)
    # (vLLM counts a last step's accepted tokens even where max_tokens cut them off: calibrate clips the steps)
    assert all(0 <= seg.accepted_tokens <= seg.drafted_tokens for seg in ended)
    counted = sum(seg.accepted_tokens or 0 for seg in spans)
    assert 0 < counted <= accepted(engines) - before


def test_partial_rollout_with_group_speculation_carries_samples_and_gives_the_greedy_outputs(
        engine_loop, session_engines, tiny_model_dir):
    """v3 streaming steps of 2 groups with 2 more in flight, staleness 1, the KV kept across updates: samples are
    carried into the next step and go on under the next version, drafting from siblings that finished in an
    earlier step."""
    from pdsr_sdk.rollout.session import RolloutSession

    want, engines = session_engines
    before = accepted(engines)
    cfg = config(tiny_model_dir, "v3", over_provision=1.0, step_groups=2, max_staleness=1, kv_on_update="keep")

    async def scenario():
        steps, carried = [], set()
        async with RolloutSession(cfg, engines=engines) as session:
            for k in range(3):   # 6 groups, 2 a step
                out = await session.astep(records() if k == 0 else (), last=k == 2)
                steps.append(out)
                carried |= {s.key for s in session.scheduler.held()}
                await session.anext_version()
        return steps, carried

    steps, carried = run_on(engine_loop, scenario(), timeout=300)
    got = [s for out in steps for s in out.samples]
    assert sorted(s.key for s in got) == KEYS
    assert [len(out.groups) for out in steps] == [2, 2, 2]
    assert carried, "some samples must cross a step end"
    crossed = [s for s in got if s.key in carried]
    assert any(len({seg.policy_version for seg in s.segments if seg.num_tokens}) > 1 for s in crossed)
    ties, compared = assert_exact(want, got)
    print(f"\npartial: {len(carried)} samples carried, {moved(got)} ran on both engines, {compared} tokens compared, "
          f"parted at near-ties {ties or 'nowhere'}, {accepted(engines) - before} drafted tokens accepted")
    assert compared >= TOTAL // 2
    assert accepted(engines) > before


def test_a_draft_history_file_is_drafted_from_and_changes_no_output(engine_loop, speculative_engines,
                                                                   session_engines, tiny_model_dir, tmp_path):
    """``--draft-history``: one sample a prompt (no siblings to draft from) on prompts without repeats (nothing in
    the prompt to draft from either), run once without a history and once with a trajectories file holding an
    earlier response to each prompt: the reference's first 32 tokens. The repetitive model soon repeats itself,
    and then drafts from its own output; before that, only the file has drafts, so short responses (LENGTH tokens)
    show the file's share. Drafts from the file are accepted, and the tokens are the reference's either way."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pdsr_sdk.rollout.session import RolloutSession

    _, engines = session_engines
    prompts = {f"h{i}": list(range(40 + 30 * i, 60 + 30 * i)) for i in range(4)}
    want = run_on(engine_loop, reference_greedy(speculative_engines["ref-0"], prompts))
    path = tmp_path / "earlier.parquet"
    pq.write_table(pa.table({"prompt_token_ids": list(prompts.values()),
                             "response_token_ids": [[t for t, _, _ in want[k][:32]] for k in prompts],
                             "finish_reason": ["stop"] * len(prompts)}), path)
    LENGTH = 20
    solo = [PromptRecord(prompt_id=k, text=k, token_ids=ids, target_lengths=[LENGTH]) for k, ids in prompts.items()]
    gained = {}
    for history in (None, str(path)):
        cfg = config(tiny_model_dir, "baseline", speculative_settings={"history_file": history})
        cfg = cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"n": 1})})
        before = accepted(engines)

        async def scenario():
            async with RolloutSession(cfg, engines=engines) as session:
                return await session.astep(solo)

        out = run_on(engine_loop, scenario(), timeout=300)
        gained[history is not None] = accepted(engines) - before
        assert sorted(s.key for s in out.samples) == sorted(f"{k}/0" for k in prompts)
        for s in out.samples:
            assert len(s.token_ids) == LENGTH
            tie, worst, compared = compare_tokens(want[s.group.prompt_id], s.token_ids, s.logprobs, s.key, "group")
            assert worst <= LOGPROB_TOL and compared >= LENGTH // 2, (s.key, tie, worst)
    print(f"\nhistory file: {gained[True]} drafted tokens accepted with it, {gained[False]} without, of "
          f"{LENGTH * len(prompts)} tokens")
    # at most K of every K + 1 tokens after the first come from drafts (each verify step adds one of its own): with
    # the file nearly every draft is accepted once a response's first 4 tokens match it (a corpus place needs the
    # whole window; 58 of 80 when measured); without it, from the first repeat on (47)
    assert gained[True] >= 12 * len(prompts) and gained[True] >= gained[False] + len(prompts)
