"""A reward of the user's that never returns, without reward_time_limit_s: the run waits on it; stopped (SIGTERM, as
a scheduler's preemption), the process ends, its finished groups kept. Before, the reward's thread (or worker
process) was joined at interpreter exit: the run said it was terminated and the process never exited. Fake engines
(fakes:LoopEngine, no vLLM), ``pdsr rollout`` as a process of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from support import ROOT, WAIT_S

HANGS = """
import pathlib, threading

def reward(text, ground_truth, prompt_id, **info):
    if prompt_id == "q3":
        pathlib.Path(__file__).with_name("hanging").touch()
        threading.Event().wait()   # forever
    return 1.0
"""


def _wait_for(pred, proc):
    end = time.monotonic() + WAIT_S
    while not pred():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < end, "the run never reached the hanging reward"
        time.sleep(0.1)


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_a_run_stuck_in_a_hung_reward_ends_when_terminated(tmp_path, tiny_model_dir, executor):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i}+1?"}) + "\n" for i in range(5)))
    (tmp_path / "hangs.py").write_text(HANGS)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({
        "model": str(tiny_model_dir), "policy": "baseline", "sampling": {"n": 2, "max_tokens": 8},
        "output": {"flush_groups": 1}, "reward": f"{tmp_path / 'hangs.py'}:reward", "reward_executor": executor,
        "engines": [{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine", "max_model_len": 256}]}))
    out = tmp_path / "o.parquet"
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "pdsr_cli", "rollout", "--quiet", "--config", str(cfg), "--data",
                             str(prompts), "--batch-size", "2", "--out", str(out)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # batch 0 (q0, q1) is written before batch 1's q3 is scored: both are on disk once the reward hangs
        _wait_for(lambda: (tmp_path / "hanging").exists() and len(list(out.parent.glob("o.parquet.parts/part-*"))) >= 2,
                  proc)
        proc.send_signal(signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {WAIT_S:.0f} s after SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, output
    assert "terminated (SIGTERM):" in output and "rerun with --resume" in output
