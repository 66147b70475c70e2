"""Reading and writing length traces.

Two inputs, detected from the file's first bytes (not its name):

- a length trace, JSONL, one prompt group per line::

      {"prompt_id": "p0", "prompt_len": 87, "lengths": [412, 380, ...],
       "durations_s": [...], "finish_reasons": [...], "rewards": [1.0, 0.0, ...]}   # last three optional

  ``rewards`` (each a number, or null for a sample without one) is what dynamic sampling in the
  simulator filters groups by. A trace of turns (multi-turn samples) adds ``turns``: per sample, null (a
  single-turn sample) or a list of turns ``[sampled, env_tokens, env_s]``: the tokens the model sampled, then
  the tokens its environment added and the environment's delay in seconds (the last turn's are what the
  agent adds before the sample ends, usually ``0, 0``). A sample's ``lengths`` entry is the sum of its
  sampled and environment tokens. Every optional key is given for every group or for none.

- a trajectories file as written by ``pdsr rollout`` (Parquet, Arrow IPC file
  or stream), one row per sample with columns ``prompt_id``, ``sample_index``
  (0 is the probe), ``prompt_length``, ``response_length`` and optionally
  ``finish_reason``, ``submit_time_s``, ``finish_time_s``, ``reward`` (nulls allowed), ``turns`` (null for a
  single-turn sample; the trace of turns, from the spans' token counts and times). Rows are grouped by
  ``prompt_id`` (groups in order of first appearance) and ordered by
  ``sample_index``.

Errors are ``DataError`` naming the file and the line (JSONL) or row and
column (tables).

The JSONL reader and writer are in :mod:`pdsr_sdk.traces.jsonl`, the trajectories reader in
:mod:`pdsr_sdk.traces.trajectories` and format detection in :mod:`pdsr_sdk.traces.formats`; their names are
importable from here too.
"""

from __future__ import annotations

from pathlib import Path

from pdsr_sdk.traces.formats import detect_format
from pdsr_sdk.traces.jsonl import OPTIONAL_KEYS, REQUIRED_KEYS, read_trace_jsonl, write_trace_jsonl
from pdsr_sdk.traces.trace import LengthTrace
from pdsr_sdk.traces.trajectories import (
    TRAJECTORY_COLUMNS,
    TRAJECTORY_OPTIONAL,
    read_trajectories_trace,
    trace_from_trajectories,
)

__all__ = [
    "OPTIONAL_KEYS",
    "REQUIRED_KEYS",
    "TRAJECTORY_COLUMNS",
    "TRAJECTORY_OPTIONAL",
    "detect_format",
    "read_trace",
    "read_trace_jsonl",
    "read_trajectories_trace",
    "trace_from_trajectories",
    "write_trace_jsonl",
]


def read_trace(path: str | Path) -> LengthTrace:
    """Read a JSONL length trace or a trajectories Parquet/Arrow file (detected from its content)."""
    path = Path(path)
    kind = detect_format(path)
    if kind == "jsonl":
        return read_trace_jsonl(path)
    return read_trajectories_trace(path, kind)
