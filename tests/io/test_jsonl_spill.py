"""A streamed JSONL file is parsed once: the plan keeps each batch's columns in a temporary file, and the batches
are read from it (pdsr score read a 163 MB file three times: plan, row check, blocks). Only batches converted to
another type than the file's (a float after ints, text after numbers, an object's fields growing) are parsed
again, up to the last of them; the batches are still read_table's table, and are what was planned if the file
changes afterwards."""

from __future__ import annotations

import json
import os
import tempfile

import pyarrow as pa
import pytest

from pdsr_sdk.errors import DataError
from pdsr_sdk.io import blocks, json_stream
from pdsr_sdk.io.blocks import open_table_batches
from pdsr_sdk.io.tables import read_table

LINES = 50
BATCH = 4


@pytest.fixture
def parsed(monkeypatch):
    """The lines parsed so far (json_stream's reads of the file), with batches of 4 lines planned."""
    monkeypatch.setattr(blocks, "BATCH_ROWS", BATCH)
    seen = []
    real = json_stream.json_lines

    def counting(path):
        for item in real(path):
            seen.append(item[0])
            yield item

    monkeypatch.setattr(json_stream, "json_lines", counting)
    return seen


def _rows(change_at=None, change=None):
    """Rollout-like rows; from line ``change_at`` (1-based) on, ``change`` is merged into each."""
    rows = []
    for i in range(LINES):
        row = {"prompt_token_ids": list(range(i % 7 + 1)), "response_token_ids": [i] * (i % 5), "reward": i / 4,
               "answer": [18, "\\frac{1}{2}"][i % 2], "mask": None if i < 20 else [1] * (i % 5), "n": i}
        if i == 33:
            row["late"] = {"turn": 2}
        if change_at is not None and i + 1 >= change_at:
            row.update(change)
        rows.append(row)
    return rows


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _read_twice(source):
    """All columns in batches of 7, then two columns in batches of 100: each joined."""
    whole = pa.concat_tables(source.batches(rows=7))
    two = pa.concat_tables(source.batches(["n", "answer"], rows=100))
    return whole, two


def test_a_file_of_settled_types_is_parsed_once(tmp_path, parsed):
    """Columns of token lists, floats, numbers and strings mixed from line 1, a column null up to line 20 and a
    key first on line 34: planning parses each line once, and the batches, read twice, parse none."""
    path = _write(tmp_path / "in.jsonl", _rows())
    source = open_table_batches(path)
    assert parsed == list(range(1, LINES + 1))
    whole, two = _read_twice(source)
    assert parsed == list(range(1, LINES + 1))
    expected = read_table(path)
    assert whole.equals(expected) and whole.schema.equals(expected.schema)
    assert two.equals(expected.select(["n", "answer"]))
    assert whole.column("answer").to_pylist()[:2] == ["18", "\\frac{1}{2}"]


CHANGES = {   # (line the change starts on, what changes, the last line read again: the last of the batches (of 4
    # lines) before the one the change is in, which takes the file's type; none where the type stays)
    "a float after ints": (30, {"n": 0.5}, 28),
    "text after numbers": (10, {"reward": "n/a"}, 8),
    "an object's fields growing": (40, {"late": {"turn": 1, "tool": "search"}}, 36),
    "ints after floats": (30, {"reward": 3}, 0),
}


@pytest.mark.parametrize("case", CHANGES)
def test_batches_typed_otherwise_are_parsed_again_up_to_the_last(tmp_path, parsed, case):
    line, change, last = CHANGES[case]
    path = _write(tmp_path / "in.jsonl", _rows(line, change))
    source = open_table_batches(path)
    assert parsed == list(range(1, LINES + 1)) + list(range(1, last + 1))
    whole, two = _read_twice(source)
    assert len(parsed) == LINES + last
    expected = read_table(path)
    assert whole.equals(expected) and whole.schema.equals(expected.schema)
    assert two.equals(expected.select(["n", "answer"]))


def test_the_batches_are_the_file_as_planned(tmp_path):
    """The file rewritten, then removed, after open_table_batches: the batches are what it held then."""
    path = _write(tmp_path / "in.jsonl", _rows())
    expected = read_table(path)
    source = open_table_batches(path)
    _write(path, [{"other": 1}])
    assert pa.concat_tables(source.batches()).equals(expected)
    path.unlink()
    assert pa.concat_tables(source.batches(rows=3)).equals(expected)


def test_the_temporary_file_leaves_nothing_and_names_its_folder(tmp_path, monkeypatch):
    """The copy lies in the temporary folder without a name; a folder it cannot be written in is an error naming
    the input, the folder and TMPDIR."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    path = _write(tmp_path / "in.jsonl", _rows())
    source = open_table_batches(path, setting="--data")
    assert os.listdir(folder) == [] and sum(b.num_rows for b in source.batches()) == LINES
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    with pytest.raises(DataError) as caught:
        open_table_batches(path, setting="--data")
    assert str(caught.value) == (f"--data {path}: cannot write the temporary copy of its rows in {tmp_path / 'gone'} "
                                 f"(No such file or directory); set TMPDIR to a folder with room for about a third "
                                 f"of the file's size")
