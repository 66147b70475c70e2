"""The Ray backend without a cluster: the config's Ray section, the layout and placement, and the message when Ray is
not installed (the engines in Ray actors: test_ray_engine_*.py)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from support import requires_torch
from pdsr_sdk.config import load_config
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import EngineSpec, RayConfig, RolloutConfig


@pytest.fixture()
def no_ray(monkeypatch):
    """Make ``import ray`` fail as on a machine without the extra."""
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)


def _spec(name="e", pool="fast", **kw) -> EngineSpec:
    return EngineSpec(name=name, pool=pool, **kw)


def test_without_ray_a_ray_engine_is_a_config_error_that_says_what_to_install(no_ray):
    from pdsr_sdk.rollout.layout import engine_layout

    cfg = RolloutConfig(engines=[_spec("a", backend="ray")])
    with pytest.raises(ConfigError, match=r"scripts/install\.sh cpu,ray"):
        engine_layout(cfg, required_pools=(), cpu=True, max_model_len=512)
    with pytest.raises(ConfigError, match=r"scripts/install\.sh cpu,ray"):
        engine_layout(RolloutConfig(ray={"address": "local"}), required_pools=(), cpu=True, max_model_len=512)
    from pdsr_sdk.engines.ray_engine import RayEngine   # an engine built by hand says the same on start

    with pytest.raises(ConfigError, match=r"scripts/install\.sh cpu,ray"):
        asyncio.run(RayEngine.from_spec(_spec("a", backend="ray"), model="unused").start())
    # without a ray engine nothing changes
    specs = engine_layout(RolloutConfig(engines=[_spec("a")]), required_pools=(), cpu=True, max_model_len=512)
    assert [s.backend for s in specs] == ["vllm"]


@requires_torch
def test_cli_ray_flag_without_ray_exits_2_with_the_install_hint(no_ray, tiny_model_dir, tmp_path):
    from click.testing import CliRunner

    from pdsr_cli.main import cli

    result = CliRunner().invoke(cli, ["rollout", "--ray", "local", "--model", str(tiny_model_dir), "--n", "2",
                                      "--limit", "1", "--quiet", "--out", str(tmp_path / "o.parquet")])
    assert result.exit_code == 2, result.output
    assert "scripts/install.sh cpu,ray" in result.output and "Traceback" not in result.output


def test_ray_settings_merge_key_by_key_and_need_the_ray_backend(monkeypatch):
    from pdsr_sdk.engines import build_engine, ray_cluster
    from pdsr_sdk.engines.ray_engine import RayEngine
    from pdsr_sdk.rollout.layout import engine_layout

    monkeypatch.setattr(ray_cluster, "require_ray", lambda: None)
    cfg = load_config(RolloutConfig, None, {
        "ray": {"address": "head:6379", "num_cpus": 2, "env_vars": {"A": "1", "B": "2"}, "resources": {"r": 1}},
        "engines": [
            {"name": "a", "pool": "fast", "backend": "ray", "ray": {"num_gpus": 0.5, "env_vars": {"B": "3"}}},
            {"name": "b", "pool": "heavy", "backend": "ray"},
            {"name": "c", "pool": "heavy"},
        ]})
    a, b, c = engine_layout(cfg, required_pools=(), cpu=True, max_model_len=512)
    assert a.ray.model_dump() == RayConfig(address="head:6379", num_cpus=2, num_gpus=0.5, resources={"r": 1},
                                           env_vars={"A": "1", "B": "3"}).model_dump()
    assert b.ray.model_dump() == cfg.ray.model_dump()
    assert c.ray is None and c.backend == "vllm"
    engine = build_engine(a, model="m", tokenizer=None, seed=0, logprobs_mode="raw_logprobs")   # as a session does
    assert isinstance(engine, RayEngine) and engine.ray_config == a.ray and engine.pool == "fast"
    bad = RolloutConfig(engines=[_spec("x", ray={"num_cpus": 1})])
    with pytest.raises(ConfigError, match=r"engines\[0\] \('x'\).*backend 'ray'"):
        engine_layout(bad, required_pools=(), cpu=True, max_model_len=512)


def test_placement_one_gpu_per_rank_and_a_bundle_per_gpu_for_tensor_parallel():
    from pdsr_sdk.engines.ray_cluster import engine_args_for, placement

    cfg = RayConfig(num_cpus=2, resources={"big": 1})
    assert placement(_spec(), cfg, gpu_cluster=True) == ({"num_cpus": 2, "num_gpus": 1, "resources": {"big": 1}}, None)
    assert placement(_spec(), cfg, gpu_cluster=False)[0]["num_gpus"] == 0
    opts, bundles = placement(_spec(tensor_parallel_size=4), cfg, gpu_cluster=True)
    assert bundles == [{"CPU": 2, "GPU": 1, "big": 1}, {"GPU": 1}, {"GPU": 1}, {"GPU": 1}]
    assert opts == {"num_cpus": 2, "num_gpus": 0, "resources": {"big": 1}}   # the actor sits in bundle 0
    spec = engine_args_for(_spec(tensor_parallel_size=4, engine_args={"enforce_eager": True}), tp_placement_group=True)
    assert spec.engine_args == {"distributed_executor_backend": "ray", "enforce_eager": True}
    with pytest.raises(ConfigError, match="at most 1 GPU per rank"):
        placement(_spec(tensor_parallel_size=2), RayConfig(num_gpus=2), gpu_cluster=True)
