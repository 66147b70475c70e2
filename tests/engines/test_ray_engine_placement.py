"""Engines as Ray actors (backend ``ray``) on the session's local Ray cluster (tests/engines/conftest.py), before
any engine runs: an engine Ray cannot place, and the automatic layout of a config with a Ray section.

The Ray section of the config, the layout and the message when Ray is not installed: test_ray_config.py."""

from __future__ import annotations

import time

import pytest

from ray_checks import ray_test, spec
from support import WAIT_S, run_on
from pdsr_sdk.config import load_config
from pdsr_sdk.errors import EngineError
from pdsr_sdk.rollout.config import RayConfig, RolloutConfig


def _named_actors_left(ray, fragment, timeout=WAIT_S):
    """Named actors whose name holds ``fragment``, once none is left or ``timeout`` has passed."""
    end = time.monotonic() + timeout
    while True:
        left = [a for a in ray.util.list_named_actors() if fragment in a]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.2)


@pytest.mark.parametrize("what", ["resources", "placement_group"])
@ray_test
def test_an_engine_ray_cannot_place_fails_with_what_was_missing(what, ray_cluster, engine_loop):
    from pdsr_sdk.engines.ray_engine import RayEngine

    if what == "resources":
        engine_spec, ray_cfg = spec("nowhere"), RayConfig(resources={"no_such_node": 1}, placement_timeout_s=2)
    else:   # a tensor-parallel group of GPUs on a cluster without any
        engine_spec, ray_cfg = spec("nowhere", tensor_parallel_size=2), RayConfig(num_gpus=1, placement_timeout_s=2)
    engine = RayEngine.from_spec(engine_spec, model="unused", ray=ray_cfg)
    with pytest.raises(EngineError) as info:
        run_on(engine_loop, engine.start(), timeout=WAIT_S)
    msg = str(info.value)
    assert "engine 'nowhere'" in msg and "within 2 s" in msg and "CPU: 4" in msg
    assert ("no_such_node: 1" in msg) if what == "resources" else ("placement group" in msg and "GPU" in msg)
    run_on(engine_loop, engine.close())
    # ray.kill returns before the cluster drops the actor's name: wait for it (a loaded machine takes a while)
    assert not _named_actors_left(ray_cluster, "nowhere")


@ray_test
def test_automatic_layout_with_a_ray_section_makes_ray_engines(ray_cluster):
    from pdsr_sdk.rollout.layout import engine_layout

    cfg = load_config(RolloutConfig, None, {"ray.address": "auto", "ray.num_cpus": 0.5})
    specs = engine_layout(cfg, required_pools=("fast", "heavy"), cpu=False, max_model_len=512)
    # the cluster has no GPU: the CPU layout (one fast, one heavy, cores split), every engine on Ray
    assert [(s.name, s.backend, s.ray.num_cpus) for s in specs] == [("fast-0", "ray", 0.5), ("heavy-0", "ray", 0.5)]
    assert all(s.devices for s in specs)


@pytest.mark.parametrize("namespace", ["pdsr-ns-probe", None])
@ray_test
def test_an_engine_actor_lives_in_ray_namespace_also_on_a_connection_made_before(namespace, ray_cluster,
                                                                                 engine_loop):
    """The session's cluster was joined by ray.init (as a trainer's is) in an anonymous namespace: ray.namespace
    still places the actor (docs/ray.md, 'From a trainer'); without it, the connection's namespace."""
    import asyncio

    from pdsr_sdk.engines.ray_engine import RayEngine

    # never placed (no node has the resource): its actor waits, named, until it is seen (however slow the machine:
    # the placement timeout is the test's own wait) and the start is cancelled
    engine = RayEngine.from_spec(spec("ns-probe"), model="unused",
                                 ray=RayConfig(namespace=namespace, resources={"no_such_node": 1},
                                               placement_timeout_s=WAIT_S))

    async def named_while_pending():
        start = asyncio.ensure_future(engine.start())
        seen: list = []
        while not seen and not start.done():
            await asyncio.sleep(0.1)
            seen = [a for a in ray_cluster.util.list_named_actors(all_namespaces=True) if "ns-probe" in a["name"]]
        start.cancel()
        with pytest.raises((asyncio.CancelledError, EngineError)):   # EngineError: the wait ran out first
            await start
        return seen

    seen = run_on(engine_loop, named_while_pending(), timeout=WAIT_S)
    assert [a["namespace"] for a in seen] == [namespace or ray_cluster.get_runtime_context().namespace]
    run_on(engine_loop, engine.close())
    assert not _named_actors_left(ray_cluster, "ns-probe")
