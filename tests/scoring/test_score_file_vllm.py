"""``pdsr score --backend vllm`` on a file in blocks: one engine for the whole file (the backend alone starts one
per call on a directory, sized to that call's longest sample), shut down at the end, and the file's log-probs
those of the torch backend. vLLM in a fresh process, as tests/scoring/test_scoring_vllm.py explains."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support import ROOT, requires_vllm
from tiny_scoring import random_samples

pytest.importorskip("torch")

SCRIPT = textwrap.dedent("""
    import sys
    import pdsr_sdk.scoring.vllm_backend as vb
    from pdsr_cli.main import cli

    make, shutdown = vb.make_engine, vb.shutdown_engine

    def counted_make(*a, **k):
        print("engine started, max_model_len", k.get("max_model_len"), file=sys.stderr)
        return make(*a, **k)

    def counted_shutdown(llm):
        print("engine shut down", file=sys.stderr)
        return shutdown(llm)

    vb.make_engine, vb.shutdown_engine = counted_make, counted_shutdown
    cli(sys.argv[1:], prog_name="pdsr")
""")


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_one_engine_scores_every_block_as_torch_does(tmp_path, tiny_model_dir):
    prompts, responses = random_samples(5, 24, max_prompt=30, max_completion=60)
    data = tmp_path / "traj.parquet"
    pq.write_table(pa.table({"prompt_token_ids": prompts, "response_token_ids": responses}), data)
    common = ["score", "--model", tiny_model_dir, "--data", data, "--dtype", "float32", "--block-tokens", 300,
              "--mbs", 4, "--quiet"]
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, common), "--backend", "vllm",
                           "--out", tmp_path / "vllm.parquet"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    longest = max(len(p) + len(r) for p, r in zip(prompts, responses))
    assert proc.stderr.count("engine started") == 1 and proc.stderr.count("engine shut down") == 1
    assert f"engine started, max_model_len {longest + 1}" in proc.stderr
    torch_run = subprocess.run([sys.executable, "-m", "pdsr_cli", *map(str, common), "--device", "cpu",
                                "--out", tmp_path / "torch.parquet"], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=600)
    assert torch_run.returncode == 0, torch_run.stderr[-4000:]
    got = pq.read_table(tmp_path / "vllm.parquet").column("ref_logps").to_pylist()
    want = pq.read_table(tmp_path / "torch.parquet").column("ref_logps").to_pylist()
    assert [len(g) for g in got] == [len(r) for r in responses]
    worst = max(float(np.max(np.abs(np.subtract(g, w)) / np.maximum(1.0, np.abs(w)))) for g, w in zip(got, want))
    assert worst <= 1e-5
