"""update_weights in buckets into a Ray engine (each bucket through Ray's object store) beside a local one
(tests/engines/test_weights_buckets.py: the buckets themselves, on local engines)."""

from __future__ import annotations

import pytest

from support import requires_ray, requires_torch, requires_vllm, run_on
from pdsr_sdk.errors import DataValueError

pytestmark = [requires_torch, requires_ray, requires_vllm, pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_engine(engine_loop, tiny_model_dir):
    """A Ray cluster of its own and one engine in a Ray actor (core 1, pool heavy, float32)."""
    import ray

    from pdsr_sdk.engines.ray_engine import RayEngine
    from pdsr_sdk.rollout.config import EngineSpec, RayConfig

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    engine = RayEngine.from_spec(
        EngineSpec(name="heavy-ray-0", pool="heavy", backend="ray", max_num_seqs=8, max_model_len=1024,
                   dtype="float32", ray={"env_vars": {"VLLM_CPU_OMP_THREADS_BIND": "1"}}),
        model=str(tiny_model_dir), ray=RayConfig(env_vars={"HF_HUB_OFFLINE": "1"}))
    try:
        run_on(engine_loop, engine.start())
        yield engine
    finally:
        run_on(engine_loop, engine.close())
        ray.shutdown()


def test_a_bucketed_update_reaches_a_ray_engine_as_one_block_does(engine_loop, vllm_pair, ray_engine,
                                                                  tiny_model_dir):
    """The Ray engine and the local one continue a prompt greedily alike after a one-block update and after the
    same weights in buckets of a few tensors (an iterator), and not as before; an iterator whose last bucket is
    bad leaves a partial update (ended in the actor too), which a whole update repairs."""
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession
    from test_ray_engine import Collector, _request

    local = vllm_pair[0]
    engines = (ray_engine, local)
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
        col = Collector()
        for e in engines:
            e.bind(col)
            e.submit(_request(f"{tag}-{e.name}", prompt, 24))
        await col.wait(lambda: len(col.ends) == 2)
        return [col.tokens[f"{tag}-{e.name}"] for e in engines]

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
