"""Weights into engines in Ray actors (``fast-ray-0``, ``heavy-ray-1``: tests/engines/conftest.py) beside the local
``fast-0``: through Ray's object store in one block and in buckets (tests/engines/test_weights_buckets.py: the
buckets themselves, on local engines), and a pause ('keep', 'abort') around an update. Every test puts the model
folder's weights back before it ends."""

from __future__ import annotations

import asyncio
import time

import pytest

from ray_checks import engine_test, greedy_continuations, replay_config
from support import WAIT_S, run_on
from pdsr_sdk.errors import DataValueError, EngineError
from workloads import LENGTHS


@engine_test
def test_update_weights_reaches_ray_engines_through_the_object_store(ray_engines, reference, engine_loop,
                                                                    tiny_model_dir):
    """New weights go to both actors (Ray's object store) and the local engine (shared memory): greedy
    continuations then agree with each other and differ from the old weights'; a bad shape is refused
    inside the actor with the engine's name and node; an actor's prefix cache is reset on request
    (``next_version``) and a load may keep it (``kv_on_update: keep``); the model folder restores the old
    weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.engines.weights import StagedWeights
    from pdsr_sdk.rollout.session import RolloutSession

    ray0, ray1, local = ray_engines
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    torch.manual_seed(2)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    prompt = reference["prompts"]["p0"]
    cfg = replay_config(tiny_model_dir, "unused.jsonl", "unused.parquet", "baseline")

    async def greedy(tag):
        return await greedy_continuations((ray0, ray1, local), tag, prompt, 30)

    async def go():
        async with RolloutSession(cfg, engines=[ray0, ray1, local]) as session:
            assert await session.aupdate_weights(policy.state_dict()) == 1
            updated = await greedy("new")
            bad = dict(policy.state_dict())
            bad["model.norm.weight"] = torch.ones(5)
            staged = StagedWeights(items=list(bad.items()))
            with pytest.raises(EngineError, match=r"engine 'heavy-ray-1'.*'model\.norm\.weight' has shape \[5\].*in "
                                                  r"its Ray actor on node") as info:
                await ray1.update_weights(staged)
            staged.close()
            assert "Traceback" not in str(info.value).split("--- engine traceback ---")[0]
            # the prefix cache through the actor: reset it (a weightless update under kv_on_update recompute),
            # and a load that keeps it (keep)
            assert await session.anext_version() == 2
            folder = StagedWeights(folder=str(tiny_model_dir))
            await ray0.update_weights(folder, reset_prefix_cache=False)
            assert await session.aupdate_weights(str(tiny_model_dir)) == 3
            restored = await greedy("old")
        return updated, restored

    updated, restored = run_on(engine_loop, go())
    ref = reference["tokens"]["p0"][:30]
    assert updated[0] == updated[1] == updated[2] != ref
    assert restored == [ref, ref, ref]


@engine_test
def test_pause_keep_and_abort_on_ray_engines_keep_every_sample_and_its_greedy_tokens(
        ray_engines, reference, engine_loop, tiny_model_dir):
    """session.pause('keep') freezes the actors' requests (no token while paused) and pause('abort') holds
    the running samples; after a weight update (the model folder again) and resume, every sample equals
    the local greedy reference, and segments after the update carry the new version. sleep() names the
    CPU build."""
    from pdsr_sdk.errors import UnsupportedError
    from pdsr_sdk.rollout.session import RolloutSession

    ray0, ray1, _ = ray_engines
    cfg = replay_config(tiny_model_dir, "unused.jsonl", "unused.parquet", "baseline")
    records = reference["records"]

    async def go():
        out = {}
        async with RolloutSession(cfg, engines=[ray0, ray1]) as session:
            sched = session.scheduler
            with pytest.raises(UnsupportedError, match=r"fast-ray-0: vLLM's CPU build cannot free engine memory"):
                await session.asleep()
            for mode in ("keep", "abort"):
                # at least half the slots running, each with a few tokens (waiting for all 16 at once missed
                # its ~0.1 s window on a loaded machine: the 8-token samples finish and the last ones start);
                # a loaded machine can also run a whole step between two polls, so a missed window runs the
                # step again
                for _ in range(5):
                    task = asyncio.ensure_future(session.astep(records))
                    end = time.monotonic() + WAIT_S
                    while not task.done() and not (len(sched.running()) >= 8
                                                   and all(s.num_generated >= 4 for s in sched.running())):
                        assert time.monotonic() < end
                        await asyncio.sleep(0.005)
                    if not task.done():
                        break
                    await task
                else:
                    pytest.fail(f"{mode}: five steps each ended before 8 samples ran with 4 tokens")
                running = set(sched.running())
                await session.apause(mode)
                generated = {s: s.num_generated for s in running}
                await asyncio.sleep(0.5)
                later = {s: s.num_generated for s in running}
                version = await session.aupdate_weights(str(tiny_model_dir))
                await session.aresume()
                out[mode] = (running, generated, later, version, await asyncio.wait_for(task, 300))
        return out

    out = run_on(engine_loop, go())
    for mode, (running, generated, later, version, result) in out.items():
        assert generated == later, mode            # nothing generated while paused
        assert len(result.samples) == 20
        for s in result.samples:
            want = LENGTHS[s.group.prompt_id][s.index]
            assert s.num_generated == len(s.token_ids) == len(s.logprobs) == want, (mode, s.key)
            assert s.token_ids == reference["tokens"][s.group.prompt_id][:want], (mode, s.key)
        # the running samples' segments: the old version up to the pause, the new one after it
        assert any(seg.end_reason == "pause" for s in running for seg in s.segments), mode
        for s in running:
            versions = [seg.policy_version for seg in s.segments if seg.num_tokens]
            assert versions == sorted(versions) and set(versions) <= {version - 1, version}, (mode, s.key)
        assert any(seg.policy_version == version for s in running for seg in s.segments if seg.num_tokens), mode


@engine_test
def test_a_bucketed_update_reaches_a_ray_engine_as_one_block_does(engine_loop, live_ray_engines, vllm_pair,
                                                                  tiny_model_dir):
    """The Ray engine and the local one continue a prompt greedily alike after a one-block update and after the
    same weights in buckets of a few tensors (an iterator), and not as before; an iterator whose last bucket is
    bad leaves a partial update (ended in the actor too), which a whole update repairs."""
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    engines = (*live_ray_engines("heavy-ray-1"), vllm_pair[0])
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    torch.manual_seed(4)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    sd = policy.state_dict()
    few = 3 * max(t.numel() * t.element_size() for t in sd.values())
    prompt = [5, 17, 250, 3, 99, 42, 7, 600]
    cfg = RolloutConfig(model=str(tiny_model_dir), batch_size=1, policy="baseline")

    async def greedy(tag):
        return await greedy_continuations(engines, tag, prompt, 24)

    async def go():
        got = {}
        async with RolloutSession(cfg, engines=list(engines)) as session:
            got["old"] = await greedy("old")
            await session.aupdate_weights(sd)
            got["one_block"] = await greedy("one")
            await session.aupdate_weights(str(tiny_model_dir))
            await session.aupdate_weights(iter(sd.items()), bucket_bytes=few)
            got["buckets"] = await greedy("buckets")
            bad = [*((n, t) for n, t in sd.items() if n != "model.norm.weight"), ("model.norm.weight", torch.ones(5))]
            with pytest.raises(DataValueError, match="partial update"):
                await session.aupdate_weights(iter(bad), bucket_bytes=few)
            await session.aupdate_weights(sd, bucket_bytes=few)
            got["repaired"] = await greedy("repaired")
            await session.aupdate_weights(str(tiny_model_dir))   # the shared local engine gets its weights back
        return got

    got = run_on(engine_loop, go(), timeout=600)
    assert got["old"][0] == got["old"][1]
    assert got["one_block"][0] == got["one_block"][1] != got["old"][0]
    assert got["buckets"] == got["one_block"] == got["repaired"]
