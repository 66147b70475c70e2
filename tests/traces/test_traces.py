"""Reading length traces: the JSONL reader and writer, trajectories tables (Parquet, Arrow), and LengthTrace's
own checks, with errors that name the file, line or row, and key."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pdsr_sdk.errors import DataError, PdsrWarning
from pdsr_sdk.traces import (
    LengthTrace,
    read_trace,
    synth_trace,
    trace_from_trajectories,
    write_trace_jsonl,
)
from trace_inputs import GOOD, assert_same_trace, sample_trajectories, write_lines


def test_jsonl_parses_ragged_groups_with_optional_keys(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [
        {"prompt_id": "a", "prompt_len": 87, "lengths": [412, 380, 9], "durations_s": [4.12, 3.8, 0.09],
         "finish_reasons": ["stop", "stop", "length"]},
        "",
        {"prompt_id": 7, "prompt_len": 0, "lengths": [5.0, 0], "durations_s": [1, 0.0],
         "finish_reasons": ["stop", "abort"], "extra": "ignored"},
    ])
    with pytest.warns(PdsrWarning, match=r"t.jsonl: key\(s\) 'extra' \(line 3\) are not length-trace keys and are "
                                         r"ignored"):
        trace = read_trace(path)
    assert trace.prompt_ids == ["a", "7"]
    assert trace.prompt_lens.tolist() == [87, 0]
    assert trace.lengths.tolist() == [412, 380, 9, 5, 0]
    assert trace.lengths.dtype == np.int64
    assert trace.offsets.tolist() == [0, 3, 5]
    assert trace.durations_s.tolist() == [4.12, 3.8, 0.09, 1.0, 0.0]
    assert trace.finish_reasons.tolist() == ["stop", "stop", "length", "stop", "abort"]
    assert not trace.is_rectangular
    assert trace.group(1) == {"prompt_id": "7", "prompt_len": 0, "lengths": [5, 0], "durations_s": [1.0, 0.0],
                              "finish_reasons": ["stop", "abort"]}


def test_jsonl_without_optional_keys(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [{"prompt_id": "a", "prompt_len": 3, "lengths": [1, 2]},
                                               {"prompt_id": "b", "prompt_len": 4, "lengths": [3, 4]}])
    trace = read_trace(path)
    assert trace.durations_s is None and trace.finish_reasons is None
    assert trace.matrix().tolist() == [[1, 2], [3, 4]]
    assert trace.duration_matrix() is None


def test_write_then_read_round_trips(tmp_path):
    trace = synth_trace(groups=37, n=5, seed=3, tokens_per_s=123.0)
    out = write_trace_jsonl(trace, tmp_path / "sub" / "trace.jsonl")
    back = read_trace(out)
    assert_same_trace(trace, back)
    first = json.loads(out.read_text().splitlines()[0])
    assert list(first) == ["prompt_id", "prompt_len", "lengths", "durations_s", "finish_reasons"]
    assert not list(out.parent.glob(".*.tmp"))  # the temp file was renamed away


def test_non_ascii_ids_and_byte_order_mark(tmp_path):
    trace = LengthTrace.from_matrix(np.array([[3, 4], [5, 6]]), prompt_ids=["数学-1", "b"], prompt_lens=[1, 2])
    out = write_trace_jsonl(trace, tmp_path / "t.jsonl")
    out.read_text(encoding="ascii")  # escaped, so any locale can write and read it
    assert_same_trace(read_trace(out), trace)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + out.read_bytes())
    assert_same_trace(read_trace(bom), trace)


@pytest.mark.parametrize("line, needle", [
    ('{"prompt_id": "x", "prompt_len": 5, "lengths": [1, 2', "not valid JSON"),
    ('[1, 2, 3]', "expected a JSON object per line, got list"),
    ({"prompt_id": "x", "lengths": [1]}, "missing key(s) 'prompt_len'"),
    ({"prompt_id": "x", "prompt_len": 5}, "missing key(s) 'lengths'"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [3, -1]}, "lengths[1] is negative (-1)"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [3, 1.5]}, "lengths[1] is 1.5; expected an integer"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [3, "4"]}, "lengths[1] is '4'"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [True, 4]}, "lengths[0] is True"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": []}, "lengths must be a non-empty list"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": 4}, "lengths must be a non-empty list"),
    ({"prompt_id": "x", "prompt_len": -2, "lengths": [1]}, "prompt_len must be a non-negative integer"),
    ({"prompt_id": ["x"], "prompt_len": 2, "lengths": [1]}, "prompt_id must be a string"),
    ({"prompt_id": "g", "prompt_len": 2, "lengths": [1]}, "duplicate prompt_id 'g' (first on line 1)"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [1, 2], "durations_s": [0.5]},
     "durations_s has 1 entries but lengths has 2"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [1], "durations_s": [-0.5]}, "durations_s[0] is -0.5"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [1], "durations_s": ["1s"]}, "durations_s[0] is '1s'"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [1, 2], "finish_reasons": ["stop", 3]},
     "finish_reasons[1] is 3"),
])
def test_jsonl_errors_name_file_line_and_key(tmp_path, line, needle):
    # the bad line is line 2; line 1 is good and, for the optional-key cases, has no optional keys
    first = dict(GOOD)
    if isinstance(line, dict) and "durations_s" in line:
        first["durations_s"] = [0.1, 0.2, 0.3]
    if isinstance(line, dict) and "finish_reasons" in line:
        first["finish_reasons"] = ["stop"] * 3
    path = write_lines(tmp_path / "bad.jsonl", [first, line])
    with pytest.raises(DataError) as info:
        read_trace(path)
    message = str(info.value)
    assert f"{path}:2:" in message
    assert needle in message


def test_jsonl_misspelt_key_is_named_with_the_key_it_likely_meant(tmp_path):
    """A misspelt optional key (``reward``) left the trace without its rewards, unsaid: it is now one warning naming
    the file, each key's first line and the likely key; the trace reads as without it."""
    path = write_lines(tmp_path / "t.jsonl", [dict(GOOD), dict(GOOD, prompt_id="b", reward=[1, 0, 1], durationss=1)])
    with pytest.warns(PdsrWarning) as caught:
        trace = read_trace(path)
    assert len(caught) == 1
    assert str(caught[0].message).startswith(
        f"{path}: key(s) 'durationss' (line 2; did you mean 'durations_s'?), 'reward' (line 2; did you mean "
        f"'rewards'?) are not length-trace keys")
    assert trace.rewards is None and trace.num_groups == 2


