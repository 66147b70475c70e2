"""A JSONL file's columns are every line's keys, in order of first appearance, as pyarrow.json reads them: a key
first written on a later line (an optional field a verl/OpenRLHF export leaves out of its first rows, a prompt
file whose first lines have no ground truth) is a column, null where a line lacks it, whether the file is read
whole or streamed, and what the commands read from it."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.json as pa_json
import pytest

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.blocks import BATCH_ROWS, open_table_batches
from pdsr_sdk.io.tables import read_table


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _streamed(path):
    """The batches of ``path`` (each checked to have the whole file's schema) joined."""
    source = open_table_batches(path)
    assert source.streamed
    parts = list(source.batches())
    assert all(p.schema.equals(source.schema) for p in parts)
    return pa.concat_tables(parts), parts


#: files pyarrow.json reads (one type per column), its table the reference
FILES = {
    "a key only on the last line": [{"a": i} for i in range(10)] + [{"a": 10, "late": "x"}],
    "a ground truth from line 3 on": [{"prompt": "1+1?"}, {"prompt": "2+2?"}, {"prompt": "3+3?", "answer": "6"}],
    "keys in another order on each line": [{"b": 1, "a": "x"}, {"c": [1.5], "a": "y"}, {"c": None, "d": True}],
    "an object whose keys grow": [{"m": {"x": 1}}, {"m": {"y": [2], "x": None}}, {"m": {"z": {"w": "s"}}}],
    "reward extras on some lines": [{"reward": 1.0}, {"reward": 0.0, "reward_extra": {"acc": 1.0}}, {"reward": 1.0}],
}


@pytest.mark.parametrize("case", FILES)
def test_columns_are_every_lines_keys_as_pyarrow_json_reads_them(tmp_path, case):
    path = _write(tmp_path / "in.jsonl", FILES[case])
    want = pa_json.read_json(io.BytesIO(path.read_bytes()))
    whole = read_table(path)
    assert whole.schema.equals(want.schema) and whole.to_pylist() == want.to_pylist()
    assert _streamed(path)[0].equals(whole)


@pytest.mark.parametrize("line", [2, 4097, 9999])
def test_a_key_on_one_line_of_ten_thousand_is_in_every_batch(tmp_path, line):
    """The key's line in the first batch (line 2), or in a later one: every batch has its column, of the whole
    file's type (here a struct whose field only that line has), null on every other line."""
    rows = [{"i": i, "meta": {"k": i}} for i in range(10_000)]
    rows[line - 1] = {**rows[line - 1], "only": [0.5], "meta": {"k": line, "deep": "x"}}
    path = _write(tmp_path / "in.jsonl", rows)
    whole = read_table(path)
    got, parts = _streamed(path)
    assert len(parts) == -(-10_000 // BATCH_ROWS) > 1
    assert got.equals(whole) and got.schema.equals(whole.schema, check_metadata=True)
    assert whole.column_names == ["i", "meta", "only"]
    assert whole.schema.field("only").type == pa.list_(pa.float64())
    assert whole.schema.field("meta").type == pa.struct([("k", pa.int64()), ("deep", pa.string())])
    only = whole.column("only").to_pylist()
    assert only[line - 1] == [0.5] and only.count(None) == 9_999
    assert [m["deep"] for m in whole.column("meta").to_pylist()].count(None) == 9_999


def test_a_late_keys_bad_value_names_its_line_in_both_paths(tmp_path):
    rows = [{"a": 1}] * 5000 + [{"a": 1, "b": 2}] + [{"a": 1}] * 10 + [{"a": 1, "b": [3]}]
    path = _write(tmp_path / "in.jsonl", rows)
    for read in (read_table, open_table_batches):
        with pytest.raises(DataError, match=rf"^{path}:5012: column 'b' is a list here but a number at {path}:5001"):
            read(path)


def test_a_column_a_command_needs_may_start_late(tmp_path):
    """open_table_batches checks a command's columns (pdsr score's) against the whole file's."""
    path = _write(tmp_path / "in.jsonl", [{"prompt_token_ids": [1]}, {"prompt_token_ids": [2],
                                                                     "response_token_ids": [3]}])
    source = open_table_batches(path, ("prompt_token_ids", "response_token_ids"))
    assert [b.to_pylist() for b in source.batches(["response_token_ids"])] == [[{"response_token_ids": None},
                                                                                  {"response_token_ids": [3]}]]


def test_pdsr_rollout_reads_a_ground_truth_from_line_3(tmp_path, tiny_model_dir):
    """The prompts before it have none (None), not the whole file."""
    from pdsr_sdk.rollout.config import DataConfig
    from pdsr_sdk.rollout.data import load_prompts, load_tokenizer

    path = _write(tmp_path / "prompts.jsonl", FILES["a ground truth from line 3 on"])
    records = load_prompts(DataConfig(), load_tokenizer(tiny_model_dir), path=path)
    assert [r.ground_truth for r in records] == [None, None, "6"]


def test_pdsr_trace_convert_keeps_rewards_the_first_line_lacks(tmp_path):
    from click.testing import CliRunner

    from pdsr_cli.main import cli

    rows = [{"uid": "p0", "response_length": 5}, {"uid": "p0", "response_length": 7, "reward": 1.0},
            {"uid": "p1", "response_length": 3, "reward": 0.0}]
    out = tmp_path / "trace.jsonl"
    result = CliRunner().invoke(cli, ["trace", "convert", str(_write(tmp_path / "log.jsonl", rows)), "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(g["prompt_id"], g["lengths"], g.get("rewards")) for g in groups] == [("p0", [5, 7], [None, 1.0]),
                                                                                   ("p1", [3], [0.0])]


NO_COLUMN = {   # (file name, text, what the error says after the path)
    "zero bytes": ("in.jsonl", "", "the input file is empty"),
    "blank lines only": ("in.jsonl", "\n  \n\n", "the input file has only blank lines; expected a JSON object per "
                                                  "line"),
    "objects without keys": ("in.jsonl", "{}\n{ }\n\n{}\n", "the input file has no column: all 3 lines are {}, an "
                                                            "object without keys"),
    "one object without keys": ("in.jsonl", "\n{}\n", "the input file has no column: its one line is {}, an object "
                                                     "without keys"),
    "an empty array": ("in.json", " [ ]\n", "the input file holds an empty array; expected an array of JSON objects"),
    "an array of objects without keys": ("in.json", "[{}, {}]", "the input file has no column: all 2 objects of its "
                                                                "array are {}, an object without keys"),
}


@pytest.mark.parametrize("case", NO_COLUMN)
def test_a_file_without_a_column_says_which_kind_it_is(tmp_path, case):
    """A zero-byte file, one of blank lines and one whose lines are all {} were each 'the input file is empty':
    each has its own message naming the file (and the flag that gave it), read whole, streamed, or as a shard."""
    name, text, said = NO_COLUMN[case]
    path = tmp_path / name
    path.write_text(text)
    for read in (read_table, open_table_batches):
        with pytest.raises(DataError) as caught:
            read(path)
        assert str(caught.value) == f"{path}: {said}"
        with pytest.raises(DataError) as caught:
            read(path, what="scoring input", setting="--data")
        assert str(caught.value) == f"--data {path}: {said.replace('input', 'scoring input')}"
    folder = tmp_path / "shards"
    folder.mkdir()
    _write(folder / f"a{path.suffix}", [{"a": 1}])
    shard = path.rename(folder / f"b{path.suffix}")
    for read in (read_table, open_table_batches):
        with pytest.raises(DataError) as caught:
            read(folder, setting="--data")
        assert str(caught.value) == f"{shard}: {said}"


def _shards(folder, write, shards):
    folder.mkdir()
    for i, rows in enumerate(shards):
        write(folder / f"part-{i}", rows)
    return folder


def _jsonl_shard(path, rows):
    _write(path.with_suffix(".jsonl"), rows)


def _parquet_shard(path, rows):
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path.with_suffix(".parquet"), row_group_size=2)


def _arrow_shard(path, rows):
    import pyarrow.feather as feather

    feather.write_feather(pa.Table.from_pylist(rows), path.with_suffix(".arrow"), chunksize=2)


#: shards whose optional keys differ: the columns are the union in order of first appearance across the shards
SHARDS = [
    [{"prompt": "a", "reward": 1.0}, {"prompt": "b", "reward": 0.0}, {"prompt": "c", "reward": 1.0}],
    [{"prompt": "d", "ground_truth": "4", "reward": 0.5}],
    [{"reward": 1.0, "prompt": "e", "extra": {"turn": 1}}, {"reward": None, "prompt": "f", "extra": None}] * 3,
    [{"prompt": "g", "ground_truth": None, "reward": 0.0}],
]
UNION = ["prompt", "reward", "ground_truth", "extra"]


@pytest.mark.parametrize("write", [_jsonl_shard, _parquet_shard, _arrow_shard], ids=["jsonl", "parquet", "arrow"])
def test_shards_whose_keys_differ_are_streamed_as_their_union(tmp_path, monkeypatch, write):
    """A folder (or pattern) of shards that differ in optional keys was read whole: it is streamed, each batch with
    the union's columns, null where its shard lacks one (or has nulls only), the table read_table gives."""
    folder = _shards(tmp_path / "shards", write, SHARDS)
    whole = read_table(folder)
    assert whole.column_names == UNION
    expected = [{k: row.get(k) for k in UNION} for shard in SHARDS for row in shard]
    assert whole.to_pylist() == expected   # the reference: the union, filled in
    from pdsr_sdk.io import blocks

    monkeypatch.setattr(blocks, "read_table", lambda *a, **k: pytest.fail("the shards were read whole"))
    suffix = next(folder.iterdir()).suffix
    for given in (folder, tmp_path / "shards" / f"part-*{suffix}"):
        source = open_table_batches(given)
        assert source.streamed and source.schema.equals(whole.schema) and source.num_rows == len(expected)
        parts = list(source.batches(rows=2))
        assert all(p.schema.equals(whole.schema, check_metadata=True) for p in parts)
        assert pa.concat_tables(parts).equals(whole)
        some = pa.concat_tables(source.batches(["ground_truth", "reward"], rows=4))   # shard 0 has no ground truth
        assert some.equals(whole.select(["ground_truth", "reward"]))
        only = pa.concat_tables(source.batches(["extra"]))   # shards 0, 1 and 3 have none of the columns asked for
        assert only.num_rows == len(expected) and only.column("extra").to_pylist() == [r["extra"] for r in expected]


def test_shards_of_differing_types_are_still_refused_with_read_tables_words(tmp_path):
    folder = _shards(tmp_path / "shards", _jsonl_shard, [[{"a": 1, "b": "x"}], [{"b": "y", "a": 0.5}]])
    with pytest.raises(DataError) as whole:
        read_table(folder)
    with pytest.raises(DataError) as streamed:
        open_table_batches(folder)
    assert str(streamed.value) == str(whole.value) and "its files do not share one schema" in str(whole.value)


def test_shards_whose_objects_differ_around_a_list_of_nulls(tmp_path):
    """pyarrow's concatenation of shards whose objects have different fields, one a list of nulls (a field whose
    lists hold only nulls in its shard), made an invalid table (reading it raised IndexError): read whole or
    streamed, the table holds what the lines say."""
    folder = _shards(tmp_path / "shards", _jsonl_shard, [[{"d": {"x": -1.25, "y": [None, None]}}, {"d": {"y": []}}],
                                                         [{"d": {"z": 0.5}}]])
    expected = [{"d": {"x": -1.25, "y": [None, None], "z": None}}, {"d": {"x": None, "y": [], "z": None}},
                {"d": {"x": None, "y": None, "z": 0.5}}]
    whole = read_table(folder)
    whole.validate(full=True)
    assert whole.to_pylist() == expected
    streamed, _ = _streamed(folder)
    streamed.validate(full=True)
    assert streamed.equals(whole) and streamed.to_pylist() == expected
