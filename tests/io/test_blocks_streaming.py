"""open_table_batches streams JSONL and Arrow IPC (file and stream formats), not only Parquet: the batches joined
are read_table's table for the whole file, types and values (schema metadata too), and a file read_table refuses
is refused with its words; memory holds a batch, not the file; and pdsr score on a JSONL file writes what it
writes for the same rows as Parquet."""

from __future__ import annotations

import json
import random
import tracemalloc

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from pdsr_sdk.errors import DataError
from pdsr_sdk.io import blocks
from pdsr_sdk.io.blocks import open_table_batches
from pdsr_sdk.io.tables import read_table


def _lines(path, rows):
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in rows))
    return path


def _outcome(read):
    """(table, None) or (None, the DataError's message)."""
    try:
        return read(), None
    except DataError as exc:
        return None, str(exc)


def _streamed(path, rows=2):
    source = open_table_batches(path)
    assert source.streamed
    parts = list(source.batches(rows=rows))
    assert all(0 < p.num_rows <= rows for p in parts)
    assert sum(p.num_rows for p in parts) == source.num_rows
    return pa.concat_tables(parts) if parts else source.schema.empty_table()


def _same_as_whole(path, rows=2):
    whole, whole_error = _outcome(lambda: read_table(path))
    got, error = _outcome(lambda: _streamed(path, rows))
    assert error == whole_error
    if whole is not None:
        assert got.schema.equals(whole.schema, check_metadata=True), (got.schema, whole.schema)
        assert got.equals(whole) and got.to_pylist() == whole.to_pylist()
    return got, error


@pytest.fixture(autouse=True)
def small_batches(monkeypatch):
    """Batches of 3 lines when a file is planned, so that a few rows span many batches."""
    monkeypatch.setattr(blocks, "BATCH_ROWS", 3)


CASES = {
    "an int column with a float at the end": [{"a": i} for i in range(20)] + [{"a": 0.5}],
    "a float, then ints": [{"a": 0.5}] + [{"a": i} for i in range(10)],
    "nulls first": [{"a": None, "b": None}] * 7 + [{"a": "x", "b": [1, 2]}, {"a": None, "b": None}],
    "a list of ints, then of floats, then empty": [{"l": [1, 2]}] * 5 + [{"l": [0.5]}, {"l": []}, {"l": None}],
    "nested lists": [{"l": [[1], []]}] * 4 + [{"l": [[2.5], None]}, {"l": [[True]]}],
    "an object column whose keys vary": [{"d": {"x": 1}}] * 4 + [{"d": {"y": "s", "x": None}}, {"d": {"z": [1.5]}},
                                                                {"d": None}, {"d": {}}],
    "numbers and strings: strings": [{"ans": 18}] * 4 + [{"ans": "\\frac{1}{2}"}, {"ans": 0.5}, {"ans": None}],
    "a key first on line 2": [{"a": 1}, {"a": 2, "b": "x"}] * 3,
    "a key only on the last line": [{"a": i} for i in range(8)] + [{"z": [0.5], "a": 9}],
    "a first object without keys": [{}, {"a": 1}],
    "keys in another order": [{"a": 1, "b": 2}, {"c": "x", "b": 3, "a": None}] * 2 + [{}],
    "an object key first seen late": [{"d": {"x": 1}}] * 7 + [{"d": {"x": 2, "late": {"deep": True}}}],
    "booleans after floats": [{"a": 0.5}] * 4 + [{"a": True}],
    "int64's largest": [{"a": 2**63 - 1}] * 4 + [{"a": -2**63}],
    "a token file": [{"prompt_token_ids": list(range(i + 1)), "response_token_ids": [i] * i} for i in range(9)],
}


@pytest.mark.parametrize("case", CASES)
def test_jsonl_batches_are_the_whole_files_table(tmp_path, case):
    got, error = _same_as_whole(_lines(tmp_path / "in.jsonl", CASES[case]))
    assert error is None and got.num_rows == len(CASES[case])


