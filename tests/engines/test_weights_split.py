"""A one-block update_weights that one real engine fails while the other loads it leaves the engines on different
weights: the error names both, and the session refuses to generate until a whole update, as after a bucketed update
stopped part-way (tests/engines/test_weights_buckets.py). An update every engine fails changed nothing and marks
nothing. A bucketed update's error names the engine that failed its bucket."""

from __future__ import annotations

import pytest

from support import requires_torch, requires_vllm, run_on
from test_weights_buckets import engine_logps, torch_logps
from pdsr_sdk.errors import EngineError, RunError

pytestmark = requires_torch


def failing_loads(llm):
    """``llm.collective_rpc`` (a real engine's AsyncLLM) with its weight loads failing inside the engine's own
    update path; every other call goes through."""
    real = llm.collective_rpc

    async def rpc(method, *args, **kw):
        if method == "pdsr_load_weights":
            raise RuntimeError("the worker's load failed (injected)")
        return await real(method, *args, **kw)
    return rpc


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_an_update_one_engine_fails_marks_the_engines_out_of_step(engine_loop, vllm_pair, tiny_model_dir,
                                                                  monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    torch.manual_seed(5)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    new, sd = torch_logps(policy), policy.state_dict()
    fast, heavy = vllm_pair
    cfg = RolloutConfig(model=str(tiny_model_dir), batch_size=1, policy="baseline", sampling={"n": 1, "max_tokens": 4})

    async def scenario():
        got = {}
        async with RolloutSession(cfg, engines=vllm_pair) as session:
            got["old"] = [await engine_logps(e) for e in vllm_pair]
            for e in vllm_pair:   # every engine fails: nothing loaded, nothing marked, steps go on
                monkeypatch.setattr(e._llm, "collective_rpc", failing_loads(e._llm))
            with pytest.raises(EngineError, match=r"injected\)$"):
                await session.aupdate_weights(sd)
            got["all_failed"] = ([await engine_logps(e) for e in vllm_pair],
                                 (await session.astep(["Hi"])).policy_version)
            monkeypatch.undo()
            monkeypatch.setattr(heavy._llm, "collective_rpc", failing_loads(heavy._llm))
            with pytest.raises(EngineError) as info:
                await session.aupdate_weights(sd)
            got["error"] = str(info.value)
            got["split"] = [await engine_logps(e) for e in vllm_pair]
            got["version"] = session.policy_version
            for call in (lambda: session.astep(["Hi"]), session.anext_version):
                with pytest.raises(RunError) as refused:
                    await call()
                got.setdefault("refused", []).append(str(refused.value))
            await session.apause("abort")
            with pytest.raises(RunError, match="partial weight update"):
                await session.aresume()
            monkeypatch.undo()
            got["whole"] = await session.aupdate_weights(sd)
            await session.aresume()
            got["after"] = [await engine_logps(e) for e in vllm_pair]
            got["step"] = (await session.astep(["Hi"])).policy_version
            await session.aupdate_weights(tiny_model_dir)    # the shared engines get their weights back
            got["restored"] = [await engine_logps(e) for e in vllm_pair]
        return got

    got = run_on(engine_loop, scenario(), timeout=600)
    assert got["all_failed"] == (got["old"], 0)
    assert got["error"] == ("engine 'heavy-0': update_weights failed: RuntimeError: the worker's load failed "
                            "(injected) (engine(s) 'heavy-0' failed this update and 'fast-0' loaded it: the engines "
                            "now hold different weights, and the session refuses to generate until an update_weights "
                            "completes)")
    # what the mark is for: fast-0 holds the new weights (the trainer's log-probs), heavy-0 the old ones
    assert max(abs(a - b) for a, b in zip(got["split"][0], new)) <= 1e-3
    assert got["split"][1] == got["old"][1] and max(abs(a - b) for a, b in zip(new, got["old"][1])) > 0.05
    assert got["version"] == 0
    for what, msg in zip(("step", "next_version"), got["refused"]):
        assert msg == (f"{what}: the engines hold a partial weight update (an update_weights stopped part-way: "
                       f"engine(s) 'heavy-0' failed this update and 'fast-0' loaded it: the engines now hold different "
                       f"weights); call update_weights with the whole model first")
    assert got["whole"] == 1 and got["step"] == 1
    assert got["after"][1] == got["after"][0] == got["split"][0]
    assert got["restored"] == got["old"]


def test_a_bucket_error_names_the_engine_that_failed_it(tiny_model_dir, tiny_weights):
    from test_weights_partial import LoadingEngine, loading_session

    sd = tiny_weights[0]
    engines = [LoadingEngine("fast-0", "fast", None, fail_at=1), LoadingEngine("heavy-0", "heavy", None)]
    with loading_session(tiny_model_dir, engines, sampling={"max_tokens": 8}) as session:
        with pytest.raises(EngineError) as info:
            session.update_weights(sd, bucket_bytes=1 << 20)
        with pytest.raises(RunError) as refused:
            session.step(["a"])
    note = ("the engines had loaded up to 2 bucket(s) of this update: they now hold a partial update, engine(s) "
            "'fast-0' having failed bucket 1")
    assert str(info.value) == (f"engine 'fast-0': update_weights: bucket 1 failed here ({note}, and the session "
                               f"refuses to generate until an update_weights completes)")
    assert str(refused.value) == (f"step: the engines hold a partial weight update (an update_weights stopped "
                                  f"part-way: {note}); call update_weights with the whole model first")