def test_jsonl_of_known_keys_reads_without_a_warning(tmp_path):
    path = write_trace_jsonl(synth_trace(groups=3, n=2, seed=1), tmp_path / "t.jsonl")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_trace(path)


def test_jsonl_optional_key_must_be_all_or_none(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [dict(GOOD, durations_s=[1, 2, 3]),
                                               {"prompt_id": "h", "prompt_len": 1, "lengths": [4]}])
    with pytest.raises(DataError, match=r"t.jsonl:2: this line lacks 'durations_s' but line 1 has it"):
        read_trace(path)


def test_jsonl_empty_file_and_unknown_formats(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match="the file is empty"):
        read_trace(empty)
    (tmp_path / "run.parquet").write_bytes(b"")   # a zero-byte file is empty, not a JSONL of no lines
    with pytest.raises(DataError, match=r"run.parquet: the file is empty \(no groups\); expected a length trace"):
        read_trace(tmp_path / "run.parquet")
    csv = tmp_path / "lengths.csv"
    csv.write_text("prompt_id,length\na,3\n")
    with pytest.raises(DataError, match="not a length trace"):
        read_trace(csv)
    with pytest.raises(DataError, match="does not exist"):
        read_trace(tmp_path / "missing.jsonl")
    with pytest.raises(DataError, match="is a directory"):
        read_trace(tmp_path)


EXPECTED_FROM_TRAJECTORIES = LengthTrace.from_matrix(
    np.array([[35, 40, 0], [100, 120, 300]]), prompt_ids=["q", "p"], prompt_lens=[7, 5],
    durations_s=[[3.5, 4.0, 0.0], [10.0, 12.0, 30.0]],
    finish_reasons=[["stop", "stop", "abort"], ["stop", "stop", "length"]])


def test_trajectories_parquet_groups_by_prompt_in_first_appearance_order(tmp_path):
    path = tmp_path / "traj.parquet"
    pq.write_table(sample_trajectories(), path, row_group_size=2)
    assert_same_trace(read_trace(path), EXPECTED_FROM_TRAJECTORIES)


