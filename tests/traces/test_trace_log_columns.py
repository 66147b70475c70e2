"""`pdsr trace convert` of a big rollout log reads only the columns its trace uses (the schema first, then those
columns a block at a time; token ids read as lengths kept as counts): the trace is the one of the whole log read,
unused heavy columns are never read, and errors still list every column and name the row. A trajectories Arrow
file (what `pdsr simulate --trace` reads too) is read for its trace columns only."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import pdsr_sdk.io.blocks
import pdsr_sdk.io.tables
from pdsr_cli.main import cli
from pdsr_sdk.errors import DataError
from pdsr_sdk.io.blocks import BATCH_ROWS
from support import record_parquet_columns, write_table_as
from pdsr_sdk.traces import read_responses_trace, read_trace
from pdsr_sdk.traces.io import read_trajectories_trace, trace_from_responses, trace_from_trajectories
from pdsr_sdk.traces.log_columns import read_log_columns
from trace_inputs import assert_same_trace, sample_trajectories

#: more rows than a block, so the token ids are counted over several blocks
ROWS = 2 * BATCH_ROWS + 100
HEAVY = ("logprobs", "text")


def _log(rows: int = ROWS) -> pa.Table:
    """A verl-style log: uid, token ids (the only length), score, finish_reason, and heavy columns a trace does not
    read; groups of 5, rows of a group spread over the log."""
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 40, rows)
    ids = [rng.integers(0, 1000, n).tolist() for n in lengths]
    return pa.table({"uid": [f"p{i % (rows // 5)}" for i in range(rows)],
                     "response_ids": pa.array(ids, pa.list_(pa.int32())),
                     "logprobs": pa.array([[-0.5] * n for n in lengths], pa.list_(pa.float32())),
                     "text": ["w" * int(n) for n in lengths],
                     "score": pa.array(rng.integers(0, 2, rows).astype(float)),
                     "finish_reason": ["length" if n > 35 else "stop" for n in lengths]})


def _expected(table: pa.Table, tmp_path) -> object:
    """The trace written out by hand: groups in order of first row, lengths the lists' sizes."""
    groups: dict[str, list[int]] = {}
    for i, uid in enumerate(table["uid"].to_pylist()):
        groups.setdefault(uid, []).append(i)
    ids, scores, reasons = (table[c].to_pylist() for c in ("response_ids", "score", "finish_reason"))
    path = tmp_path / "expected.jsonl"
    path.write_text("".join(json.dumps({"prompt_id": uid, "prompt_len": 0, "lengths": [len(ids[i]) for i in rows],
                                        "finish_reasons": [reasons[i] for i in rows],
                                        "rewards": [scores[i] for i in rows]}) + "\n"
                            for uid, rows in groups.items()))
    return read_trace(path)


@pytest.mark.parametrize("kind, name", [("parquet", "log.parquet"), ("arrow", "log.arrow"), ("jsonl", "log.jsonl")])
def test_the_trace_is_the_whole_logs_and_its_heavy_columns_are_not_kept(tmp_path, kind, name):
    table = _log()
    path = write_table_as(table, tmp_path / name, kind)
    trace = read_responses_trace(path, id_column="uid")
    assert_same_trace(trace, _expected(table, tmp_path))
    assert_same_trace(trace, trace_from_responses(pdsr_sdk.io.tables.read_table(path), id_column="uid"))
    read, schema, rows = read_log_columns(path, kind, {"id": ["uid"], "length": ["response_ids"]})
    assert read.column_names == ["uid", "response_ids"] and rows == ROWS
    assert pa.types.is_integer(read["response_ids"].type)      # counts, not the token ids
    assert read["response_ids"].to_pylist() == [len(x) for x in table["response_ids"].to_pylist()]
    assert schema.names == table.column_names


def test_unused_columns_are_never_read_from_parquet(tmp_path, monkeypatch):
    path = write_table_as(_log(), tmp_path / "log.parquet", "parquet")
    asked = record_parquet_columns(monkeypatch)
    trace = read_responses_trace(path, id_column="uid")
    assert asked == [["uid", "response_ids", "score", "finish_reason"]]
    assert trace.num_samples == ROWS


