"""The examples in examples/, run at small settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from support import ROOT, requires_ray, requires_torch, requires_vllm
from pdsr_cli.main import cli
from pdsr_sdk.traces import synth_trace, write_trace_jsonl

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


# The GRPO example's task and settings for the tests: the built-in tiny model, the common-word reward,
# B=2 prompts x N=8 samples of 16 tokens, lr 1e-2 (the example's default 3e-3 needs about 10 steps to
# rise), 8 steps, engine seed 0. `--compare` runs the updates and then the control in one session.
# Sampling is not reproducible run to run (the engine's generator is shared by requests whose order
# follows the engines' timing), and one CI run of 6 steps rose only to 0.13 by step 5 (mean of the
# last 3 minus the first 3: 0.073); two more steps leave such a run room to show that it learns.
GRPO_ARGS = ["--compare", "--steps", "8", "--batch-size", "2", "--n", "8", "--max-tokens", "16", "--lr", "1e-2"]
#: engine seeds: a run that gains too little is tried once more with the second (as GRPO_PARTIAL_SEEDS): one CI
#: rehearsal of 2026-11-26 rose to 0.18 by step 4 and fell back to 0.0 (last 3 minus first 3: -0.02), where
#: every earlier run of seed 0 gained
GRPO_COMPARE_SEEDS = ("0", "1")
#: mean reward of the last 3 steps minus the first 3: the trained run must gain more, the control less.
#: The random model starts near 0.01 (per step the mean of 256 tokens at ~1%: noise about 0.006);
#: with updates the reward reached 0.5-1.0 by step 5 (a torch-only replica of the loop, 4 seeds).
LEARNING_MARGIN = 0.1
CONTROL_LIMIT = 0.03


def _grpo_runs(stdout: str) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    name = None
    for line in stdout.splitlines():
        if line in ("# updates", "# control"):
            name = line[2:]
            runs[name] = []
        elif line.startswith("{"):
            assert name is not None, line
            runs[name].append(json.loads(line))
    return runs


def _grpo_compare_run(seed: str) -> dict[str, list[dict]]:
    """One run of examples/grpo_train.py --compare at the tests' settings (measured 100-230 s on the shared 2-core
    machine, load average 3-11; the engine start is most of it under load)."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "grpo_train.py"), *GRPO_ARGS, "--seed", seed],
                         capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    return _grpo_runs(out.stdout)


@pytest.fixture(scope="module")
def grpo_compare():
    return _grpo_compare_run(GRPO_COMPARE_SEEDS[0])


@requires_vllm
@requires_torch
@pytest.mark.vllm
@pytest.mark.slow
def test_grpo_example_runs_end_to_end_and_reports_its_numbers(grpo_compare):
    """Every step prints its numbers; with updates each step's samples come from a new policy version,
    in the control from one version; the engine's log-probs agree with the trainer's (bf16 or fp32 engines, an fp32
    trainer)."""
    updates, control = grpo_compare["updates"], grpo_compare["control"]
    assert [r["step"] for r in updates] == [r["step"] for r in control] == list(range(8))
    assert [r["policy_version"] for r in updates] == list(range(1, 9))   # 1 = the initial weights pushed once
    assert len({r["policy_version"] for r in control}) == 1               # the control never pushes
    for r in updates + control:
        assert 0.0 <= r["reward_mean"] <= 1.0 and 0 < r["response_len"] <= 16 and r["kl_ref"] >= 0
        assert r["engine_trainer_logp_gap"] < 0.1 and 0 < r["samples"] <= 16
    assert all(r["kl_ref"] == 0 for r in control)   # the engines sample from the reference weights


def _change(rows: list[dict]) -> float:
    r = [row["reward_mean"] for row in rows]
    return sum(r[-3:]) / 3 - sum(r[:3]) / 3


