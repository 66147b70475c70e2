"""One resolver of input paths (pdsr_sdk.io.paths.resolve_inputs) for every table input and verl's dumps: a file, a
folder or a glob pattern, in name or step order, and one set of errors naming the path and the flag or key."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_checks import failed, invoke, write_jsonl
from pdsr_sdk.errors import DataError
from pdsr_sdk.io.blocks import open_table_batches
from pdsr_sdk.io.paths import resolve_inputs
from pdsr_sdk.io.tables import FORMATS, SAVE_TO_DISK_METADATA, read_table
from pdsr_sdk.traces.verl_dump import is_verl_dump, verl_dump_files


def _names(files):
    return [f.name for f in files]


def test_a_folder_and_a_pattern_in_name_or_step_order(tmp_path):
    for name in ("10.jsonl", "2.jsonl", "1.jsonl", "val.jsonl", ".hidden.jsonl", "README.md"):
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "sub.jsonl").mkdir()   # a folder named like a shard is no shard
    want_by_name = sorted(["10.jsonl", "2.jsonl", "1.jsonl", "val.jsonl"])
    assert _names(resolve_inputs(tmp_path, FORMATS)) == want_by_name == ["1.jsonl", "10.jsonl", "2.jsonl",
                                                                         "val.jsonl"]
    assert _names(resolve_inputs(tmp_path, FORMATS, order="step")) == ["1.jsonl", "2.jsonl", "10.jsonl", "val.jsonl"]
    assert _names(resolve_inputs(tmp_path / "*0.jsonl", FORMATS, order="step")) == ["10.jsonl"]
    assert _names(verl_dump_files(tmp_path)) == ["1.jsonl", "2.jsonl", "10.jsonl", "val.jsonl"]
    # a file is itself, whatever its name (its reader decides its format)
    assert resolve_inputs(tmp_path / "README.md", FORMATS) == [tmp_path / "README.md"]
    (tmp_path / "state.json").write_text("{}")
    assert "state.json" not in _names(resolve_inputs(tmp_path, FORMATS, ignore=SAVE_TO_DISK_METADATA))


def test_errors_name_the_setting_and_the_path(tmp_path):
    def error(path, **kw):
        with pytest.raises(DataError) as caught:
            resolve_inputs(path, FORMATS, what="prompt", setting="data.path (--data)", **kw)
        return str(caught.value)

    assert error(tmp_path / "gone.parquet") == (f"data.path (--data) {tmp_path / 'gone.parquet'}: prompt file does "
                                                "not exist")
    assert error(tmp_path / "val-*.parquet") == (f"data.path (--data) {tmp_path / 'val-*.parquet'}: prompt file does "
                                                 f"not exist, nor does the pattern match any")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert error(empty).endswith(f"{empty}: the folder must hold prompt files of one format "
                                 f"({', '.join(FORMATS)}); found none")
    (empty / "notes.txt").write_text("x")
    assert error(empty).endswith("found none")
    (empty / "a.parquet").write_bytes(b"")
    (empty / "b.csv").write_text("x\n")
    (empty / "c.parquet").write_bytes(b"")
    assert error(empty).endswith("found 2 parquet (a.parquet, ...); 1 csv (b.csv, ...)")
    assert error(empty / "*").endswith("the pattern must match prompt files of one format "
                                       f"({', '.join(FORMATS)}); found 2 parquet (a.parquet, ...); 1 csv (b.csv, ...)")


def test_a_leading_tilde_is_the_home_folder(tmp_path, monkeypatch):
    """A config file's value, or --data=~/x, reaches pdsr with its ~ (no shell expanded it)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "d" / "part-0.parquet")
    pq.write_table(pa.table({"x": [3]}), tmp_path / "d" / "part-1.parquet")
    for given in ("~/d", "~/d/part-*.parquet"):
        assert read_table(given).column("x").to_pylist() == [1, 2, 3]
    assert read_table("~/d/part-1.parquet").column("x").to_pylist() == [3]
    with pytest.raises(DataError, match=f"^{tmp_path}/gone.parquet: input file does not exist$"):
        read_table("~/gone.parquet")


def test_an_empty_table_file_is_said_to_be_empty(tmp_path):
    """A zero-byte Parquet file, or a JSONL of blank lines, was 'cannot read ... Parquet file size is 0 bytes' or
    'missing column(s) ...; the file has: (no columns)'."""
    for name, text, said in (("e.parquet", "", "is empty"), ("e.csv", "", "is empty"),
                             ("e.jsonl", "\n\n", "has only blank lines; expected a JSON object per line")):
        (tmp_path / name).write_text(text)
        with pytest.raises(DataError, match=f"^--data {tmp_path / name}: the scoring input file {said}$"):
            read_table(tmp_path / name, ["prompt_token_ids"], what="scoring input", setting="--data")


