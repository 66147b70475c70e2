"""A trainer's mistakes on a session with real vLLM engines (CPU build, tiny model): bad prompts, a bad ``n``,
a policy version going back. Each is a clear error naming what is wrong, and the session goes on serving."""

from __future__ import annotations

import re

import pytest

from support import requires_vllm, run_on
from pdsr_sdk.errors import DataError
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.data import PromptRecord

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines (the shared vllm_pair)


def config(tiny_model_dir, **kw) -> RolloutConfig:
    return RolloutConfig(model=str(tiny_model_dir), batch_size=2, policy="baseline",
                         sampling={"n": 2, "max_tokens": 16}, segments={"min_tokens": 8, "max_tokens": 16}, **kw)


def finished_in_full(out, prompts: int) -> bool:
    return len(out.samples) == 2 * prompts and all(s.finish_reason in ("stop", "length") and s.token_ids
                                                   for s in out.samples)


def test_a_prompt_the_engines_would_refuse_is_an_error_naming_it_and_the_session_goes_on(
        engine_loop, engines, tiny_model_dir):
    """No token ids, an id out of the vocabulary, a prompt past the engines' context: a DataError naming the
    prompt (and, for the context, the setting that sets it) before anything reaches an engine; the next step
    runs as if nothing happened."""
    from pdsr_sdk.rollout.session import RolloutSession

    bad = [([], r"step 0: prompt 'e': token_ids must be a non-empty list"),
           ([10**7], r"prompt 'e': token id 10000000 is out of the vocabulary \(ids 0 to 1023\)"),
           ([5, -1], r"prompt 'e': token id -1 is out of the vocabulary"),
           ([5, "6"], r"prompt 'e': token_ids must be ints; got '6' \(str\)"),
           ([5] * 5000, r"prompt 'e': 5000 prompt tokens \+ 16 response tokens \(sampling.max_tokens\) = 5016 exceed "
                        r"the engines' context of 1024 tokens \(the max_model_len of engine 'fast-0'")]

    async def scenario():
        async with RolloutSession(config(tiny_model_dir), engines=engines) as session:
            for ids, match in bad:
                with pytest.raises(DataError, match=match):
                    await session.astep([PromptRecord("e", "", ids), "Hi"])
            return await session.astep(["What is 2 + 3?", PromptRecord("mine", "", [5] * 1008)])

    assert finished_in_full(run_on(engine_loop, scenario()), 2)


def test_a_request_an_engine_refuses_fails_its_sample_not_the_engine(engine_loop, engines, tiny_model_dir):
    """What a check misses and vLLM refuses (its validation at add_request) fails that request's samples
    (finish reason ``failed``, the error naming the engine and vLLM's reason, no reward), not the engine: the
    step's other group completes, and so does the next step."""
    from pdsr_sdk.rollout.session import RolloutSession

    async def scenario():
        async with RolloutSession(config(tiny_model_dir), engines=engines) as session:
            session._check_prompts = lambda records: None   # as if the session's own check missed it
            out = await session.astep([PromptRecord("oov", "", [10**7]), "Hi"])
            return out, await session.astep(["What is 2 + 3?"])

    out, after = run_on(engine_loop, scenario())
    failed = [s for s in out.samples if s.group.prompt_id == "oov"]
    assert len(failed) == 2 and all(s.finish_reason == "failed" and not s.token_ids for s in failed)
    assert all(s.error.startswith("engine '") and "refused request" in s.error
               and "VLLMValidationError: Token id 10000000 is out of vocabulary" in s.error for s in failed)
    rows = {r["prompt_id"]: r for r in out.table.to_pylist()}
    assert rows["oov"]["finish_reason"] == "failed" and rows["oov"]["reward"] is None
    assert "out of vocabulary" in rows["oov"]["error"]
    assert all(s.finish_reason in ("stop", "length") and s.token_ids for s in out.samples if s not in failed)
    assert finished_in_full(after, 1)


def test_a_weights_version_must_go_up(engine_loop, engines, tiny_model_dir):
    """``update_weights(..., version=v)``: v must be an int above the current version; a lower or equal one (or
    not an int) is a ConfigValueError naming both, raised before the weights are even read (here weights that
    would be refused), so nothing is loaded and the version stays."""
    from pdsr_sdk.errors import ConfigValueError
    from pdsr_sdk.rollout.session import RolloutSession

    async def scenario():
        async with RolloutSession(config(tiny_model_dir), engines=engines) as session:
            assert await session.aupdate_weights(str(tiny_model_dir), version=100) == 100
            for version in (5, -3, 100, "101", 100.5, True):
                with pytest.raises(ConfigValueError, match=rf"update_weights: version must be an int greater than "
                                                           rf"the current policy version 100; got "
                                                           rf"{re.escape(repr(version))} \(nothing was loaded\)"):
                    await session.aupdate_weights({"not.a.parameter": None}, version=version)
                assert session.policy_version == 100
            assert await session.anext_version() == 101
            assert await session.aupdate_weights(str(tiny_model_dir)) == 102
            out = await session.astep(["Hi"])
            return out

    out = run_on(engine_loop, scenario())
    assert finished_in_full(out, 1) and all(seg.policy_version == 102 for s in out.samples for seg in s.segments)