def test_the_types_the_whole_file_decides(tmp_path):
    """Not only equal to read_table: the types a batch alone would not give."""
    got, _ = _same_as_whole(_lines(tmp_path / "in.jsonl", CASES["an int column with a float at the end"]))
    assert got.schema.field("a").type == pa.float64() and got.column("a").to_pylist()[:3] == [0.0, 1.0, 2.0]
    got, _ = _same_as_whole(_lines(tmp_path / "t.jsonl", CASES["numbers and strings: strings"]))
    assert got.column("ans").to_pylist() == ["18"] * 4 + ["\\frac{1}{2}", "0.5", None]
    got, _ = _same_as_whole(_lines(tmp_path / "d.jsonl", CASES["an object column whose keys vary"]))
    assert got.schema.field("d").type == pa.struct([("x", pa.int64()), ("y", pa.string()),
                                                    ("z", pa.list_(pa.float64()))])


BAD = {
    "a line not JSON": ([{"a": 1}] * 5 + ['{"a": 2'], ":6: not valid JSON"),
    "a line not an object": ([{"a": 1}] * 4 + ["[1]"], ":5: expected a JSON object per line"),
    "a string in a bool column": ([{"a": True}] * 4 + [{"a": "yes"}], ":5: column 'a' is a string here but a "
                                                                      "boolean at"),
    "a list beside a number": ([{"a": 1}] * 4 + [{"a": [1]}], ":5: column 'a' is a list here but a number at"),
    "a bool after ints": ([{"a": 1}] * 4 + [{"a": True}], ":5: column 'a' is a boolean here"),
    "an int beyond int64": ([{"a": 1}] * 4 + [{"a": 2**64}], "cannot read input file as jsonl: Python int too "
                                                             "large"),
    "a big int, then a string": ([{"a": 1}] * 4 + [{"a": 2**64}, {"a": "x"}], "cannot read input file as jsonl"),
    "an int a float cannot hold": ([{"a": 2**60}] * 4 + [{"a": 0.5}], ":5: column 'a' is a number here whose"),
    "only blank lines": (["", "  "], "the input file has only blank lines"),
    "objects without keys only": ([{}, {}], "the input file has no column: all 2 lines are {}"),
    "a late key's column mixing types": ([{"a": 1}] * 5 + [{"b": 1}, {"a": 1, "b": [1]}],
                                         ":7: column 'b' is a list here but a number at"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_file_is_refused_with_read_tables_words(tmp_path, case):
    rows, message = BAD[case]
    path = _lines(tmp_path / "in.jsonl", rows)
    _, error = _same_as_whole(path)
    assert error is not None and message in error and str(path) in error


def test_an_empty_file_and_one_not_utf8(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert _same_as_whole(empty)[1] == f"{empty}: the input file is empty"
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"a": "x"}\n{"a": "caf\xe9"}\n')
    assert _same_as_whole(latin)[1].startswith(f"{latin}:2: not UTF-8 text (byte 0xe9)")


def _random_value(rng, kind, depth=0):
    """A value of ``kind``; mostly ones that mix into one column (ints and floats, lists of numbers), now and then
    one that does not (an int beyond int64, a string in a list of numbers)."""
    if kind == "int":
        return rng.choice([0, 7, -3, 2**53 + 1, 2**63 - 1] * 8 + [2**64])
    if kind == "float":
        return rng.choice([0.5, -1.25, 1e300])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "str":
        return rng.choice(["", "x", "18"])
    if kind == "list" and depth < 2:
        items = rng.choice(["int", "float", "none", "list"] * 4 + ["bool", "str"])
        return [_random_value(rng, rng.choice([items, items, "int", "none"]), depth + 1)
                for _ in range(rng.randrange(3))]
    if kind == "dict" and depth < 2:
        return {k: _random_value(rng, rng.choice(["int", "float", "none", "list"]), depth + 1)
                for k in rng.sample("xyz", rng.randrange(3))}
    return None


def _random_rows(rng) -> list[dict]:
    kinds = ["int", "float", "bool", "str", "list", "dict", "none"]
    mixing = [["int", "float"], ["none", "list"], ["int", "none"], ["dict", "none"], ["float", "bool"], ["str", "int"]]
    palettes = {name: rng.choice(mixing) if rng.random() < 0.6 else rng.sample(kinds, rng.randrange(1, 3))
                for name in "abcd"}
    absent = {name: rng.choice([0.0, 0.0, 0.3, 0.9]) for name in palettes}   # how often a line lacks it
    rows = []
    for _ in range(rng.randrange(1, 14)):
        run = {name: rng.choice(palette) for name, palette in palettes.items()}
        for _ in range(rng.randrange(1, 5)):
            names = [name for name in rng.sample(list(run), len(run)) if rng.random() >= absent[name]]
            rows.append({name: _random_value(rng, run[name]) for name in names})
    return rows


@pytest.mark.parametrize("seed", range(150))
def test_random_files_read_as_read_table_reads_them(tmp_path, seed):
    """Columns of a few kinds (ints, floats, booleans, strings, lists, objects, nulls) in runs of random length,
    each line lacking some keys now and then (a key may first appear on any line), in varying order: the streamed
    table or error is read_table's, whatever the batches."""
    rng = random.Random(seed)
    rows = _random_rows(rng)
    _same_as_whole(_lines(tmp_path / "in.jsonl", rows), rows=rng.randrange(1, 5))
    # the same rows cut into shards (each its own types; a key some shards lack): the folder's table or error too
    folder = tmp_path / "shards"
    folder.mkdir()
    cuts = sorted(rng.sample(range(1, len(rows)), min(len(rows) - 1, rng.randrange(3))))
    for i, (start, end) in enumerate(zip([0, *cuts], [*cuts, len(rows)])):
        _lines(folder / f"{i}.jsonl", rows[start:end])
    _same_as_whole(folder, rows=rng.randrange(1, 5))


@pytest.mark.parametrize("seed", range(100))
def test_random_files_planned_for_some_columns_read_as_a_file_of_those_only(tmp_path, seed):
    """open_table_batches(only=...): the streamed table (or error) of the columns asked for is read_table's of the
    lines holding those keys only, whatever the other keys hold; the schema still has every key, and the others
    are not converted."""
    rng = random.Random(seed)
    rows = _random_rows(rng)
    only = set(rng.sample("abcd", rng.randrange(1, 4)))
    path = tmp_path / "in.jsonl"
    kept = [{k: v for k, v in row.items() if k in only} for row in rows]
    if not any(kept):
        return   # no line has them: that file has no column, this one has
    whole, whole_error = _outcome(lambda: read_table(_lines(path, kept)))
    _lines(path, rows)

    def streamed():
        source = open_table_batches(path, only=only)
        assert source.schema.names == list(dict.fromkeys(k for row in rows for k in row))
        assert all(set(p.batches[0].segments) <= only for p in source.plans)
        names = [n for n in source.schema.names if n in only]
        parts = list(source.batches(names, rows=rng.randrange(1, 5)))
        assert sum(p.num_rows for p in parts) == len(rows)
        return pa.concat_tables(parts)

    got, error = _outcome(streamed)
    assert error == whole_error
    if whole is not None:
        assert got.schema.equals(whole.schema) and got.to_pylist() == whole.to_pylist()


def test_a_column_not_planned_is_not_read_and_a_shard_without_those_asked_is_null(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    _lines(folder / "0.jsonl", [{"x": 1, "y": [1, 2]}, {"x": 2, "y": [3]}])
    _lines(folder / "1.jsonl", [{"y": [4]}] * 4)
    source = open_table_batches(folder, only={"x"})
    assert source.schema.names == ["x", "y"] and source.schema.field("y").type == pa.list_(pa.int64())
    got = pa.concat_tables(source.batches(["x"], rows=3))
    assert got.to_pylist() == read_table(folder).select(["x"]).to_pylist()
    with pytest.raises(ValueError, match="column.s. y were not converted"):
        list(source.batches(["y"]))


def test_shards_and_a_json_array(tmp_path, monkeypatch):
    folder = tmp_path / "shards"
    folder.mkdir()
    _lines(folder / "0.jsonl", [{"a": 1, "l": [1]}] * 4)
    _lines(folder / "1.jsonl", [{"a": 2, "l": []}, {"a": 3, "l": [4, 5]}])
    _same_as_whole(folder)
    _lines(folder / "2.jsonl", [{"a": None, "l": [2]}])   # a null column: streamed, unified as read_table does
    assert _same_as_whole(folder)[0].schema.field("a").type == pa.int64()
    _lines(folder / "2.jsonl", [{"a": 0.5, "l": [2]}])
    with pytest.raises(DataError, match="its files do not share one schema"):
        open_table_batches(folder)
    array = tmp_path / "a.json"
    array.write_text(json.dumps([{"a": 1}, {"a": 2}]))
    assert not open_table_batches(array).streamed and open_table_batches(array).table.equals(read_table(array))


def _ipc_file(path, table, **kw):
    feather.write_feather(table, path, **kw)
    return path


def _ipc_stream(path, table, chunk):
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=chunk)
    return path


def _table(n):
    return pa.table({"id": pa.array(range(n), pa.int32()), "ids": [[i] * (i % 5) for i in range(n)],
                     "meta": [{"k": str(i), "v": i / 2} for i in range(n)],
                     "tag": pa.array(["a", "b"] * (n // 2) + ["a"] * (n % 2)).dictionary_encode()}
                    ).replace_schema_metadata({"pdsr_run": "{}"})


@pytest.mark.parametrize("write", ["file", "file lz4", "file uncompressed", "stream"])
def test_arrow_ipc_batches_are_the_whole_files_table(tmp_path, write, monkeypatch):
    monkeypatch.setattr(blocks, "read_table", lambda *a, **k: pytest.fail("the Arrow input was read whole"))
    table = _table(23)
    path = tmp_path / "in.arrow"
    if write == "stream":
        _ipc_stream(path, table, 4)
    else:
        _ipc_file(path, table, chunksize=5, compression={"file": None, "file lz4": "lz4",
                                                         "file uncompressed": "uncompressed"}[write])
    source = open_table_batches(path, ("ids",))
    assert source.num_rows == 23 and source.schema.metadata == {b"pdsr_run": b"{}"}
    parts = list(source.batches(rows=3))
    assert all(p.num_rows <= 3 for p in parts)
    assert pa.concat_tables(parts).equals(table) and pa.concat_tables(parts).schema.equals(table.schema, True)
    only = pa.concat_tables(source.batches(["ids"], rows=100))
    assert only.column_names == ["ids"] and only.column("ids").to_pylist() == table.column("ids").to_pylist()
    monkeypatch.undo()
    monkeypatch.setattr(blocks, "BATCH_ROWS", 3)
    _same_as_whole(path, rows=4)


def test_a_datasets_folder_of_stream_shards(tmp_path, monkeypatch):
    """save_to_disk's layout: data-0000N-of-0000M.arrow streams beside dataset_info.json and state.json."""
    table = _table(10)
    for i, (a, b) in enumerate([(0, 6), (6, 10)]):
        _ipc_stream(tmp_path / f"data-0000{i}-of-00002.arrow", table.slice(a, b - a), 4)
    (tmp_path / "dataset_info.json").write_text("{}")
    (tmp_path / "state.json").write_text("{}")
    got, _ = _same_as_whole(tmp_path, rows=4)
    assert got.equals(table)


def test_a_bad_arrow_file_is_refused_with_read_tables_words(tmp_path):
    path = tmp_path / "bad.arrow"
    path.write_bytes(b"not arrow at all")
    _, error = _same_as_whole(path)
    assert error.startswith(f"{path}: cannot read input file as arrow")


def test_streaming_jsonl_holds_a_batch_not_the_file(tmp_path, monkeypatch):
    """Peak Python memory (tracemalloc) reading 20,000 lines whole, then streamed in batches of 500: a ratio of
    sizes, not a time."""
    monkeypatch.setattr(blocks, "BATCH_ROWS", 500)
    path = _lines(tmp_path / "big.jsonl", ({"prompt_token_ids": list(range(i % 50)), "answer": str(i),
                                            "meta": {"turn": i}} for i in range(20_000)))

    def peak(read):
        tracemalloc.start()
        try:
            read()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    whole = peak(lambda: read_table(path))

    def stream():
        for batch in open_table_batches(path).batches(rows=500):
            assert batch.num_rows <= 500

    streamed = peak(stream)
    assert streamed * 10 < whole, (streamed, whole)


def test_streaming_an_arrow_file_allocates_no_table(tmp_path):
    """An uncompressed Arrow IPC file or stream is memory-mapped: the batches are views of the file, and Arrow's
    memory pool holds (at every batch) far less than the table."""
    table = pa.table({"ids": [list(range(200))] * 5000})
    for path in (_ipc_file(tmp_path / "f.arrow", table, compression="uncompressed", chunksize=1000),
                 _ipc_stream(tmp_path / "s.arrow", table, 1000)):
        before = pa.total_allocated_bytes()
        most = 0
        for batch in open_table_batches(path).batches(rows=256):
            most = max(most, pa.total_allocated_bytes() - before)
        assert most * 20 < table.nbytes, (most, table.nbytes)


def test_pdsr_score_on_jsonl_writes_what_it_writes_on_parquet(tmp_path, tiny_model_dir, monkeypatch):
    """The same rows as JSONL (with an answer column mixing numbers and strings and an object column, both absent
    from the first line) and as the Parquet file of read_table's table: the same output, log-probs bit for bit,
    the late columns kept; the JSONL streamed."""
    pytest.importorskip("torch")
    from click.testing import CliRunner

    from pdsr_cli.main import cli

    rng = random.Random(3)
    rows = [{"prompt_token_ids": [rng.randrange(1024) for _ in range(rng.randrange(1, 9))],
             "response_token_ids": [rng.randrange(1024) for _ in range(rng.randrange(0, 12))],
             "answer": rng.choice([18, "\\frac{1}{2}", 0.5]), "extra": {"turn": i}} for i in range(12)]
    del rows[0]["answer"], rows[0]["extra"]
    jsonl = _lines(tmp_path / "in.jsonl", rows)
    parquet = tmp_path / "in.parquet"
    pq.write_table(read_table(jsonl), parquet)
    outs = []
    for data in (jsonl, parquet):
        out = tmp_path / f"{data.suffix[1:]}.out.parquet"
        with monkeypatch.context() as m:
            m.setattr(blocks, "read_table", lambda *a, **k: pytest.fail(f"{data} was read whole"))
            result = CliRunner().invoke(cli, ["score", "--model", str(tiny_model_dir), "--data", str(data), "--out",
                                              str(out), "--device", "cpu", "--dtype", "float32",
                                              "--block-tokens", "40"])
        assert result.exit_code == 0, result.output
        outs.append(pq.read_table(out))
    assert outs[0].num_rows == 12 and outs[0].equals(outs[1])
    assert outs[0].column("answer").to_pylist() == [None] + [
        json.dumps(r["answer"]) if not isinstance(r["answer"], str) else r["answer"] for r in rows[1:]]
    assert outs[0].column("extra").to_pylist() == [None] + [{"turn": i} for i in range(1, 12)]


def test_no_column_asked_still_gives_every_row(tmp_path):
    """batches([]) of a streamed input counts its rows, as of one read whole (a table of no columns has none unless
    it is a selection of one that has rows)."""
    folder = tmp_path / "shards"
    folder.mkdir()
    pq.write_table(pa.table({"a": [1, 2, 3]}), folder / "0.parquet")
    pq.write_table(pa.table({"b": ["x", "y"]}), folder / "1.parquet")   # another column: streamed as the union
    inputs = {"shards of other columns": folder, "jsonl": _lines(tmp_path / "r.jsonl", [{"a": i} for i in range(7)]),
              "arrow": _ipc_file(tmp_path / "r.arrow", _table(7)), "csv (read whole)": tmp_path / "r.csv"}
    (tmp_path / "r.csv").write_text("a\n" + "".join(f"{i}\n" for i in range(7)))
    for name, path in inputs.items():
        source = open_table_batches(path)
        parts = list(source.batches([], rows=2))
        assert [p.num_columns for p in parts] == [0] * len(parts), name
        assert sum(p.num_rows for p in parts) == source.num_rows == read_table(path).num_rows, name