def test_cli_table_inputs_name_their_flag(tmp_path, tiny_model_dir):
    failed(invoke("score", "--model", tiny_model_dir, "--data", tmp_path / "gone.parquet", "--out",
                  tmp_path / "s.parquet", "--max-tokens-per-mb", 64),
           f"data (--data) {tmp_path / 'gone.parquet'}: scoring input file does not exist")
    (tmp_path / "blank.jsonl").write_text("\n")
    failed(invoke("score", "--model", tiny_model_dir, "--data", tmp_path / "blank.jsonl", "--out",
                  tmp_path / "s.parquet", "--max-tokens-per-mb", 64),
           f"data (--data) {tmp_path / 'blank.jsonl'}: the scoring input file has only blank lines")
    failed(invoke("rollout", "--quiet", "--model", tiny_model_dir, "--data", tmp_path / "gone-*.jsonl", "--out",
                  tmp_path / "o.parquet"),
           f"data.path (--data) {tmp_path / 'gone-*.jsonl'}: prompt file does not exist, nor does the pattern match")


def test_a_verl_dump_line_not_utf8_is_named_by_its_line(tmp_path, tiny_model_dir):
    """verl's dump reader said 'byte 0xe9 at offset N' (an offset into a read buffer); both readers of JSONL now
    name the line. A first file that is not UTF-8 is no dump: the table reader names its line the same way."""
    folder = tmp_path / "dump"
    folder.mkdir()
    row = {"input": "user\nWhat is 1+1?\nassistant\n", "output": "2", "gts": "2", "score": 1.0, "step": 1}
    write_jsonl(folder / "1.jsonl", [row, row])
    (folder / "2.jsonl").write_bytes((json.dumps({**row, "step": 2}) + "\n").encode() * 2
                                     + b'{"input": "caf\xe9", "output": "x", "score": 0, "step": 2}\n')
    assert is_verl_dump(folder)
    out = tmp_path / "t.jsonl"
    failed(invoke("trace", "convert", folder, "--tokenizer", tiny_model_dir, "--out", out),
           f"{folder / '2.jsonl'}:3: not UTF-8 text (byte 0xe9)")
    (folder / "1.jsonl").write_bytes(b'{"input": "caf\xe9", "output": "x", "score": 0, "step": 1}\n')
    assert not is_verl_dump(folder)
    failed(invoke("trace", "convert", folder, "--tokenizer", tiny_model_dir, "--out", out),
           f"{folder / '1.jsonl'}:1: not UTF-8 text (byte 0xe9)")


def test_a_folder_of_a_dump_and_other_tables_is_refused(tmp_path, tiny_model_dir):
    """verl's reader took a folder's .jsonl files and skipped the rest; as every table input, a folder must hold
    files of one format."""
    folder = tmp_path / "dump"
    folder.mkdir()
    row = {"input": "user\nWhat is 1+1?\nassistant\n", "output": "2", "gts": "2", "score": 1.0, "step": 1}
    write_jsonl(folder / "1.jsonl", [row, row])
    pq.write_table(pa.table({"uid": ["a"], "response_length": [3]}), folder / "lengths.parquet")
    failed(invoke("trace", "convert", folder, "--tokenizer", tiny_model_dir, "--out", tmp_path / "t.jsonl"),
           f"{folder}: the folder must hold rollout log files of one format", "found 1 jsonl (1.jsonl, ...); "
           "1 parquet (lengths.parquet, ...)")


@pytest.mark.parametrize("shape", ["parquet", "jsonl"])
def test_a_missing_column_names_the_flag_that_chose_it(tmp_path, shape):
    """A column asked for by a flag is named with it ('response_token_ids' was said alone, leaving the user to
    guess which flag picks it); both readers say the same, a column without a flag as before."""
    path = tmp_path / f"t.{shape}"
    if shape == "parquet":
        pq.write_table(pa.table({"a": [1]}), path)
    else:
        path.write_text('{"a": 1}\n')
    columns = {"a": "--a-column", "b": "--b-column", "c": "--c-column"}
    said = f"^{path}: missing column\\(s\\) 'b' \\(--b-column\\), 'c' \\(--c-column\\); the file has: a$"
    for read in (read_table, open_table_batches):
        with pytest.raises(DataError, match=said):
            read(path, columns)
        with pytest.raises(DataError, match=f"^{path}: missing column\\(s\\) 'b'; the file has: a$"):
            read(path, ["a", "b"])
