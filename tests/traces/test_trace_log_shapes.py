"""Logs in shapes `pdsr trace convert` does not read as they are (docs/simulate.md#your-own-logs): the docs' Python
snippets turn them into one row per response, and a log read wrongly (one row per prompt) is warned about."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.traces import read_trace
from support import ROOT

#: one row per prompt: its responses' lengths and scores in lists (groups of unequal size)
WIDE = {"uid": ["a", "b", "c"], "response_lengths": [[10, 11, 12], [20, 21], [30, 31]],
        "scores": [[1.0, 0.0, 0.0], [0.0, 1.0], [1.0, 1.0]]}


def _snippet(marker: str) -> str:
    """The python block of docs/simulate.md that follows the first line holding ``marker``."""
    text = (ROOT / "docs" / "simulate.md").read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index(marker):], re.S)
    assert block, f"no python block after {marker!r} in docs/simulate.md"
    return textwrap.dedent(block.group(1))


def _run_snippet(code: str, cwd) -> None:
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _convert(src, out, *flags):
    return CliRunner().invoke(cli, ["trace", "convert", str(src), *flags, "--out", str(out)])


def test_one_row_per_prompt_read_as_is_warns_and_the_docs_explode_makes_the_groups(tmp_path):
    # two row groups: list_parent_indices must count rows over the whole file, not per chunk
    pq.write_table(pa.table(WIDE), tmp_path / "gen.parquet", row_group_size=2)
    result = _convert(tmp_path / "gen.parquet", tmp_path / "as_is.jsonl", "--length-column", "response_lengths")
    assert result.exit_code == 0, result.output
    assert read_trace(tmp_path / "as_is.jsonl").lengths.tolist() == [3, 2, 2]   # each list counted as token ids
    assert "warning: every prompt has one sample" in result.stderr
    assert "docs/simulate.md#your-own-logs" in result.stderr

    _run_snippet(_snippet("One row per prompt with its responses in lists"), tmp_path)
    result = _convert(tmp_path / "responses.parquet", tmp_path / "trace.jsonl")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
    trace = read_trace(tmp_path / "trace.jsonl")
    assert trace.prompt_ids == WIDE["uid"]
    assert [trace.lengths[a:b].tolist() for a, b in zip(trace.offsets[:-1], trace.offsets[1:])] == \
        WIDE["response_lengths"]
    assert [trace.rewards[a:b].tolist() for a, b in zip(trace.offsets[:-1], trace.offsets[1:])] == WIDE["scores"]


def test_a_unique_id_per_response_is_warned_about(tmp_path):
    rows = [{"request_id": f"r{i}", "uid": f"p{i // 2}", "response_length": 5 + i} for i in range(6)]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    wrong = _convert(tmp_path / "log.jsonl", tmp_path / "wrong.jsonl", "--id-column", "request_id")
    assert wrong.exit_code == 0 and "warning: every prompt has one sample" in wrong.stderr
    right = _convert(tmp_path / "log.jsonl", tmp_path / "right.jsonl", "--id-column", "uid")
    assert right.exit_code == 0 and "warning" not in right.stderr
    assert read_trace(tmp_path / "right.jsonl").group_sizes.tolist() == [2, 2, 2]


def test_an_id_column_the_same_on_every_row_is_warned_about(tmp_path):
    """A run's or model's name taken for the prompt id makes one group of every response: convert says so, and what it
    and simulate print count it as one group."""
    rows = [{"model": "qwen-7b", "uid": f"p{i // 4}", "response_length": 5 + i} for i in range(12)]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    wrong = _convert(tmp_path / "log.jsonl", tmp_path / "wrong.jsonl", "--id-column", "model")
    assert wrong.exit_code == 0 and "wrote" in wrong.stdout and ": 1 group, 12 samples each" in wrong.stdout
    assert "warning: every response has the prompt id 'qwen-7b', so the trace is one group" in wrong.stderr
    assert read_trace(tmp_path / "wrong.jsonl").group_sizes.tolist() == [12]
    right = _convert(tmp_path / "log.jsonl", tmp_path / "right.jsonl", "--id-column", "uid")
    assert right.exit_code == 0 and "warning" not in right.stderr and ": 3 groups, 4 samples each" in right.stdout
    sim = CliRunner().invoke(cli, ["simulate", "--trace", str(tmp_path / "wrong.jsonl"), "--quiet", "--no-timeline"])
    assert sim.exit_code == 0 and ": 1 group, 12 samples in 1 batch(es) of 128 prompts (the trace holds only 1 group:" \
        in sim.output
