"""Engines in Ray actors (tests/engines/conftest.py) whose actor is killed mid-run: the pool's other engine
takes its samples, or, where it was the pool's last, the run stops with an error naming the engine and its node.

This file is collected after the other users of the session's actors (their fixture replaces a killed one for the
next test that asks, so any order passes; this one starts no actor twice)."""

from __future__ import annotations

import time

import pytest

from ray_checks import engine_test, replay_config
from support import WAIT_S, run_on
from pdsr_sdk.errors import EngineError
from workloads import LENGTHS


def _session_run(engine_loop, cfg, engines, records, kill_when):
    """Run one batch through a RolloutSession, calling ``kill_when(session, sample)`` after each sample."""
    from pdsr_sdk.rollout.session import RolloutSession

    async def go():
        session = RolloutSession(cfg, engines=engines, model_dir=cfg.model)
        session.hooks.on_sample_done.append(lambda s: kill_when(session, s))
        await session.start()
        try:
            return session, await session.generate(records)
        finally:
            await session.close()

    return run_on(engine_loop, go())


def _core_pids(actor_pid):
    import psutil

    return [p.pid for p in psutil.Process(actor_pid).children(recursive=True)]


def _wait_gone(pids, timeout=WAIT_S):
    import psutil

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.5)
    return alive


@engine_test
def test_killing_one_actor_mid_run_requeues_its_samples_on_the_pool(ray_engines, reference, engine_loop,
                                                                    tiny_model_dir, replay_data, tmp_path):
    import ray

    ray0, ray1, local = ray_engines
    children = _core_pids(ray0.node["pid"])
    assert children   # the actor's vLLM engine-core process
    cfg = replay_config(tiny_model_dir, replay_data, tmp_path / "o.parquet", "baseline")
    killed = {}

    def kill_when(session, sample):
        running = session.scheduler.running(ray0)
        if not killed and session.scheduler.stats["samples_finished"] >= 3 and running:
            killed["running"] = {s.key for s in running}
            ray.kill(ray0._actor)

    session, result = _session_run(engine_loop, cfg, [local, ray0, ray1], reference["records"], kill_when)
    assert killed["running"]
    samples = {s.key: s for g in result.groups for s in g.samples}
    assert len(samples) == 20 and all(s.finished for s in samples.values())
    for key, s in samples.items():
        p, i = key.split("/")
        want = LENGTHS[p][int(i)]
        assert s.num_generated == len(s.token_ids) == want
        assert s.token_ids == reference["tokens"][p][:want], key
    # every sample running on the killed actor (then, or launched before its death was known) was
    # retried on the other fast engine, unless its last tokens were already on their way back when
    # ray.kill landed: then it finished on the actor, whole, and a retry would have been waste
    retried = {k for k, s in samples.items() if s.retries}
    for key in killed["running"] - retried:
        last = samples[key].segments[-1]
        assert last.engine == "fast-ray-0" and last.end_reason in ("stop", "length"), (key, last)
    assert killed["running"] & retried
    for key in retried:
        s = samples[key]
        assert s.retries == 1 and s.segments[-1].engine == local.name
        assert [seg.engine for seg in s.segments if seg.end_reason == "engine_dead"] == ["fast-ray-0"]
    [err] = session.scheduler.engine_errors
    text = str(err)
    assert err.engine == "fast-ray-0" and ray0.node["ip"] in text and ray0.node["node_id"] in text
    assert "ActorDiedError" in text and "ray.kill" in text
    assert result.stats["engines_lost"] == 1 and result.stats["retries"] == len(retried)
    assert ray0.dead and not ray1.dead   # what the shared fixture reads to start a killed actor afresh
    assert _wait_gone(children) == []   # no engine core left behind holding memory


@engine_test
def test_killing_the_only_actor_of_a_pool_stops_with_an_engine_error_naming_engine_and_node(
        live_ray_engines, vllm_pair, reference, engine_loop, tiny_model_dir, replay_data, tmp_path):
    import ray

    # not ray_engines: fast-ray-0, which the test above killed, would be started again for nothing
    (ray1,), local = live_ray_engines("heavy-ray-1"), vllm_pair[0]
    cfg = replay_config(tiny_model_dir, replay_data, tmp_path / "o.parquet", "v2.5")

    killed = []

    def kill_when(session, sample):
        if not killed:
            killed.append(sample.key)
            ray.kill(ray1._actor)

    with pytest.raises(EngineError) as info:
        _session_run(engine_loop, cfg, [local, ray1], reference["records"], kill_when)
    err = info.value
    text = str(err)
    assert err.engine == "heavy-ray-1" and ray1.dead
    assert "no live engine is left in pool 'heavy'" in text
    node_ips = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    assert ray1.node["ip"] in node_ips and ray1.node["ip"] in text and ray1.node["node_id"] in text
    assert "ray.kill" in text
