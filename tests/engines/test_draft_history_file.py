"""``--draft-history FILE``: :meth:`DraftHistory.read` reads only the three columns it keeps, a block of rows at a
time, from a rollout output that also holds log-probs and text, and keeps what the rows say."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from pdsr_sdk.engines.group_drafter import DraftHistory
from pdsr_sdk.errors import DataError
from pdsr_sdk.io.blocks import BATCH_ROWS
from support import record_parquet_columns, write_table_as

ROWS = 2 * BATCH_ROWS + 50
PROMPTS = 30
SETTING = "speculative_settings.history_file (--draft-history)"


def _rollout(rows: int = ROWS) -> pa.Table:
    """A rollout output's shape: prompts' and responses' token ids (some empty, some null), finish reasons of every
    kind, heavy columns."""
    rng = np.random.default_rng(3)
    prompts = [[p, p + 1, 7] for p in range(PROMPTS)]
    lengths = rng.integers(0, 12, rows)
    return pa.table({
        "prompt_id": [f"p{i % PROMPTS}" for i in range(rows)],
        "prompt_token_ids": pa.array([prompts[i % PROMPTS] for i in range(rows)], pa.list_(pa.int32())),
        "response_token_ids": pa.array([None if i % 97 == 5 else rng.integers(0, 50, n).tolist()
                                        for i, n in enumerate(lengths)], pa.list_(pa.int32())),
        "response_logprobs": pa.array([[-1.0] * n for n in lengths], pa.list_(pa.float32())),
        "response_text": ["t" * int(n) for n in lengths],
        "finish_reason": rng.choice(["stop", "length", "truncated", "failed", "dropped"], rows).tolist()})


def _kept_by_hand(table: pa.Table, per_prompt: int) -> tuple[dict[tuple, list[list[int]]], int]:
    """Each prompt's last ``per_prompt`` responses that neither failed, were dropped nor are empty or null, and
    their count."""
    kept: dict[tuple, list[list[int]]] = {}
    count = 0
    for row in table.to_pylist():
        if row["finish_reason"] not in ("failed", "dropped") and row["response_token_ids"]:
            kept.setdefault(tuple(row["prompt_token_ids"]), []).append(row["response_token_ids"])
            count += 1
    return {k: v[-per_prompt:] for k, v in kept.items()}, count


@pytest.mark.parametrize("name", ["out.parquet", "out.arrow", "out.jsonl"])
def test_the_history_read_is_what_the_rows_say(tmp_path, name):
    table = _rollout()
    path = write_table_as(table, tmp_path / name, name.split(".")[1])
    history = DraftHistory(3)
    expected, count = _kept_by_hand(table, 3)
    assert history.read(path, SETTING) == count
    assert len(expected) == PROMPTS
    for prompt, responses in expected.items():
        assert history.responses(SimpleNamespace(prompt_token_ids=list(prompt))) == responses
    assert history.tokens == sum(len(r) for rs in expected.values() for r in rs)


def test_only_the_three_columns_are_read(tmp_path, monkeypatch):
    path = write_table_as(_rollout(), tmp_path / "out.parquet", "parquet")
    asked = record_parquet_columns(monkeypatch)
    assert DraftHistory(2).read(path, SETTING) > 0
    assert asked == [["prompt_token_ids", "response_token_ids", "finish_reason"]]


def test_errors_name_the_file_its_columns_and_the_flag(tmp_path):
    path = write_table_as(_rollout(10).drop(["response_token_ids"]), tmp_path / "out.parquet", "parquet")
    with pytest.raises(DataError, match=r"out\.parquet: missing column\(s\) 'response_token_ids'; the file has: "
                                        r"prompt_id, prompt_token_ids, response_logprobs, response_text, "
                                        r"finish_reason$"):
        DraftHistory(2).read(path, SETTING)
    with pytest.raises(DataError, match=r"--draft-history\).*none\.parquet.*does not exist"):
        DraftHistory(2).read(tmp_path / "none.parquet", SETTING)


@pytest.mark.parametrize("column, values, said", [
    ("response_token_ids", pa.array(["12 13"] * 10), "is string; expected lists of token ids (integers)"),
    ("response_token_ids", pa.array([[1.5]] * 10), "is list<element: double>; expected lists of token ids (integers)"),
    ("prompt_token_ids", pa.array(["what is 2+2?"] * 10), "is string; expected lists of token ids (integers)"),
    ("finish_reason", pa.array([1] * 10), "is int64; expected text (stop, length, failed, ...)"),
])
def test_a_column_of_another_type_is_named_with_the_flag(tmp_path, column, values, said):
    """Read as they were, text token ids failed deep in the read, a prompt's text was split into characters (a key
    no group's prompt matches) and float ids were cut to integers."""
    table = _rollout(10)
    table = table.set_column(table.schema.get_field_index(column), column, values)
    path = write_table_as(table, tmp_path / "out.parquet", "parquet")
    with pytest.raises(DataError) as info:
        DraftHistory(2).read(path, SETTING)
    assert str(info.value) == f"{SETTING} {path}: column {column!r} {said}, as pdsr rollout writes it"


def test_a_null_token_id_is_named_by_its_row_past_the_first_block(tmp_path):
    table = _rollout()
    ids = table["response_token_ids"].to_pylist()
    row = BATCH_ROWS + 9
    ids[row] = [4, None]
    table = table.set_column(2, "response_token_ids", pa.array(ids, pa.list_(pa.int32())))
    path = write_table_as(table, tmp_path / "out.parquet", "parquet")
    with pytest.raises(DataError) as info:
        DraftHistory(2).read(path, SETTING)
    assert str(info.value) == f"{SETTING} {path}: column 'response_token_ids' row {row} has an empty (null) token id"


def test_a_null_prompt_is_named_by_its_row_where_its_response_is_kept(tmp_path):
    table = _rollout(12)
    prompts, reasons = table["prompt_token_ids"].to_pylist(), ["stop"] * 12
    prompts[3], reasons[3] = None, "failed"          # skipped: no prompt needed
    prompts[7] = None
    ids = table["response_token_ids"].to_pylist()
    ids[7] = [1, 2]
    table = table.set_column(1, "prompt_token_ids", pa.array(prompts, pa.list_(pa.int32())))
    table = table.set_column(2, "response_token_ids", pa.array(ids, pa.list_(pa.int32())))
    table = table.set_column(5, "finish_reason", pa.array(reasons))
    path = write_table_as(table, tmp_path / "out.parquet", "parquet")
    with pytest.raises(DataError) as info:
        DraftHistory(2).read(path, SETTING)
    assert str(info.value) == (f"{SETTING} {path}: column 'prompt_token_ids' row 7 is empty (null); expected the "
                               f"prompt's token ids")
