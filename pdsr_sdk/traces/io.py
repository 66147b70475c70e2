"""Reading and writing length traces.

Three inputs, detected from the file's first bytes (not its name):

- a length trace, JSONL, one prompt group per line::

      {"prompt_id": "p0", "prompt_len": 87, "lengths": [412, 380, ...],
       "durations_s": [...], "finish_reasons": [...], "rewards": [1.0, 0.0, ...]}   # last three optional

  ``rewards`` (each a number, or null for a sample without one) is what dynamic sampling in the
  simulator filters groups by. A trace of turns (multi-turn samples) adds ``turns``: per sample, null (a
  single-turn sample) or a list of turns ``[sampled, env_tokens, env_s]``: the tokens the model sampled, then
  the tokens its environment added and the environment's delay in seconds (the last turn's are what the
  agent adds before the sample ends, usually ``0, 0``). A sample's ``lengths`` entry is the sum of its
  sampled and environment tokens. Every optional key is given for every group or for none.

- slime's rollout dump (``--save-debug-rollout-data``: a ``torch.save`` file of one rollout's samples), read by
  :func:`~pdsr_sdk.traces.slime_dump.read_slime_dump`.

- a trajectories file as written by ``pdsr rollout`` (Parquet, Arrow IPC file
  or stream), one row per sample with columns ``prompt_id``, ``sample_index``
  (0 is the probe), ``prompt_length``, ``response_length`` and optionally
  ``finish_reason``, ``submit_time_s``, ``finish_time_s``, ``reward`` (nulls allowed), ``turns`` (null for a
  single-turn sample; the trace of turns, from the spans' token counts and times). Rows are grouped by
  ``prompt_id`` (groups in order of first appearance) and ordered by
  ``sample_index``.

Errors are ``DataError`` naming the file and the line (JSONL) or row and
column (tables).

``pdsr trace convert`` reads more (:func:`read_any_trace`): your own rollout log, a table of one row per response
(Parquet, Arrow IPC, JSONL or CSV/TSV) whose columns are named by flags or found under their usual names
(:mod:`pdsr_sdk.traces.responses`), verl's generation dumps, text counted with a tokenizer
(:mod:`pdsr_sdk.traces.verl_dump`), and a folder or glob pattern of slime's rollout dumps
(:mod:`pdsr_sdk.traces.slime_dump`).

The JSONL reader and writer are in :mod:`pdsr_sdk.traces.jsonl`, the trajectories reader in
:mod:`pdsr_sdk.traces.trajectories` and format detection in :mod:`pdsr_sdk.traces.formats`; their names are
importable from here too.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from pdsr_sdk.errors import DataError
from pdsr_sdk.traces.formats import detect_format
from pdsr_sdk.traces.jsonl import OPTIONAL_KEYS, REQUIRED_KEYS, read_trace_jsonl, write_trace_jsonl
from pdsr_sdk.traces.responses import RESPONSE_COLUMNS, read_responses_trace, trace_from_responses
from pdsr_sdk.traces.slime_dump import is_slime_dump as _is_slime_dump
from pdsr_sdk.traces.slime_dump import read_slime_dump
from pdsr_sdk.traces.trace import LengthTrace
from pdsr_sdk.traces.verl_dump import is_verl_dump as _is_verl_dump
from pdsr_sdk.traces.verl_dump import read_verl_dump
from pdsr_sdk.traces.trajectories import (
    TRAJECTORY_COLUMNS,
    TRAJECTORY_OPTIONAL,
    read_trajectories_trace,
    trace_from_trajectories,
)

__all__ = [
    "OPTIONAL_KEYS",
    "REQUIRED_KEYS",
    "RESPONSE_COLUMNS",
    "TRAJECTORY_COLUMNS",
    "TRAJECTORY_OPTIONAL",
    "detect_format",
    "read_any_trace",
    "read_responses_trace",
    "read_slime_dump",
    "read_trace",
    "read_trace_jsonl",
    "read_trajectories_trace",
    "read_verl_dump",
    "trace_from_responses",
    "trace_from_trajectories",
    "write_trace_jsonl",
]


def read_trace(path: str | Path, *, setting: str | None = None) -> LengthTrace:
    """Read a JSONL length trace, a trajectories Parquet/Arrow file or slime's rollout dump (a ``.pt`` file; a dict
    reward's ``score``), detected from its content. ``setting``: the
    argument or flag ``path`` came from (``TRACE``, ``trace (--trace)``), put before each error about it."""
    path = Path(path)
    with _errors_named(setting, path):
        kind = detect_format(path)
        if kind == "jsonl":
            return read_trace_jsonl(path)
        if kind == "torch":
            return read_slime_dump(path)
        return read_trajectories_trace(path, kind)


@contextlib.contextmanager
def _errors_named(setting: str | None, path: Path) -> Iterator[None]:
    """A DataError about ``path`` led by ``setting``; an OSError reading it (no permission, a vanished shard) one
    DataError naming the file."""
    lead = f"{setting} " if setting else ""
    try:
        yield
    except DataError as exc:
        if not lead:
            raise
        raise type(exc)(lead + str(exc)) from exc
    except OSError as exc:
        raise DataError(f"{lead}{exc.filename or path}: cannot read: {exc.strerror or exc}") from exc


def read_any_trace(path: str | Path, *, id_column: str | None = None, length_column: str | None = None,
                   prompt_length_column: str | None = None, sample_index_column: str | None = None,
                   reward_column: str | None = None, finish_reason_column: str | None = None,
                   tokenizer=None, setting: str | None = None) -> LengthTrace:
    """What ``pdsr trace convert`` reads: a JSONL length trace or a trajectories file of ``pdsr rollout`` (as
    :func:`read_trace`) when no column is named; slime's rollout dumps (``.pt``: a file, a folder or a glob pattern,
    :func:`read_slime_dump`, ``reward_column`` the key of a dict reward); verl's generation dumps (``{step}.jsonl``: a
    file, a folder or a glob pattern, :func:`read_verl_dump`) when no id, length, prompt length or sample index column
    is named; else (or when the source is none of these: CSV, a JSONL of one line per response, another tool's table, a
    folder of shards) a table of one row per response (:func:`read_responses_trace`, its columns named by the
    ``*_column`` arguments or found under their usual names). ``tokenizer`` (a Hugging Face tokenizer, the policy's)
    counts text: verl's dumps, a length or prompt length column of text. ``setting``: the argument or flag ``path`` came
    from (``SOURCE``), put before each error about it (missing, unreadable, of no format read, a pattern matching
    nothing, a bad line or column), as ``data.path (--data)`` is before a prompt file's."""
    from pdsr_sdk.io.paths import user_path

    path = user_path(path)
    columns = dict(id_column=id_column, length_column=length_column, prompt_length_column=prompt_length_column,
                   sample_index_column=sample_index_column, reward_column=reward_column,
                   finish_reason_column=finish_reason_column)
    with _errors_named(setting, path):
        return _read_any_trace(path, columns, tokenizer)


def _read_any_trace(path: Path, columns: dict[str, str | None], tokenizer) -> LengthTrace:
    if not any(v is not None for v in columns.values()) and path.is_file():
        try:
            kind = detect_format(path)
        except DataError:
            kind = None   # not pdsr's own (CSV, ...): a table of responses
        if kind == "jsonl" and _is_group_trace(path):
            return read_trace_jsonl(path)
        if kind in ("parquet", "arrow_file", "arrow_stream") and _has_trajectory_columns(path, kind):
            return read_trajectories_trace(path, kind)
    structural = ("id_column", "length_column", "prompt_length_column", "sample_index_column")
    if _is_slime_dump(path):
        named = [k for k in (*structural, "finish_reason_column") if columns[k] is not None]
        if named:
            flags = ", ".join("--" + k.replace("_", "-") for k in named)
            raise DataError(f"{path}: slime's rollout dump (torch.save) has its own keys; {flags} name columns of a "
                            f"table (only --reward-column applies: the key of a dict reward)")
        return read_slime_dump(path, reward_key=columns["reward_column"])
    if all(columns[k] is None for k in structural) and _is_verl_dump(path):
        return read_verl_dump(path, tokenizer, reward_key=columns["reward_column"] or "score",
                              finish_reason_key=columns["finish_reason_column"])
    return read_responses_trace(path, **columns, tokenizer=tokenizer)


def _is_group_trace(path: Path) -> bool:
    """Whether a JSONL file's first line is a trace line (has ``lengths``), or is not one JSON object (then the trace
    reader names what is wrong with it)."""
    import json

    with path.open("r", encoding="utf-8-sig", errors="replace") as fh:
        for line in fh:
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    return True
                return not isinstance(row, dict) or "lengths" in row
    return False   # blank: the responses reader says the file is empty


def _has_trajectory_columns(path: Path, kind: str) -> bool:
    import pyarrow as pa

    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            names = pq.read_schema(path).names
        else:
            with pa.memory_map(str(path)) as source:
                reader = pa.ipc.open_file(source) if kind == "arrow_file" else pa.ipc.open_stream(source)
                names = reader.schema.names
    except Exception:  # noqa: BLE001 - the reader says what is wrong with the file
        return True
    return all(c in names for c in TRAJECTORY_COLUMNS)