def test_trajectories_arrow_file_and_stream(tmp_path):
    table = sample_trajectories()
    file_path, stream_path = tmp_path / "traj.arrow", tmp_path / "traj.stream"
    with pa.OSFile(str(file_path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=4)
    with pa.OSFile(str(stream_path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=4)
    assert_same_trace(read_trace(file_path), EXPECTED_FROM_TRAJECTORIES)
    assert_same_trace(read_trace(stream_path), EXPECTED_FROM_TRAJECTORIES)


def test_trajectories_float_columns_of_whole_numbers_are_read(tmp_path):
    # verl and pandas dumps store lengths (and sometimes indices) as doubles
    table = sample_trajectories()
    for name in ("sample_index", "prompt_length", "response_length"):
        i = table.column_names.index(name)
        table = table.set_column(i, name, table[name].cast(pa.float64()))
    path = tmp_path / "traj.parquet"
    pq.write_table(table, path)
    assert_same_trace(read_trace(path), EXPECTED_FROM_TRAJECTORIES)


def test_trajectories_without_timing_columns():
    table = sample_trajectories().drop(["submit_time_s", "finish_time_s", "finish_reason"])
    trace = trace_from_trajectories(table)
    assert trace.durations_s is None and trace.finish_reasons is None
    assert trace.matrix().tolist() == [[35, 40, 0], [100, 120, 300]]


def _with(table: pa.Table, name: str, values) -> pa.Table:
    i = table.column_names.index(name)
    return table.set_column(i, name, pa.array(values, table.schema.field(name).type))


@pytest.mark.parametrize("edit, needle", [
    (lambda t: t.drop(["sample_index"]), "missing column(s) 'sample_index'"),
    (lambda t: _with(t, "sample_index", [1, 2, 0, 0, 1, 1]), "prompt 'q' has sample_index values [0, 1, 1]"),
    (lambda t: _with(t, "sample_index", [1, 2, 3, 0, 1, 2]), "prompt 'q' has sample_index values [1, 2, 3]"),
    (lambda t: _with(t, "response_length", [40, 300, 35, 100, -1, 0]), "'response_length' row 4 is negative"),
    (lambda t: _with(t, "prompt_length", [7, 5, 7, 5, 6, 7]), "'prompt_length' row 4 differs"),
    (lambda t: _with(t, "finish_time_s", [4.0, 31.0, 3.5, 10.0, 12.5, 1.0]),
     "row 5: finish_time_s - submit_time_s is -1.0; expected"),   # the number, not numpy's repr np.float64(-1.0)
    (lambda t: _with(t, "response_length", [40, None, 35, 100, 120, 0]), "'response_length' row 1 is null"),
    (lambda t: t.set_column(1, "sample_index", pa.array(["1", "2", "0", "0", "1", "2"])),
     "'sample_index' must be integers (or whole floats), got string"),
    (lambda t: t.set_column(3, "response_length", pa.array([40.0, 300, 35, 100, 120.5, 0])),
     "column 'response_length' row 4 is 120.5; expected a whole number"),
    (lambda t: t.set_column(3, "response_length", pa.array([40.0, 300, 35, 100, float("inf"), 0])),
     "column 'response_length' row 4 is inf; expected a whole number"),
])
def test_trajectories_errors_name_file_row_and_column(tmp_path, edit, needle):
    path = tmp_path / "traj.parquet"
    pq.write_table(edit(sample_trajectories()), path)
    with pytest.raises(DataError) as info:
        read_trace(path)
    assert str(path) in str(info.value)
    assert needle in str(info.value)


def test_matrix_of_ragged_trace_names_the_groups():
    trace = LengthTrace(prompt_ids=["a", "b", "c"], prompt_lens=[1, 1, 1], lengths=[1, 2, 3, 4, 5, 6, 7],
                        offsets=[0, 3, 6, 7])
    assert trace.group_sizes.tolist() == [3, 3, 1]
    with pytest.raises(DataError, match=r"group 0 \('a'\) has 3 and group 2 \('c'\) has 1"):
        trace.matrix()


@pytest.mark.parametrize("kwargs, needle", [
    (dict(offsets=[0, 2, 3]), "offsets must have"),
    (dict(offsets=[0, 0, 4]), "group 0 ('a') has no samples"),
    (dict(lengths=[1, -2, 3, 4]), "group 0 ('a') has a negative length"),
    (dict(prompt_lens=[1]), "prompt_lens has 1 entries"),
    (dict(durations_s=[1.0, 2.0]), "durations_s has 2 entries"),
    (dict(finish_reasons=["stop"]), "finish_reasons has 1 entries"),
])
def test_length_trace_checks_its_shape(kwargs, needle):
    base = dict(prompt_ids=["a", "b"], prompt_lens=[1, 2], lengths=[1, 2, 3, 4], offsets=[0, 2, 4])
    with pytest.raises(DataError) as info:
        LengthTrace(**{**base, **kwargs})
    assert needle in str(info.value)