def test_a_jsonl_logs_unused_keys_are_typed_not_converted(tmp_path, monkeypatch):
    """A JSONL log's lines are all parsed, but only the keys a trace may read are converted and kept; the others
    are typed, so errors list them as before (an object's fields too)."""
    table = _log().append_column("meta", pa.array([{"step": i // 64, "source": "math"} for i in range(ROWS)]))
    path = write_table_as(table, tmp_path / "log.jsonl", "jsonl")
    plans: list = []
    plan_jsonl = pdsr_sdk.io.blocks.plan_jsonl
    monkeypatch.setattr(pdsr_sdk.io.blocks, "plan_jsonl",
                        lambda *a, **k: plans.append(plan_jsonl(*a, **k)) or plans[-1])
    trace = read_responses_trace(path, id_column="uid")
    assert_same_trace(trace, _expected(table, tmp_path))
    (plan,) = plans
    assert set().union(*(b.segments for b in plan.batches)) == {"uid", "response_ids", "score", "finish_reason"}
    assert plan.schema.field("meta").type == pa.struct([("step", pa.int64()), ("source", pa.string())])
    with pytest.raises(DataError, match=r"columns: uid, response_ids, logprobs, text, score, finish_reason, "
                                        r"meta \(fields: step, source\)$"):
        read_responses_trace(path, id_column="prompt")


def test_a_length_column_found_first_stops_the_search_and_a_listed_item_does_not(tmp_path):
    """Names looked for after the one found are not read; a list's item (choices.0.finish_reason) may be missing
    on a row, so the names after it are read: the same choice as the whole log's."""
    table = _log(20).append_column("response_length", pa.array([3] * 20))
    path = write_table_as(table, tmp_path / "log.parquet", "parquet")
    read, _, _ = read_log_columns(path, "parquet", {"length": ["response_length", "response_ids"]})
    assert read.column_names == ["response_length"]
    choices = pa.array([[{"finish_reason": "stop"}]] * 19 + [[]])
    table = _log(20).drop(["finish_reason"]).append_column("choices", choices)
    path = write_table_as(table, tmp_path / "choices.parquet", "parquet")
    read, _, _ = read_log_columns(path, "parquet", {"finish_reason": ["choices.0.finish_reason", "text"]})
    assert read.column_names == ["text", "choices"]
    trace = read_responses_trace(path, id_column="uid")
    assert trace.finish_reasons is None      # a row without choices: not found, as in the whole log
    assert_same_trace(trace, trace_from_responses(pq.read_table(path), id_column="uid"))


def test_errors_list_every_column_and_name_the_row_past_the_first_block(tmp_path):
    table = _log()
    path = write_table_as(table, tmp_path / "log.parquet", "parquet")
    listing = "columns: uid, response_ids, logprobs, text, score, finish_reason"
    with pytest.raises(DataError, match=f"--id-column is 'prompt' but the file has no such column; {listing}$"):
        read_responses_trace(path, id_column="prompt")
    no_length = write_table_as(table.drop(["response_ids"]), tmp_path / "n.parquet", "parquet")
    with pytest.raises(DataError, match="no response length column; name it with --length-column .*; columns: uid, "
                                        "logprobs, text, score, finish_reason$"):
        read_responses_trace(no_length, id_column="uid")
    row = BATCH_ROWS + 17
    ids = table["response_ids"].to_pylist()
    ids[row] = None
    bad = write_table_as(table.set_column(1, "response_ids", pa.array(ids, pa.list_(pa.int32()))),
                         tmp_path / "bad.parquet",
                 "parquet")
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(cli, ["trace", "convert", str(bad), "--id-column", "uid", "--out", str(out)])
    assert result.exit_code == 2 and not out.exists()
    assert result.output.strip() == (f"error: SOURCE {bad}: column 'response_ids' row {row} is empty (null); "
                                     f"expected a whole number")


@pytest.mark.parametrize("kind", ["arrow_file", "arrow_stream"])
def test_a_trajectories_arrow_file_is_read_for_its_trace_columns_only(tmp_path, kind, monkeypatch):
    """A compressed Arrow file's other columns (token ids) were decompressed whole before the trace columns were
    taken: the reader is now asked for the trace columns only, and gives the trace of the whole table."""
    table = sample_trajectories()
    table = table.append_column("logprobs", pa.array([[-0.5] * 50] * table.num_rows, pa.list_(pa.float32())))
    path = tmp_path / "run.arrow"
    if kind == "arrow_file":
        feather.write_feather(table, path, compression="lz4")
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(
                sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
            writer.write_table(table)
    asked = []
    opener = "open_file" if kind == "arrow_file" else "open_stream"
    real = getattr(pa.ipc, opener)

    def recording(source, options=None, **kwargs):
        asked.append(None if options is None else list(options.included_fields))
        return real(source, options=options, **kwargs)

    monkeypatch.setattr(pa.ipc, opener, recording)
    trace = read_trajectories_trace(path, kind)
    trace_columns = ["prompt_id", "sample_index", "prompt_length", "response_length", "finish_reason",
                     "submit_time_s", "finish_time_s"]
    assert asked[-1] == [table.column_names.index(c) for c in trace_columns]
    assert_same_trace(trace, trace_from_trajectories(table))


def test_a_log_without_a_column_read_reads_no_rows_to_say_so(tmp_path, monkeypatch):
    path = write_table_as(_log(50).select(["logprobs", "text"]), tmp_path / "log.parquet", "parquet")
    asked: list = []
    iter_batches = pq.ParquetFile.iter_batches
    monkeypatch.setattr(pq.ParquetFile, "iter_batches",
                        lambda self, *a, **k: asked.append(k.get("columns")) or iter_batches(self, *a, **k))
    with pytest.raises(DataError, match="no prompt id column; name it with --id-column .*; columns: logprobs, text$"):
        read_responses_trace(path)
    assert asked == []
