"""SIGTERM (``kill PID``, a scheduler's preemption) stops a command as Ctrl-C does: one line, exit 143, and no
half-written file beside its output (the temp file of the write it stopped is removed). The signal comes at a
set point: while the output's temp file is complete but not yet renamed over the output's name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support import ROOT

# the CLI in a process of its own (SIGTERM's default would end pytest), SIGTERM sent to itself just before the
# first atomic write renames its temp file over the output
TERMINATED_IN_A_WRITE = textwrap.dedent("""
    import os, signal, sys
    import pdsr_sdk.io.tables as tables
    from pdsr_cli.main import cli

    rename = os.replace

    def preempted(src, dst):
        os.kill(os.getpid(), signal.SIGTERM)
        rename(src, dst)

    tables.os = type("os", (), {"replace": staticmethod(preempted), "__getattr__": lambda self, k: getattr(os, k)})()
    cli(sys.argv[1:], prog_name="pdsr")
""")


def terminated(tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", TERMINATED_IN_A_WRITE, *map(str, args)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture()
def gae_input(tmp_path):
    path = tmp_path / "in" / "batch.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist([{"rewards": [0.0, 1.0], "values": [0.5, 0.25], "response_mask": [1, 1]}
                                         for _ in range(3)]), path)
    return path


@pytest.mark.parametrize("command", [
    ["trace", "synth", "--groups", 64, "--n", 4, "--seed", 0, "--out", "{out}/trace.jsonl"],
    ["gae", "--data", "{gae_input}", "--gamma", 1.0, "--lam", 0.95, "--out", "{out}/adv.parquet"],
    ["analyze", "{trace}", "--out-dir", "{out}"],
], ids=["trace-synth", "gae", "analyze"])
def test_sigterm_in_a_write_leaves_no_file_and_says_so(tmp_path, gae_input, command):
    out = tmp_path / "out"
    out.mkdir()
    trace = tmp_path / "in" / "trace.jsonl"
    trace.write_text("".join(json.dumps({"prompt_id": f"p{i}", "prompt_len": 5,
                                         "lengths": [10 + i, 20, 30 + i, 40]}) + "\n"
                             for i in range(8)))
    args = [str(a).format(out=out, gae_input=gae_input, trace=trace) for a in command]
    proc = terminated(tmp_path, *args)
    assert proc.returncode == 143, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip().splitlines()[-1] == "terminated (SIGTERM)" and "Traceback" not in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == []
