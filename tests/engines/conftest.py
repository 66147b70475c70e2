"""Fixtures of the tests of engines in Ray actors (tests/engines/test_ray_engine_*.py, test_ray_killed_actors.py):
one local Ray cluster for the session, two engines in its actors and the local greedy reference they are held to.

The cluster and the actors start once, at their first user, and close after the last one
(tests/conftest.py: RELEASED_AFTER_THEIR_LAST_USER; their users run on one xdist worker, SHARED_ENGINES). The
tests that kill an actor sit in test_ray_killed_actors.py, collected after the other users, so that in a whole
run no actor starts twice; run in another order (or alone), the next test gets a fresh actor for a killed one."""

from __future__ import annotations

import asyncio

import pytest

from ray_checks import Collector, greedy_request, replay_config, spec
from support import run_on
from workloads import LENGTHS, write_replay_prompts

#: the engines in Ray actors: (name, pool, the core its engine is pinned to)
ACTORS = (("fast-ray-0", "fast", 0), ("heavy-ray-1", "heavy", 1))


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of 4 logical CPUs (``ray``), the one every Ray test of the session runs on."""
    import ray

    # a cluster of its own, also where `ray start` left one running on this machine (ray.init would join it)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def ray_actors(ray_cluster, engine_loop):
    """The engines in Ray actors by name, started by ``live_ray_engines`` when first asked for (or after a test
    killed one); closed after their last user."""
    held: dict = {}
    yield held
    for engine in held.values():
        run_on(engine_loop, engine.close())


@pytest.fixture()
def live_ray_engines(ray_actors, engine_loop, tiny_model_dir):
    """``live(*names)``: the engines of those names (of ACTORS: ``fast-ray-0`` on core 0, ``heavy-ray-1`` on
    core 1; float32), started where not yet running. A test that loads other weights puts the model folder's
    back before it ends."""
    from pdsr_sdk.engines.ray_engine import RayEngine
    from pdsr_sdk.rollout.config import RayConfig

    async def renew(stale):
        for name in stale:
            old = ray_actors.pop(name, None)
            if old is not None:
                await old.close()
        for name, pool, core in ACTORS:
            if name in stale:
                ray_actors[name] = RayEngine.from_spec(
                    spec(name, pool, backend="ray", max_num_seqs=8, max_model_len=1024, dtype="float32",
                         ray={"env_vars": {"VLLM_CPU_OMP_THREADS_BIND": str(core)}}),
                    model=str(tiny_model_dir), ray=RayConfig(env_vars={"HF_HUB_OFFLINE": "1"}))
        await asyncio.gather(*(ray_actors[name].start() for name in stale))

    def live(*names):
        # a killed actor's engine is dead for good (a RayEngine does not restart): a new one takes its place
        stale = [name for name in names if name not in ray_actors or ray_actors[name].dead]
        if stale:
            run_on(engine_loop, renew(stale))
        return tuple(ray_actors[name] for name in names)

    return live


@pytest.fixture()
def ray_engines(live_ray_engines, vllm_pair):
    """``fast-ray-0`` and ``heavy-ray-1`` in Ray actors and the session's local ``fast-0`` (tests/conftest.py)."""
    return (*live_ray_engines("fast-ray-0", "heavy-ray-1"), vllm_pair[0])


@pytest.fixture(scope="session")
def replay_data(tmp_path_factory):
    return write_replay_prompts(tmp_path_factory.mktemp("ray-data") / "prompts.jsonl")


@pytest.fixture(scope="session")
def reference(vllm_pair, engine_loop, tiny_model_dir, replay_data):
    """Each replay prompt's greedy continuation, generated in one go on the local engine ``fast-0``: tokens by
    prompt id, the prompts' token ids and their records."""
    from pdsr_sdk.rollout.data import load_prompts, load_tokenizer

    local = vllm_pair[0]
    cfg = replay_config(tiny_model_dir, replay_data, "unused.parquet", "baseline")
    records = load_prompts(cfg.data, load_tokenizer(str(tiny_model_dir)), path=replay_data, n=4)
    col = Collector()

    async def go():
        local.bind(col)
        for r in records:
            local.submit(greedy_request(r.prompt_id, r.token_ids, max(LENGTHS[r.prompt_id])))
        await col.wait(lambda: len(col.ends) == len(records))

    run_on(engine_loop, go())
    assert all(col.ends[p] == "length" and len(col.tokens[p]) == max(LENGTHS[p]) for p in LENGTHS)
    return {"tokens": col.tokens, "prompts": {r.prompt_id: r.token_ids for r in records}, "records": records}
