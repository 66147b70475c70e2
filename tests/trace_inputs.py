"""Shared by the length-trace tests (tests/traces/test_traces.py, test_trace_synth.py, test_trace_cli.py,
test_trace_responses.py): JSONL
lines written as given, a trajectories table, and an exact comparison of two traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from pdsr_sdk.traces import LengthTrace


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def assert_same_trace(a: LengthTrace, b: LengthTrace) -> None:
    assert a.prompt_ids == b.prompt_ids
    np.testing.assert_array_equal(a.prompt_lens, b.prompt_lens)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.offsets, b.offsets)
    for x, y in ((a.durations_s, b.durations_s), (a.finish_reasons, b.finish_reasons), (a.rewards, b.rewards)):
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_array_equal(x, y)


GOOD = {"prompt_id": "g", "prompt_len": 5, "lengths": [1, 2, 3]}


def sample_trajectories() -> pa.Table:
    # rows out of order on purpose; prompt "q" appears first, then "p"
    rows = [
        ("q", 1, 7, 40, "stop", 0.0, 4.0),
        ("p", 2, 5, 300, "length", 1.0, 31.0),
        ("q", 0, 7, 35, "stop", 0.0, 3.5),
        ("p", 0, 5, 100, "stop", 0.0, 10.0),
        ("p", 1, 5, 120, "stop", 0.5, 12.5),
        ("q", 2, 7, 0, "abort", 2.0, 2.0),
    ]
    cols = list(zip(*rows))
    return pa.table({
        "prompt_id": pa.array(cols[0], pa.string()),
        "sample_index": pa.array(cols[1], pa.int32()),
        "prompt_length": pa.array(cols[2], pa.int32()),
        "response_length": pa.array(cols[3], pa.int32()),
        "finish_reason": pa.array(cols[4], pa.string()),
        "submit_time_s": pa.array(cols[5], pa.float64()),
        "finish_time_s": pa.array(cols[6], pa.float64()),
        "response_ids": pa.array([[1, 2]] * len(rows), pa.list_(pa.int32())),  # ignored
    })
