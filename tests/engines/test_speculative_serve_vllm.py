"""``pdsr serve`` with ``--speculative group`` on a real vLLM engine drafting with pdsr's group proposer (``group-0``
of the session's ``speculative_engines``, tests/conftest.py; greedy in float32 on the repetitive tiny model,
test_speculative_vllm.py says why that model): a request's group drafts from the earlier responses to its prompt
(docs/engines.md, "Speculative decoding"). Served through the ``openai`` client, a second request for a prompt
drafts from the first one's response (and accepts more drafted tokens than the first did), and both are the
reference engine's greedy tokens without speculation. The history's plumbing on fake engines:
tests/rollout/test_serve_turns.py."""

from __future__ import annotations

import pytest

from support import WAIT_S, requires_vllm, run_on, serving
from test_speculative_vllm import LOGPROB_TOL, MAX_TOKENS, PROMPTS, compare_tokens, reference_greedy

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines (started once, shared)

openai = pytest.importorskip("openai")


def test_a_served_request_drafts_from_the_earlier_response_to_its_prompt(engine_loop, speculative_engines,
                                                                       tiny_model_dir):
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    want = run_on(engine_loop, reference_greedy(speculative_engines["ref-0"],
                                                {f"p{i}": ids for i, ids in enumerate(PROMPTS)}))
    group = speculative_engines["group-0"]
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="baseline", speculative="group",
                        sampling={"max_tokens": MAX_TOKENS, "temperature": 0.0})
    session = RolloutSession(cfg, engines=[group])
    done: list = []
    session.hooks.on_group_done.append(done.append)
    with serving(session, engine_loop) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="none", max_retries=0, timeout=WAIT_S)
        # one request at a time, each prompt twice: the second finds the first's response in the history
        answers = [client.completions.create(model="tiny", prompt=ids, max_tokens=MAX_TOKENS).choices[0]
                   for ids in PROMPTS for _ in range(2)]
    assert [a.finish_reason for a in answers] == ["length"] * 2 * len(PROMPTS)
    samples = [g.samples[0] for g in done]
    firsts, seconds = samples[0::2], samples[1::2]
    # each prompt's first request has no earlier response; its second has the first's (and no other prompt's)
    assert [g.draft_responses for g in done] == [r for f in firsts for r in ([], [f.token_ids])]
    for i, s in enumerate(samples):   # drafting changes no output: the reference's greedy tokens and log-probs
        _, worst, compared = compare_tokens(want[f"p{i // 2}"], s.token_ids, s.logprobs, s.key, "group")
        assert worst <= LOGPROB_TOL and compared >= MAX_TOKENS // 2, (s.key, worst, compared)

    def accepted(group):
        return sum(seg.accepted_tokens for s in group for seg in s.segments)
    # the earlier response is the exact continuation: more drafts accepted with it than from the row's own
    # context alone (measured: 949 against 908 tokens of 1200, more for every prompt)
    assert accepted(seconds) > accepted(firsts)
