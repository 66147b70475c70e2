"""A staggered weight update (``update: staggered``) on real vLLM engines: samples of the ending version finish under
its weights on the engines that keep them, which load the update once those samples end (the session's shared
engines, tests/conftest.py)."""

from __future__ import annotations

import pytest

from support import requires_vllm, run_on, weight_blocks
from pdsr_sdk.rollout.config import RolloutConfig
from test_rollout_vllm_steps import stream_records
from test_rollout_vllm_weights import engine_logps, mean_abs, torch_logps
from version_checks import assert_one_version_at_a_time

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s


def test_lagging_engines_finish_under_the_old_weights_then_load_the_update(engine_loop, engines, tiny_model_dir):
    """fp32, greedy, forced lengths; steps of 2 groups with 2 more in flight and a trainer that perturbs the weights
    at each update. After an update, an engine kept for samples of the ending version still holds that version's
    weights (its log-probs of a fixed response), the others the new ones; once it has no such sample left it holds
    the new ones. A sample that ran after the first update under version 0 made exactly the tokens of an
    uninterrupted run under the first weights (it never saw the new ones); no engine ran two versions at once; every
    consumed sample is whole, no token older than S = 2. An update in buckets holds engines back the same way (each
    bucket kept in a block of its own until they have loaded it; before, every engine loaded it at once)."""
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.engines.weights import StagedWeights
    from pdsr_sdk.rollout.session import RolloutSession

    base = dict(model=str(tiny_model_dir), policy="v3", segments={"min_tokens": 16, "max_tokens": 32},
                sampling={"n": 4, "max_tokens": 128, "temperature": 0.0, "ignore_eos": True})
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    torch.manual_seed(3)
    weights, expect = [], [torch_logps(model)]   # per version: its state dict (from 1 on) and its log-probs
    for _ in range(4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
        expect.append(torch_logps(model))

    def version_of(logps):
        return min(range(len(expect)), key=lambda v: mean_abs(logps, expect[v]))

    async def scenario():
        async with RolloutSession(RolloutConfig(**base), engines=engines) as session:
            reference = await session.astep(stream_records(session))
        cfg = RolloutConfig(**base, over_provision=1.0, step_groups=2, max_staleness=2, update="staggered")
        seen = {"steps": [], "held": [], "lagging": [], "versions_after_update": [], "versions_at_end": [],
                "update_times": [], "blocks_after_update": [], "blocks_at_end": []}
        try:
            async with RolloutSession(cfg, engines=engines) as session:
                records = iter(stream_records(session))
                sched = session.scheduler
                for k in range(5):
                    out = await session.astep(records if k == 0 else (), last=k == 4)
                    seen["steps"].append(out)
                    seen["versions_at_end"].append(({e.name: await engine_logps(e) for e in engines},
                                                    dict(sched.lagging())))
                    seen["blocks_at_end"].append(weight_blocks())
                    if k == 4:
                        break
                    seen["held"].append(len(sched.held()))
                    seen["update_times"].append(session.run.clock.now())
                    bucket = 1 << 16 if k == 2 else None   # the third update goes in buckets
                    await session.aupdate_weights(weights[k], bucket_bytes=bucket)
                    seen["lagging"].append(dict(sched.lagging()))
                    seen["blocks_after_update"].append(weight_blocks())
                    seen["versions_after_update"].append({e.name: await engine_logps(e) for e in engines})
                assert not session.carried() and not sched.held() and not sched.lagging()
        finally:   # the shared engines go back to the model folder's weights
            for e in engines:
                await e.update_weights(StagedWeights(folder=str(tiny_model_dir)))
        return reference, seen

    reference, seen = run_on(engine_loop, scenario(), timeout=600)
    ref = {s.key: s for s in reference.samples}
    got = [s for out in seen["steps"] for s in out.samples]
    assert sorted(s.key for s in got) == sorted(ref)
    lagged_updates = [i for i, lag in enumerate(seen["lagging"]) if lag]
    assert lagged_updates, f"no update kept an engine back (held at the step ends: {seen['held']})"
    assert seen["lagging"][2], f"the bucketed update kept no engine back (held: {seen['held'][2]})"
    # its buckets each kept in a block of their own for the engines that load later, freed once none lags
    blocks = seen["blocks_after_update"]
    assert blocks[2] > blocks[1] + 1, blocks
    assert blocks[3] == blocks[1], blocks   # the next update loaded every engine: freed
    if not seen["versions_at_end"][3][1]:   # or sooner, had every held-back engine loaded by the step's end
        assert seen["blocks_at_end"][3] == blocks[1], (seen["blocks_at_end"], blocks)
    for i, lag in enumerate(seen["lagging"]):
        new = i + 1
        for name, logps in seen["versions_after_update"][i].items():
            assert version_of(logps) == (lag[name] if name in lag else new), (i, name)
            if name in lag:
                assert lag[name] == new - 1
        # at the next step's end: an engine no longer lagging has loaded the update
        at_end, still = seen["versions_at_end"][i + 1]
        for name, logps in at_end.items():
            assert version_of(logps) == (still[name] if name in still else new), (i, name)
    first_update = seen["update_times"][0]
    lagged = [s for s in got if any(seg.policy_version == 0 and seg.submit_time_s > first_update
                                    for seg in s.segments)]
    assert lagged, "some sample must go on under version 0 after the first update"
    for s in got:
        assert s.num_generated == ref[s.key].num_generated == len(s.logprobs)
        versions = {seg.policy_version for seg in s.segments if seg.num_tokens}
        if versions == {0}:   # made under the first weights only, lagged or not: as the uninterrupted run
            assert s.token_ids == ref[s.key].token_ids, s.key
    for out in seen["steps"]:
        assert out.summary["max_token_age"] <= 2
    assert_one_version_at_a_time(got)


def test_a_bucketed_update_whose_copy_does_not_fit_loads_every_engine_at_once(engine_loop, engines, tiny_model_dir,
                                                                               monkeypatch):
    """Shared memory without room for a copy of an update sent in buckets (what the engines held back would load
    later): a warning names the sizes and where, and every engine loads the update at once (no engine lags)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.engines.weights import StagedWeights
    from pdsr_sdk.errors import PdsrWarning
    from pdsr_sdk.rollout.session import RolloutSession

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", segments={"min_tokens": 16, "max_tokens": 32},
                        sampling={"n": 4, "max_tokens": 128, "temperature": 0.0, "ignore_eos": True},
                        over_provision=1.0, step_groups=2, max_staleness=2, update="staggered")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=1 << 16))

    async def scenario():
        try:
            async with RolloutSession(cfg, engines=engines) as session:
                await session.astep(stream_records(session))
                held = len(session.scheduler.held())
                with pytest.warns(PdsrWarning, match=r"GiB\) does not fit the 0\.00 GiB free in .*every engine loads"):
                    await session.aupdate_weights(model.state_dict(), bucket_bytes=1 << 16)
                lagging = dict(session.scheduler.lagging())
                await session.astep((), last=True)
        finally:
            for e in engines:
                await e.update_weights(StagedWeights(folder=str(tiny_model_dir)))
        return held, lagging

    held, lagging = run_on(engine_loop, scenario(), timeout=600)
    assert held and lagging == {}
