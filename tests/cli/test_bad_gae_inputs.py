"""Bad input to ``pdsr gae``: non-finite or non-numeric columns, a reward no token can carry, a missing or
existing or unwritable output; each case names the file, column, row or flag, and leaves what is on disk unchanged."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from cli_checks import failed, invoke
from pdsr_cli.main import cli


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


@pytest.mark.parametrize("column", ["rewards", "values", "response_mask"])
def test_gae_a_list_of_text_names_the_column(tmp_path, column):
    row = {"rewards": [0.0, 1.0], "values": [0.5, 0.25], "response_mask": [1, 1]}
    row[column] = ["a", "b"]
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([row]), path)
    failed(invoke("gae", "--data", path, "--out", tmp_path / "o.parquet"),
           f"{path}: column {column!r} must be a list of numbers per row, got list<", "string>")


def test_gae_a_reward_no_token_can_carry_is_named(tmp_path):
    """A scalar reward goes on its row's last valid token; a row with none loses it, and the command says so
    (a reward of 0 loses nothing and is not named)."""
    path, out = tmp_path / "in.parquet", tmp_path / "o.parquet"
    rows = [{"rewards": r, "values": [0.0, 0.0], "response_mask": m}
            for r, m in ((1.0, [1, 1]), (2.0, [0, 0]), (0.0, [0, 0]), (-1.0, [0, 0]))]
    pq.write_table(pa.Table.from_pylist(rows), path)
    res = CliRunner().invoke(cli, ["gae", "--data", str(path), "--out", str(out), "--lam", "1"])
    assert res.exit_code == 0, res.output
    assert ("warning: 2 row(s) have a reward but no valid token to carry it (the response is empty or its "
            "response_mask is all 0), so it is in no advantage: row 1, 3") in res.output
    adv = pq.read_table(out).column("advantages").to_pylist()
    assert adv[0] == [1.0, 1.0] and adv[1] == adv[3] == [0.0, 0.0]
    res = CliRunner().invoke(cli, ["gae", "--data", str(path), "--out", str(out), "--overwrite", "--mask-column", ""])
    assert res.exit_code == 0 and "warning" not in res.output, res.output


def test_gae_without_a_mask_names_an_empty_response_as_the_reason(tmp_path):
    """Without a mask column only an empty response has no token for its reward: the warning said "(their mask
    is all 0)", of a mask the run did not have."""
    path, out = tmp_path / "in.parquet", tmp_path / "o.parquet"
    rows = [{"rewards": r, "values": v} for r, v in ((1.0, [0.0, 0.0]), (2.0, []))]
    pq.write_table(pa.Table.from_pylist(rows), path)
    res = CliRunner().invoke(cli, ["gae", "--data", str(path), "--out", str(out), "--mask-column", ""])
    assert res.exit_code == 0, res.output
    assert ("warning: 1 row(s) have a reward but no valid token to carry it (the response is empty), so it is in "
            "no advantage: row 1") in res.output


def test_gae_existing_out_needs_overwrite(tmp_path, gae_input):
    path, _ = gae_input
    out = tmp_path / "out.parquet"
    out.write_bytes(b"an earlier result")
    failed(invoke("gae", "--data", path, "--out", out), str(out), "already exists", "--overwrite")
    assert out.read_bytes() == b"an earlier result"
    assert invoke("gae", "--data", path, "--out", out, "--overwrite").exit_code == 0
    assert pq.read_table(out).column_names[-2:] == ["advantages", "returns"]


def test_gae_without_data_or_out_names_the_flag(tmp_path, gae_input):
    path, _ = gae_input
    failed(invoke("gae", "--data", path), "--out is required (or 'out:' in the --config file)")
    failed(invoke("gae", "--out", tmp_path / "o.parquet"), "--data is required (or 'data:' in the --config file)")
    cfg = tmp_path / "gae.yaml"   # the file may give them instead
    cfg.write_text(f"data: {path}\nout: {tmp_path / 'o.parquet'}\n")
    assert invoke("gae", "--config", cfg).exit_code == 0 and (tmp_path / "o.parquet").exists()


def test_gae_unwritable_out_fails_before_computing(tmp_path, gae_input, monkeypatch):
    from pdsr_sdk.gae import file_run

    path, _ = gae_input
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a folder must be")
    monkeypatch.setattr(file_run, "open_table_batches",
                        lambda *a, **k: pytest.fail("read the input before checking --out"))
    failed(invoke("gae", "--data", path, "--out", blocker / "out.parquet"), "--out", "blocker", "is a file")
    failed(invoke("gae", "--data", path, "--out", tmp_path), "--out", "is a directory")
    assert blocker.read_text() == "a file where a folder must be"


def test_gae_a_missing_or_empty_data_input_names_the_flag(tmp_path):
    out = tmp_path / "o.parquet"
    failed(invoke("gae", "--data", tmp_path / "nope.parquet", "--out", out), "data (--data)")
    (tmp_path / "empty").mkdir()
    failed(invoke("gae", "--data", tmp_path / "empty", "--out", out), "data (--data)")
    assert not out.exists()


def test_gae_a_file_of_empty_responses_gives_empty_advantages(tmp_path):
    """Every response empty (a batch of failed samples): a JSON reader types the columns list<null>, which was
    refused ("column 'values' must be a list of numbers per row, got list<item: null>"); each row now gets its
    empty advantages and returns, as the same file typed list<float> does."""
    outs = []
    for typed in (False, True):
        path, out = tmp_path / f"in{typed}.parquet", tmp_path / f"o{typed}.parquet"
        kind = pa.list_(pa.float32()) if typed else pa.list_(pa.null())
        pq.write_table(pa.table({"rewards": [0.0, 0.0], "values": pa.array([[], []], kind),
                                 "response_mask": pa.array([[], []], kind)}), path)
        res = CliRunner().invoke(cli, ["gae", "--data", str(path), "--out", str(out)])
        assert res.exit_code == 0, res.output
        outs.append([pq.read_table(out).column(c).to_pylist() for c in ("advantages", "returns")])
    assert outs[0] == outs[1] == [[[], []], [[], []]]
