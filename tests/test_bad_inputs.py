"""Bad input and resumed runs: each case gives a clear error (naming the flag, file, row or key) before any work
starts, and leaves what is already on disk unchanged."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def failed(result, *needles):
    """The command failed cleanly (exit 2, one error line, no traceback) and its message has every needle."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "error: " in result.output.lower()
    for needle in needles:
        assert str(needle) in result.output, (needle, result.output)
    return result.output


def snapshot(*paths):
    return {p: p.read_bytes() for p in paths}


# --------------------------------------------------------------------------- pdsr gae

@pytest.fixture()
def gae_input(tmp_path):
    rows = [{"rewards": [0.0, 1.0], "values": [0.5, 0.25], "response_mask": [1, 1]} for _ in range(3)]
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path, rows


@pytest.mark.parametrize("column, value, where", [
    ("rewards", float("nan"), "row 1 token 1 is nan"),
    ("values", float("inf"), "row 1 token 1 is inf"),
])
def test_gae_non_finite_rewards_or_values_name_the_row(tmp_path, gae_input, column, value, where):
    path, rows = gae_input
    rows[1][column][1] = value
    pq.write_table(pa.Table.from_pylist(rows), path)
    out = tmp_path / "out.parquet"
    failed(invoke("gae", "--data", path, "--out", out, "--whiten"), "in.parquet", repr(column), where, "finite")
    assert not out.exists()


def test_gae_scalar_nan_reward_names_the_row(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([{"rewards": r, "values": [0.0, 0.0], "response_mask": [1, 1]}
                                         for r in (1.0, 0.0, float("nan"))]), path)
    failed(invoke("gae", "--data", path, "--out", tmp_path / "o.parquet"), "'rewards' row 2 is nan")


def test_gae_existing_out_needs_overwrite(tmp_path, gae_input):
    path, _ = gae_input
    out = tmp_path / "out.parquet"
    out.write_bytes(b"an earlier result")
    failed(invoke("gae", "--data", path, "--out", out), str(out), "already exists", "--overwrite")
    assert out.read_bytes() == b"an earlier result"
    assert invoke("gae", "--data", path, "--out", out, "--overwrite").exit_code == 0
    assert pq.read_table(out).column_names[-2:] == ["advantages", "returns"]


def test_gae_unwritable_out_fails_before_computing(tmp_path, gae_input, monkeypatch):
    from pdsr_sdk.gae import table

    path, _ = gae_input
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a folder must be")
    monkeypatch.setattr(table, "read_table", lambda *a, **k: pytest.fail("read the input before checking --out"))
    failed(invoke("gae", "--data", path, "--out", blocker / "out.parquet"), "--out", "blocker", "is a file")
    failed(invoke("gae", "--data", path, "--out", tmp_path), "--out", "is a directory")
    assert blocker.read_text() == "a file where a folder must be"


# --------------------------------------------------------------------------- --set POLICY:KEY=VALUE

TRACE = "examples/traces/synth_256x8.jsonl"


@pytest.mark.parametrize("flag", ["--set", "--policy-set"])
@pytest.mark.parametrize("item, what", [("v2:steal=false", "policy 'v2' is not selected"),
                                        ("v9:steal=false", "policy 'v9' is not a known policy")])
def test_simulate_setting_for_a_policy_not_selected(flag, item, what):
    from pathlib import Path

    trace = Path(__file__).parents[1] / TRACE
    out = failed(invoke("simulate", "--trace", trace, "--policy", "v3,v2.5", "--no-references", flag, item,
                        "--num-batches", 1, "--quiet"), f"{flag} {item.split('=')[0]}", what)
    assert "the selected policies are v3, v2.5" in out


def test_rollout_setting_for_a_policy_not_selected(tmp_path):
    out = tmp_path / "o.parquet"
    failed(invoke("rollout", "--policy", "v3", "--set", "v2.5:cap_multiplier=2", "--out", out),
           "--set v2.5:cap_multiplier: policy 'v2.5' is not selected; the selected policy is v3")
    assert not out.exists()
