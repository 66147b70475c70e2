"""`pdsr simulate --steps` with a trainer: its time (`trainer_s`), the weight load (`weight_update_s`), and
pipelining (`pipeline`: the trainer trains on step k while step k + 1 generates)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.dispatch.types import kept_segments
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import run_policy, trace_batches
from pdsr_sdk.sim.steps import run_steps, simulate_steps
from pdsr_sdk.traces import write_trace_jsonl
from sim_cases import recorded, small_cfg, small_trace


def on_policy_makespans(trace, cfg):
    on = run_policy(trace_batches(trace, cfg.model_copy(update={"num_batches": cfg.steps})), cfg, "baseline",
                    record=False)
    return [b.makespan_s for b in on.batches]


def test_a_synchronous_trainer_adds_its_time_to_every_step_and_the_baselines():
    """F = 0, no pipelining: each step is its on-policy batch (nothing runs at a step's end, so stopping the
    engines costs nothing), then the trainer (7 s) and the load (2 s): the steps after the first take exactly
    the batch's makespan + 9 s, and so do the on-policy baseline's; the ratio is 1 and no token is old."""
    trace = small_trace()
    cfg = small_cfg(over_provision=0.0, trainer_s=7.0, weight_update_s=2.0)
    makespans = on_policy_makespans(trace, cfg)
    report = simulate_steps(trace, cfg)
    run = report.runs[0]
    want = [m + (9.0 if i else 0.0) for i, m in enumerate(makespans)]
    assert run.step_times == pytest.approx(want, rel=1e-12)
    assert report.baseline_steps_s == pytest.approx(want, rel=1e-12)
    assert report.summary(run)["ratio"] == pytest.approx(1.0, rel=1e-12)
    assert run.max_age == 0 and [s.version for s in run.steps] == list(range(6))
    # the bound counts the trainer's time from the second step on
    assert (np.cumsum(run.step_times) >= np.cumsum(run.work_bounds_s) * (1 - 1e-9)).all()
    assert run.work_bounds_s[1] > 9.0 > run.work_bounds_s[0]


@pytest.mark.parametrize("update_s", [0.0, 0.5])
def test_pipelined_at_f0_with_a_slow_trainer_is_paced_by_the_trainer(update_s):
    """F = 0, pipelined, a trainer slower than any batch (1,000 s): step k + 1's B groups finish before the
    trainer's update for step k, and the step waits for it (hold); the update finds no sample running and
    loads. So every step after the first takes exactly trainer_s + weight_update_s, each ends one version up,
    and its tokens are exactly one version old at its end (generated before the update)."""
    trace = small_trace()
    cfg = small_cfg(over_provision=0.0, trainer_s=1000.0, weight_update_s=update_s, pipeline=True)
    run = run_steps(trace, cfg, "baseline", 0.0, keep_groups=True)
    makespans = on_policy_makespans(trace, cfg)
    assert max(makespans) < 1000.0
    assert run.step_times[0] == pytest.approx(makespans[0], rel=1e-12)
    assert run.step_times[1:] == pytest.approx([1000.0 + update_s] * 5, rel=1e-12)
    assert [s.version for s in run.steps] == list(range(6))
    assert run.steps[0].ages == {0: run.steps[0].tokens}
    assert all(s.ages == {1: s.tokens} for s in run.steps[1:])


@pytest.mark.parametrize("policy,staleness,trainer_s,update_s", [
    ("baseline", None, 1.0, 0.0), ("baseline", 1, 1.0, 0.1), ("v3", 1, 1.0, 0.1), ("v3", 2, 2.0, 0.05),
    ("v3", 0, 1.0, 0.0), ("baseline", 1, 0.5, 0.1)])
def test_pipelined_partial_rollout_keeps_every_sample_and_the_staleness_bound(policy, staleness, trainer_s,
                                                                               update_s):
    """F = 0.5, pipelined, updates landing in the middle of steps (the engines stop, load, and go on): every
    launched group is consumed once or still in flight, each sample with exactly its recorded length; token
    ages count from each step's end version, which is one above its predecessor's (the hold) and never older
    than S; the steps together take at least their work bounds. Against the same run with a synchronous
    trainer, pipelining hides the trainer: its steady step is shorter. (A step here takes 1-2.5 s, so the updates land
    while it runs.)"""
    trace = small_trace(groups=80)
    want = recorded(trace)
    cfg = small_cfg(policy=policy, max_staleness=staleness, trainer_s=trainer_s, weight_update_s=update_s,
                    pipeline=True, restart_lengths="replay")   # every length known (fresh draws: test_sim_redraw)
    run = run_steps(trace, cfg, policy, 0.5, keep_groups=True)
    ids = [g.prompt_id for g in run.groups]
    assert len(ids) == len(set(ids)) == sum(s.groups for s in run.steps)
    assert len(run.launched_at) == len(ids) + run.dropped_groups
    by_step = {s.index: s for s in run.steps}
    for g in run.groups:
        end = by_step[run.consumed_at[g.prompt_id]].version
        for s in g.samples:
            assert s.finished and s.num_generated == want[g.prompt_id][s.index], s.key
            ages = [end - seg.policy_version for seg in kept_segments(s) if seg.num_tokens]
            assert min(ages) >= 0
            if staleness is not None:
                assert max(ages) <= staleness, s.key
    versions = [s.version for s in run.steps]
    assert versions[0] == 0 and all(b >= a for a, b in zip(versions, versions[1:]))
    assert sum(b == a + 1 for a, b in zip(versions, versions[1:])) >= len(versions) - 2, versions
    if staleness == 0:   # every token the update found is regenerated
        assert run.off_policy_share == 0 and sum(s.stale_restarts for s in run.steps) > 0
    else:
        assert run.off_policy_share > 0 and run.partial_share > 0
    assert (np.cumsum(run.step_times) >= np.cumsum(run.work_bounds_s) * (1 - 1e-9)).all()
    sync = run_steps(trace, cfg.model_copy(update={"pipeline": False}), policy, 0.5)
    assert run.steady_step_s < sync.steady_step_s


def test_trainer_keys_need_steps():
    for key, value in (("trainer_s", 1.0), ("weight_update_s", 1.0), ("pipeline", True)):
        with pytest.raises(ValueError, match=f"{key} applies to multi-step runs only"):
            SimulateConfig(**{key: value})


def test_cli_takes_the_trainer_flags(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace_jsonl(small_trace(), trace)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, [
        "simulate", "--trace", str(trace), "--policy", "baseline", "--fast", "2", "--heavy", "1", "--batch-size", "6",
        "--steps", "6", "--over-provision", "0.5", "--max-staleness", "1", "--trainer-s", "20",
        "--weight-update-s", "0.5", "--pipeline", "--out-dir", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "pipelined trainer 20 s a step" in res.output
    data = json.loads((out / "steps.json").read_text())
    assert (data["trainer_s"], data["weight_update_s"], data["pipeline"]) == (20.0, 0.5, True)
    run = data["runs"][0]
    # the on-policy steps after the first carry the trainer's time and the load
    assert all(s >= 20.5 for s in data["on_policy"]["steps_s"][1:])
    assert [s["version"] for s in run["steps"]][:2] == [0, 1]


def test_kv_on_update_keep_spares_the_carried_samples_their_prefill():
    """kv_on_update keep: a step's end does not reset the engines' prefix caches, so a carried sample goes on
    from the KV its engine computed before the update and prefills at most its last partial block; recompute
    (the default) prefills its whole context again. At F = 0 nothing runs at a step's end and the two are the
    same run; with carried samples keep prefills less, and every sample is still consumed with exactly its
    recorded length (check) and no token older than S."""
    trace = small_trace(groups=80)
    for f in (0.0, 0.5):
        runs = {kv: run_steps(trace, small_cfg(policy="v3", max_staleness=2, kv_on_update=kv,
                                               restart_lengths="replay"), "v3", f)
                for kv in ("recompute", "keep")}
        prefill = {kv: sum(e.prefill_tokens for e in r.engines) for kv, r in runs.items()}
        if f == 0.0:
            assert runs["keep"].step_times == runs["recompute"].step_times
            assert prefill["keep"] == prefill["recompute"]
        else:
            assert prefill["keep"] < 0.9 * prefill["recompute"]
            assert runs["keep"].max_age <= 2
    with pytest.raises(Exception, match="kv_on_update applies to multi-step runs only"):
        SimulateConfig(kv_on_update="keep")
