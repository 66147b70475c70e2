"""The examples in examples/, run at small settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import requires_torch, requires_vllm
from pdsr_cli.main import cli
from pdsr_sdk.traces import synth_trace, write_trace_jsonl

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:   # `examples` is imported by path, as a user's own package would be
    sys.path.insert(0, str(ROOT))

CUSTOM = "examples.custom_policy:GroupAffinityPolicy"


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def test_custom_policy_runs_in_pdsr_simulate_by_import_path_with_its_setting(tmp_path):
    trace = write_trace_jsonl(synth_trace(groups=16, n=4, seed=0), tmp_path / "t.jsonl")
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(trace), "--policy", f"{CUSTOM},baseline",
                                 "--no-references", "--fast", "2", "--heavy", "0", "--batch-size", "8",
                                 "--set", "weight_per_sample=512", "--out-dir", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "simulate.json").read_text())
    mine = next(p for p in report["policies"] if p["policy"] == CUSTOM)
    assert mine["settings"] == {"weight_per_sample": 512}
    assert mine["makespan_s"] > 0 and mine["lower_bound_s"] <= mine["makespan_s"]
    assert CUSTOM in r.output


def test_custom_policy_registered_by_name_runs_through_the_sdk_simulator():
    from examples.custom_policy import GroupAffinityPolicy, register
    from pdsr_sdk.policies import POLICIES

    name = register()
    try:
        assert register() == name and POLICIES.get(name) is GroupAffinityPolicy
        run_registered(name)
    finally:   # the registry is global: later tests list every registered policy
        POLICIES.unregister(name)
    assert name not in POLICIES


def run_registered(name):
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.driver import simulate

    trace = synth_trace(groups=8, n=4, seed=1)
    rep = simulate(trace, SimulateConfig(policy=name, fast=2, heavy=0, batch_size=4, timeline=False),
                   keep_groups=True)
    groups = rep.runs[0].groups
    assert len(groups) == 8
    for g in groups:   # every sample finished, every group on one engine
        assert all(s.finish_reason for s in g.samples)
        assert len({seg.engine for s in g.samples for seg in s.segments}) == 1


def test_pdsr_rollout_refuses_a_bad_import_path_plainly(tmp_path):
    r = CliRunner().invoke(cli, ["rollout", "--policy", "examples.custom_policy:NoSuchPolicy", "--out",
                                 str(tmp_path / "x.parquet")])
    assert r.exit_code != 0 and "NoSuchPolicy" in r.output


@requires_vllm
@requires_torch
@pytest.mark.vllm
@pytest.mark.slow
def test_custom_policy_drives_real_engines_through_the_sdk_and_pdsr_rollout(tmp_path):
    """The example's own main() (RolloutSession with policy=import path), then `pdsr rollout --policy`."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "custom_policy.py")], capture_output=True,
                         text=True, cwd=ROOT, env=_env(), timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 2 and all("16 samples" in line and line.endswith("True") for line in lines)

    traj = tmp_path / "r.parquet"
    r = subprocess.run([sys.executable, "-m", "pdsr_cli.main", "rollout", "--policy", CUSTOM, "--n", "2",
                        "--batch-size", "2", "--limit", "2", "--max-tokens", "16", "--out", str(traj), "--overwrite"],
                       capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=900)
    assert r.returncode == 0, r.stderr[-5000:]
    import pyarrow.parquet as pq

    assert pq.read_table(traj).num_rows == 4


@requires_vllm
@requires_torch
@pytest.mark.vllm
@pytest.mark.slow
def test_grpo_example_runs_end_to_end_and_reports_its_numbers():
    """Three GRPO steps at small settings (B=2 x N=4, 12 tokens): every step prints its numbers, each
    update bumps the policy version, and the engine's log-probs agree with the trainer's (bf16 vs fp32).
    No learning assertion here: see the example's docstring and the branch's report."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "grpo_train.py"), "--steps", "3",
                          "--batch-size", "2", "--n", "4", "--max-tokens", "12"],
                         capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=600)
    assert out.returncode == 0, out.stderr[-5000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [r["policy_version"] for r in rows] == [1, 2, 3]   # version 1 = the initial weights pushed once
    for r in rows:
        assert 0.0 <= r["reward_mean"] <= 1.0 and 0 < r["response_len"] <= 12 and r["kl_ref"] >= 0
        assert r["engine_trainer_logp_gap"] < 0.1