@requires_vllm
@requires_torch
@pytest.mark.vllm
@pytest.mark.slow
def test_grpo_example_learns_with_updates_and_not_without(grpo_compare):
    """The reward mean rises by more than LEARNING_MARGIN with updates (within two seeds: GRPO_COMPARE_SEEDS); the
    control (the same loop, the trainer still training, but no update_weights) stays within CONTROL_LIMIT of where
    it started in every run."""
    tables = {}
    runs = grpo_compare
    for seed in GRPO_COMPARE_SEEDS:
        if seed != GRPO_COMPARE_SEEDS[0]:
            runs = _grpo_compare_run(seed)
        trained, control = _change(runs["updates"]), _change(runs["control"])
        tables[seed] = {k: [r["reward_mean"] for r in v] for k, v in runs.items()}
        assert abs(control) < CONTROL_LIMIT, tables[seed]
        if trained > LEARNING_MARGIN and trained - control > LEARNING_MARGIN:
            return
    pytest.fail(f"the reward did not rise by more than {LEARNING_MARGIN} with either seed: {tables}")


#: partial rollout at the tests' settings: 4 groups in flight for steps of 2, tokens at most 1 version old. Half
#: the steps train on the groups the step before did not take (all one version old, TIS weights 0.3-0.5 while
#: the policy moves), so it learns more slowly than on-policy: at 8 steps one of three runs gained only 0.04;
#: at 12 steps three of three reached 1.0 (last 3 minus first 3: +0.97, +0.97, +0.98).
GRPO_PARTIAL_ARGS = ["--steps", "12", "--batch-size", "2", "--n", "8", "--max-tokens", "16", "--lr", "1e-2",
                     "--over-provision", "1", "--max-staleness", "1"]
#: the engine's sampling is not reproducible run to run (one engine seed, requests batched as they come), and
#: at 16 samples a step a run can find no reward before its responses drift to the cap: one CI rehearsal of
#: 2026-11-26 stayed at 0.0-0.016 for 12 steps, where six reruns of seed 0 gained 0.91-0.98. So a run that
#: gains too little is tried again, with another seed; a loop that does not learn fails every one. Two tries were
#: not enough: a clean-clone CI of 2026-11-29 had both stay at 0.0-0.016, and six runs two at a time on this
#: machine gained 0.82-0.97 but one (-0.02); at about one run in six that stalls, four tries fail together about
#: once in a thousand, and a loop that does not learn still fails all four.
GRPO_PARTIAL_SEEDS = ("0", "1", "2", "3")


def _grpo_partial_run(seed: str) -> list[dict]:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "grpo_train.py"), *GRPO_PARTIAL_ARGS, "--seed", seed],
                         capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["policy_version"] for r in rows] == list(range(1, 13))
    assert rows[0]["off_policy_share"] == 0 and rows[0]["max_token_age"] == 0
    assert all(r["max_token_age"] <= 1 and r["trained_token_age"] == r["max_token_age"] for r in rows)
    assert sum(r["off_policy_share"] > 0 for r in rows) >= 3
    assert all(0 < r["tis_weight"] <= 2 for r in rows)
    gaps = [r["engine_trainer_logp_gap"] for r in rows if r["engine_trainer_logp_gap"] == r["engine_trainer_logp_gap"]]
    assert gaps and all(g < 0.1 for g in gaps)   # NaN: a step whose every token an older version sampled
    return rows


@requires_vllm
@requires_torch
@pytest.mark.vllm
@pytest.mark.slow
def test_grpo_example_learns_with_partial_rollout_and_tis():
    """``--over-provision 1 --max-staleness 1``: the groups a step does not take carry on under the next
    weights, so later steps train on tokens one version old (never older), weighted by TIS (mean weight in
    (0, 2]); the first step is all on-policy; the reward still rises by more than LEARNING_MARGIN (within
    four seeds: GRPO_PARTIAL_SEEDS)."""
    rewards = {}
    for seed in GRPO_PARTIAL_SEEDS:
        rows = _grpo_partial_run(seed)
        rewards[seed] = [r["reward_mean"] for r in rows]
        if _change(rows) > LEARNING_MARGIN:
            return
    pytest.fail(f"the reward did not rise by more than {LEARNING_MARGIN} with any seed: {rewards}")


