"""``pdsr score`` in blocks of rows: a run killed (``kill -9``) or terminated (SIGTERM) mid-file keeps its
finished blocks, ``--resume`` scores only the rest and ends with the file an uninterrupted run writes
(bit-identical log-probs on the CPU), and a resume whose settings or input differ is refused, naming them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from pdsr_cli.main import cli  # noqa: E402
from support import ROOT, interrupt_at_call  # noqa: E402
from tiny_scoring import random_samples  # noqa: E402

# the CLI in a process of its own, killed (SIGKILL: no clean-up runs) as it starts scoring block 2
KILLED_AT_BLOCK_2 = textwrap.dedent("""
    import os, signal, sys
    import pdsr_sdk.scoring.file_run as file_run
    from pdsr_cli.main import cli

    score, calls = file_run.score_checked, []

    def killed(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return score(*args, **kwargs)

    file_run.score_checked = killed
    cli(sys.argv[1:], prog_name="pdsr")
""")


@pytest.fixture()
def data(tmp_path):
    prompts, responses = random_samples(7, 40, max_prompt=20, max_completion=40)
    responses[5] = []   # a failed sample
    path = tmp_path / "traj.parquet"
    pq.write_table(pa.table({"prompt_token_ids": prompts, "response_token_ids": responses,
                             "uid": [f"u{i}" for i in range(40)]}), path)
    return path


def args(model, data, out, *extra):
    return ["score", "--model", model, "--data", data, "--out", out, "--device", "cpu", "--dtype", "float32",
            "--max-tokens-per-mb", 256, "--block-tokens", 200, *extra]


def invoke(*argv):
    return CliRunner().invoke(cli, [str(a) for a in argv], catch_exceptions=False)


def same_file(a, b):
    """Equal columns, the log-probs bit for bit."""
    ta, tb = pq.read_table(a), pq.read_table(b)
    assert ta.column_names == tb.column_names and ta.num_rows == tb.num_rows
    for name in ta.column_names:
        assert ta.column(name).to_pylist() == tb.column(name).to_pylist(), name
    flat = [np.asarray(t.column("ref_logps").combine_chunks().flatten()) for t in (ta, tb)]
    assert flat[0].dtype == np.float32 and np.array_equal(flat[0].view(np.int32), flat[1].view(np.int32))


@pytest.fixture()
def whole(tmp_path, tiny_model_dir, data):
    out = tmp_path / "whole" / "scored.parquet"
    res = invoke(*args(tiny_model_dir, data, out))
    assert res.exit_code == 0, res.output
    return out


def test_killed_run_resumes_to_the_uninterrupted_file(tmp_path, tiny_model_dir, data, whole):
    out = tmp_path / "scored.parquet"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    killed = subprocess.run([sys.executable, "-c", KILLED_AT_BLOCK_2, *map(str, args(tiny_model_dir, data, out))],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    parts = tmp_path / "scored.parquet.parts"
    assert sorted(p.name for p in parts.iterdir() if not p.name.startswith(".")) == \
        ["block-00000.parquet", "block-00001.parquet"]
    assert not out.exists()
    kept = sum(pq.read_metadata(p).num_rows for p in parts.glob("block-*.parquet"))

    again = invoke(*args(tiny_model_dir, data, out))   # without --resume: says what to do
    assert again.exit_code == 2 and "left 2 finished block(s)" in again.output and "--resume" in again.output

    resumed = invoke(*args(tiny_model_dir, data, out, "--resume"))
    assert resumed.exit_code == 0, resumed.output
    assert f"wrote {out}: 40 rows ({kept} of them scored before the resume)" in resumed.output
    same_file(out, whole)
    assert not parts.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["scored.parquet", "traj.parquet",
                                                                                  "whole"]
    done = invoke(*args(tiny_model_dir, data, out, "--resume"))
    assert done.exit_code == 0 and f"nothing left to score: {out} has all 40 rows" in done.output
    table = pq.read_table(data)   # rows added to the input since: not "nothing left"
    pq.write_table(pa.concat_tables([table, table.slice(0, 3)]), data)
    grown = invoke(*args(tiny_model_dir, data, out, "--resume"))
    assert grown.exit_code == 2 and "finished on 40 rows, but the input (--data) has 43 now" in grown.output


def test_sigterm_keeps_the_finished_blocks_and_says_how_to_go_on(tmp_path, tiny_model_dir, data, whole, monkeypatch):
    from pdsr_sdk.scoring import file_run

    score, calls = file_run.score_checked, []

    def preempted(*a, **k):   # SIGTERM arrives as block 1 starts: handled, the block is not written
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return score(*a, **k)

    out = tmp_path / "scored.parquet"
    monkeypatch.setattr(file_run, "score_checked", preempted)
    stopped = invoke(*args(tiny_model_dir, data, out))
    monkeypatch.setattr(file_run, "score_checked", score)
    assert stopped.exit_code == 143
    assert "terminated (SIGTERM): 1 of " in stopped.output and "continue with --resume" in stopped.output
    assert [p.name for p in (tmp_path / "scored.parquet.parts").iterdir()] == ["block-00000.parquet"]
    resumed = invoke(*args(tiny_model_dir, data, out, "--resume"))
    assert resumed.exit_code == 0, resumed.output
    same_file(out, whole)


def _interrupted(tmp_path, tiny_model_dir, data, monkeypatch):
    """A run stopped (Ctrl-C) as block 2 starts: blocks 0 and 1 on disk."""
    from pdsr_sdk.scoring import file_run

    out = tmp_path / "scored.parquet"
    score = interrupt_at_call(monkeypatch, file_run, "score_checked", 3)
    assert invoke(*args(tiny_model_dir, data, out)).exit_code == 130
    monkeypatch.setattr(file_run, "score_checked", score)
    return out


@pytest.mark.parametrize("flags,says", [
    (["--temperature", 0.7], "temperature (--temperature) is 0.7 now but was 1.0"),
    (["--column", "old_logps", "--entropy"], "column (--column) is 'old_logps' now but was 'ref_logps'; entropy "
                                             "(--entropy) is True now but was False"),
    (["--block-tokens", 300], "block_tokens (--block-tokens) is 300 now but was 200"),
])
def test_a_resume_with_other_settings_is_refused_naming_them(tmp_path, tiny_model_dir, data, monkeypatch, flags, says):
    out = _interrupted(tmp_path, tiny_model_dir, data, monkeypatch)
    res = invoke(*args(tiny_model_dir, data, out, "--resume"), *flags)
    assert res.exit_code == 2 and res.output.startswith("error: ") and says in res.output, res.output
    assert "--resume continues a run made with other settings" in res.output and "--overwrite" in res.output


def test_a_resume_may_change_what_its_scoring_does_not_read(tmp_path, tiny_model_dir, data, whole, monkeypatch):
    """Unpacked (the CPU's rule), --packed-attention is not read: a resume with it was refused ("packed_attention
    (--packed-attention) is 'model' now but was 'varlen'"); it now ends with the uninterrupted run's file."""
    out = _interrupted(tmp_path, tiny_model_dir, data, monkeypatch)
    res = invoke(*args(tiny_model_dir, data, out, "--resume", "--packed-attention", "model"))
    assert res.exit_code == 0, res.output
    same_file(out, whole)


def test_a_resume_with_another_model_or_changed_input_is_refused(tmp_path, tiny_model_dir, data, monkeypatch):
    import shutil

    out = _interrupted(tmp_path, tiny_model_dir, data, monkeypatch)
    other = tmp_path / tiny_model_dir.name   # same name, other weights (another checkpoint)
    shutil.copytree(tiny_model_dir, other)
    weights = next(other.glob("*.safetensors"))
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 1
    weights.write_bytes(bytes(raw))
    res = invoke(*args(other, data, out, "--resume"))
    assert res.exit_code == 2 and "model (--model) is " in res.output and "(weights " in res.output, res.output

    table = pq.read_table(data)
    uid = table.column("uid").to_pylist()
    uid[1] = "changed"
    pq.write_table(table.set_column(2, "uid", pa.array(uid)), data)
    res = invoke(*args(tiny_model_dir, data, out, "--resume"))
    assert res.exit_code == 2 and "block-00000.parquet: its rows 0-" in res.output, res.output
    assert "input changed" in res.output

    res = invoke(*args(tiny_model_dir, data, out, "--resume", "--overwrite"))
    assert res.exit_code == 2 and ("resume (--resume) and overwrite (--overwrite) are exclusive: --resume continues "
                                   "the run in <out>") in res.output
    res = invoke(*args(tiny_model_dir, data, out, "--overwrite"))   # starts over
    assert res.exit_code == 0 and "wrote" in res.output and "before the resume" not in res.output
    assert pq.read_table(out).column("uid").to_pylist()[1] == "changed"
