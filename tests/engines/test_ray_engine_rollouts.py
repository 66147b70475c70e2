"""Whole rollouts on engines in Ray actors (``fast-ray-0``, ``heavy-ray-1``: tests/engines/conftest.py): every
policy, and a local pool beside a Ray one. Greedy float32, so every sample of a prompt is a prefix of the local
greedy reference, whichever engines generated its segments."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from ray_checks import check_samples, engine_test, replay_config
from support import run_on


@pytest.mark.parametrize("policy", ["baseline", "v1", "v2", "v2.5"])
@engine_test
def test_every_policy_on_ray_engines_gives_the_local_engines_samples(
        policy, ray_engines, reference, engine_loop, tiny_model_dir, replay_data, tmp_path):
    from pdsr_sdk.rollout.run import run_rollout_async

    ray0, ray1, _ = ray_engines
    settings = {"policy.settings.offload_fraction": 0.4} if policy == "v2.5" else {}
    cfg = replay_config(tiny_model_dir, replay_data, tmp_path / "out.parquet", policy, **settings)
    summary = run_on(engine_loop, run_rollout_async(cfg, engines=[ray0, ray1]))
    rows = pq.read_table(cfg.output.path).to_pylist()
    check_samples(rows, reference)
    engines_used = {seg["engine"] for r in rows for seg in r["segments"]}
    assert "fast-ray-0" in engines_used and summary.engine_errors == []
    if policy in ("baseline", "v2.5"):   # baseline splits the batch over both; v2.5 offloads 2 of 5 prompts
        assert engines_used == {"fast-ray-0", "heavy-ray-1"}
    if policy == "v2.5":   # samples past the fast cap moved from one actor to the other mid-sample
        moved = [r for r in rows if r["moves"]]
        assert moved and all({s["engine"] for s in r["segments"]} == {"fast-ray-0", "heavy-ray-1"} for r in moved)


@engine_test
def test_a_pool_of_local_engines_and_a_pool_of_ray_engines_pass_samples_between_them(
        ray_engines, reference, engine_loop, tiny_model_dir, replay_data, tmp_path):
    from pdsr_sdk.rollout.run import run_rollout_async

    _, ray1, local = ray_engines
    cfg = replay_config(tiny_model_dir, replay_data, tmp_path / "out.parquet", "v2.5",
                        **{"policy.settings.offload_fraction": 0.4})
    run_on(engine_loop, run_rollout_async(cfg, engines=[local, ray1]))
    rows = pq.read_table(cfg.output.path).to_pylist()
    check_samples(rows, reference)
    moved = [r for r in rows if r["moves"]]   # broke the fast cap on the local engine, finished in the actor
    assert moved and all([s["engine"] for s in r["segments"]][-1] == "heavy-ray-1" and
                         r["segments"][0]["engine"] == local.name for r in moved)