GRPO_PIPELINE_ARGS = ["--steps", "4", "--batch-size", "2", "--n", "8", "--max-tokens", "16", "--seed", "0",
                      "--over-provision", "1", "--max-staleness", "1", "--pipeline"]


@requires_vllm
@requires_torch
@pytest.mark.vllm
@pytest.mark.slow
def test_grpo_example_pipelined_trains_on_one_step_while_the_next_generates():
    """``--pipeline``: step k + 1 runs in a thread while the trainer trains on step k and calls
    update_weights in its middle; the step waits for that update (``wait_for_update``), so it ends under
    the trainer's weights: every step after the first ends one version above the one before, B whole
    groups each, and the ages the trainer sees are those of the step's summary (at most S); TIS weights
    stay in (0, 2]."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "grpo_train.py"), *GRPO_PIPELINE_ARGS],
                         capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and all(r["samples"] == 16 for r in rows)
    assert [r["policy_version"] for r in rows] == [1, 2, 3, 4]
    assert all(r["trained_token_age"] == r["max_token_age"] <= 1 for r in rows)
    assert all(0 < r["tis_weight"] <= 2 for r in rows)


GRPO_TIS_ARGS = ["--steps", "3", "--batch-size", "2", "--n", "4", "--max-tokens", "8", "--seed", "0"]


@requires_vllm
@requires_torch
@pytest.mark.vllm
@pytest.mark.slow
def test_grpo_example_reports_tis_on_policy_and_trains_partial_rollout_without_it():
    """``--tis 1.5`` on on-policy steps weights the tokens (the engine's numerics against the trainer's) and says
    so in each line (mean weight in (0, 1.5]); ``--tis off`` with ``--over-provision`` trains without the weights
    (null) and still reports the ages."""
    lines = {}
    for name, extra in (("on-policy", ["--tis", "1.5"]), ("off", ["--over-provision", "1", "--max-staleness", "1",
                                                                  "--tis", "off"])):
        out = subprocess.run([sys.executable, str(ROOT / "examples" / "grpo_train.py"), *GRPO_TIS_ARGS, *extra],
                             capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=900)
        assert out.returncode == 0, out.stderr[-5000:]
        lines[name] = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        assert [r["step"] for r in lines[name]] == [0, 1, 2]
    assert all(0 < r["tis_weight"] <= 1.5 and "max_token_age" not in r for r in lines["on-policy"])
    assert all(r["tis_weight"] is None and r["max_token_age"] <= 1 for r in lines["off"])


@requires_vllm
@requires_torch
@requires_ray
@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("PDSR_TEST_RAY_EXAMPLE") != "1",
                    reason="opt-in (PDSR_TEST_RAY_EXAMPLE=1): the test took 157-282 s on the shared 2-core machine "
                           "(Ray and an engine in an actor start for 130 s or more), over the examples' share of CI "
                           "time")
def test_ray_engines_example_runs_the_same_loop_on_ray_actors():
    """examples/ray_engines.py: two steps of the GRPO loop with the engine(s) in Ray actors of a local
    cluster (the automatic layout of a 2-core CPU cluster); each update goes through Ray's object store.
    Opt-in: see the skip reason."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "ray_engines.py"), "--steps", "2",
                          "--batch-size", "2", "--n", "4", "--max-tokens", "8"],
                         capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    settings = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("# settings "))[11:])
    assert settings["ray"] == "local"
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["policy_version"] for r in rows] == [1, 2]
    for r in rows:
        assert 0 < r["samples"] <= 8 and 0 < r["response_len"] <= 8 and r["engine_trainer_logp_gap"] < 0.1
