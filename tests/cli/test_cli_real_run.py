"""What a user sees of a real `pdsr rollout` run: its output captured as a log file would have it, with and without
--quiet, and `python -m pdsr_cli`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from support import ROOT, requires_vllm



#: two `pdsr rollout` runs in one process (one import of vLLM and torch: half the time of two processes), each
#: with stdout and stderr on files at the descriptor level, as `pdsr ... > out 2> log` has them. The --quiet run
#: goes first: vLLM's import-time warnings (Triton on the CPU build) come with the first engine.
DRIVER = """
import json, os, sys
from pdsr_cli.main import cli

def run(args, out_path, err_path):
    saved = os.dup(1), os.dup(2)
    with open(out_path, "w") as out, open(err_path, "w") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            cli.main(args, standalone_mode=False)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)

if __name__ == "__main__":
    for args, out_path, err_path in json.loads(sys.argv[1]):
        run(args, out_path, err_path)
"""


@pytest.fixture(scope="module")
def rollout_runs(tiny_model_dir, tmp_path_factory):
    """The same small run with --quiet, then as a log file sees it (stderr not a terminal):
    ``(work dir, {"quiet": (stdout, stderr), "log": (stdout, stderr)})``."""
    work = tmp_path_factory.mktemp("cli_output")
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(4)))
    common = ["rollout", "--policy", "baseline", "--model", str(tiny_model_dir), "--data", str(data), "--n", "2",
              "--batch-size", "2", "--max-tokens", "16", "--system-prompt", "Be brief.", "--instruction", "math",
              "--overwrite"]
    runs = [(common + ["--out", str(work / f"{name}.parquet")] + (["--quiet"] if name == "quiet" else []),
             str(work / f"{name}.stdout"), str(work / f"{name}.stderr")) for name in ("quiet", "log")]
    (work / "driver.py").write_text(DRIVER)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(work / "driver.py"), json.dumps(runs)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900)
    outputs = {name: ((work / f"{name}.stdout").read_text() if (work / f"{name}.stdout").exists() else "",
                      (work / f"{name}.stderr").read_text() if (work / f"{name}.stderr").exists() else "")
               for name in ("quiet", "log")}
    assert proc.returncode == 0, (proc.stderr[-3000:], outputs)
    return work, outputs


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_log_file_gets_status_lines_and_plain_progress(rollout_runs):
    _, outputs = rollout_runs
    err = outputs["log"][1]
    assert "\r" not in err and "\x1b[" not in err                   # no redraws, no cursor codes
    assert re.search(r"^pdsr: starting \d+ vLLM engines? \(\d+ fast.*; model tiny-qwen2\S*\) \.\.\.$", err, re.M), err
    assert re.search(r"^pdsr: engines ready in \d+\.\d s$", err, re.M), err
    assert re.search(r"^samples: 8/8 \(100%\), .* sample/s, \d+ s$", err, re.M), err
    assert "Loading safetensors checkpoint shards" not in err      # vLLM's bar redraws: off in a log


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_printed_summary_leads_and_json_keeps_every_key(rollout_runs):
    import pyarrow.parquet as pq

    from pdsr_sdk.dispatch.run import STAT_KEYS
    from pdsr_sdk.rollout.config import INSTRUCTIONS

    work, outputs = rollout_runs
    stdout = outputs["log"][0]
    out = stdout.splitlines()
    assert re.fullmatch(r"policy baseline: makespan \d+\.\d\d s, \d+\.\d tokens/s, reward mean \d\.\d{3}", out[0])
    assert not any(re.search(r" 0\b", line) for line in out if line.startswith("counters:"))
    assert "4 groups, 8 samples, " in stdout
    for zero in ("steals", "moves", "restarts", "engines_lost", "offloaded"):
        assert zero not in stdout
    data = json.loads((work / "log.summary.json").read_text())
    assert set(STAT_KEYS) - {"samples_finished", "tokens_generated"} <= set(data["stats"])
    assert data["stats"]["steals"] == 0 and data["rewarded_samples"] == 8 and 0.0 <= data["reward_mean"] <= 1.0
    rows = pq.read_table(work / "log.parquet", columns=["prompt_text"]).to_pylist()
    assert all(r["prompt_text"].startswith("<|im_start|>system\nBe brief.<|im_end|>") for r in rows)
    assert all(f"+1?\n{INSTRUCTIONS['math']}<|im_end|>" in r["prompt_text"] for r in rows)


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_quiet_keeps_only_pdsr_lines(rollout_runs):
    _, outputs = rollout_runs
    stdout, stderr = outputs["quiet"]
    lines = stderr.splitlines()
    assert lines and all(line.startswith("pdsr: ") for line in lines), stderr[-3000:]   # no vLLM, torch, Triton
    assert any(line.startswith("pdsr: engines ready in") for line in lines)
    assert stdout.splitlines()[0].startswith("policy baseline: makespan ")


def test_ray_actors_get_the_quiet_environment_the_users_values_first():
    """Ray actors do not inherit the command's environment: --quiet reaches them through ray.env_vars."""
    from pdsr_cli.quiet import LOG_ENV, QUIET_ENV, quiet_engine_args
    from pdsr_sdk.rollout.config import RolloutConfig

    cfg = RolloutConfig(ray={"address": "local", "env_vars": {"VLLM_LOGGING_LEVEL": "DEBUG"}})
    quiet = quiet_engine_args(cfg, quiet=True).ray.env_vars
    assert quiet["VLLM_LOGGING_LEVEL"] == "DEBUG" and quiet["PYTHONWARNINGS"] == QUIET_ENV["PYTHONWARNINGS"]
    assert quiet_engine_args(cfg).ray.env_vars == {**LOG_ENV, "VLLM_LOGGING_LEVEL": "DEBUG"}
    assert quiet_engine_args(RolloutConfig()).ray is None



def test_patched_environ_restores_changed_and_removes_added_keys(monkeypatch):
    from pdsr_sdk.environ import patched_environ

    monkeypatch.setenv("PDSR_TEST_KEPT", "before")
    monkeypatch.delenv("PDSR_TEST_ADDED", raising=False)
    with pytest.raises(RuntimeError), patched_environ({"PDSR_TEST_KEPT": "inside", "PDSR_TEST_ADDED": "x"}):
        assert os.environ["PDSR_TEST_KEPT"] == "inside" and os.environ["PDSR_TEST_ADDED"] == "x"
        raise RuntimeError   # restored on the way out of a failing block too
    assert os.environ["PDSR_TEST_KEPT"] == "before" and "PDSR_TEST_ADDED" not in os.environ


def test_python_dash_m_runs_the_cli():
    """``python -m pdsr_cli`` is the ``pdsr`` command (for environments without the console script on PATH)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "pdsr_cli", "--help"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: pdsr ") and "rollout" in proc.stdout and "simulate" in proc.stdout
