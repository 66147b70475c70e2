"""A vLLM engine killed mid-run (SIGKILL of its engine-core process, as the kernel's OOM killer does): ``pdsr rollout``
on its one engine stops with an error naming the engine and the signal, says how many finished groups it kept and to
--resume, leaves no process behind, and the resumed run ends with every group once. Real CPU engines, the built-in
tiny model: the death and its detection are vLLM's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from process_checks import gone_within
from support import ROOT, WAIT_S, requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # two engine starts: 1-2 minutes
psutil = pytest.importorskip("psutil")

PROMPTS = 12


def _rollout(tmp_path, tiny_model_dir, *more: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)   # the engine core must be a process of its own
    # 6 batches of 2 x 2 samples of 200 tokens: after the first batch's groups are written, 5 batches are left
    # (a thousand sequential engine steps), so the kill below lands while the engine works
    cmd = [sys.executable, "-m", "pdsr_cli", "rollout", "--quiet", "--model", str(tiny_model_dir), "--data",
           str(tmp_path / "prompts.jsonl"), "--policy", "baseline", "--n", "2", "--batch-size", "2", "--max-tokens",
           "200", "--ignore-eos", "--out", str(tmp_path / "o.parquet"), *more]
    return subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen) -> str:
    try:
        return proc.communicate(timeout=WAIT_S)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"pdsr rollout still running {WAIT_S:.0f} s on: {proc.communicate()[0][-3000:]}")


def test_an_engine_killed_mid_run_stops_it_naming_the_engine_and_resume_finishes_it(tmp_path, tiny_model_dir):
    (tmp_path / "prompts.jsonl").write_text(
        "".join(json.dumps({"id": f"q{i:02d}", "prompt": f"What is {i}+1?"}) + "\n" for i in range(PROMPTS)))
    parts = tmp_path / "o.parquet.parts"
    proc = _rollout(tmp_path, tiny_model_dir)
    tree: list = []
    try:
        end = time.monotonic() + WAIT_S
        while not list(parts.glob("part-*.parquet")):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < end, "no group was written"
            time.sleep(0.05)
        tree = psutil.Process(proc.pid).children(recursive=True)
        cores = [p for p in tree if "EngineCore" in p.name()]
        assert len(cores) == 1, [p.name() for p in tree]
        cores[0].send_signal(signal.SIGKILL)
        output = _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, output[-3000:]
    error = next(line for line in output.splitlines() if line.startswith("error: "))
    assert error.startswith("error: engine 'fast-0': died and no live engine is left in pool 'fast'")
    assert error.count("exit status") == 1 and "(exit status -9: killed by SIGKILL)" in error
    kept = len(pq.read_table(parts).column("prompt_id").unique())
    assert 1 <= kept < PROMPTS
    assert f"{kept} finished groups of this run are on disk in {parts}/; rerun with --resume to continue" in output
    left = gone_within(tree, WAIT_S)   # the forked worker sees its core gone and ends
    for p in left:
        p.kill()
    assert not left, f"left running after the run ended: {[p.name() for p in left]}"

    resumed = _rollout(tmp_path, tiny_model_dir, "--resume")
    output = _finish(resumed)
    assert resumed.returncode == 0, output[-3000:]
    rows = pq.read_table(tmp_path / "o.parquet").to_pylist()
    keys = sorted((r["prompt_id"], r["sample_index"]) for r in rows)
    assert keys == sorted((f"q{i:02d}", s) for i in range(PROMPTS) for s in range(2))   # every group once
    assert sorted({r["batch_index"] for r in rows}) == list(range(PROMPTS // 2))
    assert not parts.exists()
