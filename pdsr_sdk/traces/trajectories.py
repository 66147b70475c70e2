"""A length trace from a trajectories table as ``pdsr rollout`` writes it (Parquet or Arrow IPC, one row per sample;
the columns are described in :mod:`pdsr_sdk.traces.io`): read its trace columns and group them by prompt."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pdsr_sdk.errors import DataError
from pdsr_sdk.traces.formats import detect_format, short_repr
from pdsr_sdk.traces.trace import LengthTrace, SampleTurns

#: trajectories columns needed for a trace, and the optional ones used when present
TRAJECTORY_COLUMNS = ("prompt_id", "sample_index", "prompt_length", "response_length")
TRAJECTORY_OPTIONAL = ("finish_reason", "submit_time_s", "finish_time_s", "reward", "turns")


def read_trajectories_trace(path: str | Path, kind: str | None = None) -> LengthTrace:
    """Read only the trace columns of a trajectories Parquet / Arrow IPC file (file or stream) and group them."""
    import pyarrow as pa

    path = Path(path)
    kind = kind or detect_format(path)
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            names = pq.read_schema(path).names
            _require_columns(path, names)
            table = pq.read_table(path, columns=[c for c in (*TRAJECTORY_COLUMNS, *TRAJECTORY_OPTIONAL)
                                                 if c in names])
        elif kind in ("arrow_file", "arrow_stream"):
            with pa.memory_map(str(path)) as source:
                names = _ipc_reader(source, kind).schema.names
            _require_columns(path, names)
            # only those columns: a compressed file's others (token ids, text) would be decompressed whole too
            used = sorted(names.index(c) for c in (*TRAJECTORY_COLUMNS, *TRAJECTORY_OPTIONAL) if c in names)
            with pa.memory_map(str(path)) as source:
                table = _ipc_reader(source, kind, pa.ipc.IpcReadOptions(included_fields=used)).read_all()
        else:
            raise DataError(f"{path}: not a trajectories table (Parquet or Arrow IPC)")
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types
        raise DataError(f"{path}: cannot read trajectories file: {exc}") from None
    return trace_from_trajectories(table, source=str(path))


def _ipc_reader(source, kind: str, options=None):
    import pyarrow as pa

    return (pa.ipc.open_file if kind == "arrow_file" else pa.ipc.open_stream)(source, options=options)


def _require_columns(path: Path, names: list[str]) -> None:
    missing = [c for c in TRAJECTORY_COLUMNS if c not in names]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(map(repr, missing))} needed for a length trace; "
                        f"the file has: {', '.join(names) or '(no columns)'}; a rollout log with other column names: "
                        f"`pdsr trace convert {path} --id-column ... --length-column ... --out trace.jsonl`")


def trace_from_trajectories(table, *, source: str | None = None, labels: dict[str, str] | None = None) -> LengthTrace:
    """Group a trajectories table (one row per sample) into a ``LengthTrace``.

    Groups appear in the order of their first row; samples are ordered by
    ``sample_index``, which must be exactly 0..n-1 within each group.
    Durations are ``finish_time_s - submit_time_s`` when both columns exist.
    ``labels`` names a column in errors by another name (the column of the user's file it came from).
    """
    import pyarrow as pa

    labels = labels or {}
    where = source or "trajectories"
    _require_columns(Path(where), table.column_names)
    if table.num_rows == 0:
        raise DataError(f"{where}: the trajectories table has no rows")
    for name in (*TRAJECTORY_COLUMNS, *TRAJECTORY_OPTIONAL):
        if name not in ("reward", "turns") and name in table.column_names and table[name].null_count:
            row = int(np.flatnonzero(~np.asarray(table[name].is_valid()))[0])
            raise DataError(f"{where}: column {name!r} row {row} is null")

    ids_col = table["prompt_id"].combine_chunks()
    if not (pa.types.is_string(ids_col.type) or pa.types.is_large_string(ids_col.type)):
        ids_col = ids_col.cast(pa.string())
    # Arrow's dictionary encoding numbers values in order of first appearance.
    encoded = ids_col.dictionary_encode()
    code = np.asarray(encoded.indices, dtype=np.int64)
    group_ids = encoded.dictionary.to_pylist()

    sample_index = _int_column(table, "sample_index", where)
    order = np.lexsort((sample_index, code))
    counts = np.bincount(code, minlength=len(group_ids))
    offsets = np.zeros(len(group_ids) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    starts = np.repeat(offsets[:-1], counts)
    expected = np.arange(len(order), dtype=np.int64) - starts
    got = sample_index[order]
    if (got != expected).any():
        k = int(np.argmax(got != expected))
        g = int(code[order[k]])
        have = sample_index[order[offsets[g]:offsets[g + 1]]].tolist()
        raise DataError(f"{where}: prompt {group_ids[g]!r} has {labels.get('sample_index', 'sample_index')} values "
                        f"{short_repr(have)}; expected "
                        f"0..{counts[g] - 1}, each once (0 is the probe)")

    lengths = _int_column(table, "response_length", where)[order]
    if lengths.min() < 0:
        row = int(order[int(np.argmax(lengths < 0))])
        raise DataError(f"{where}: column 'response_length' row {row} is negative")
    plen_rows = _int_column(table, "prompt_length", where)[order]
    prompt_lens = plen_rows[offsets[:-1]]
    if (plen_rows != np.repeat(prompt_lens, counts)).any():
        k = int(np.argmax(plen_rows != np.repeat(prompt_lens, counts)))
        raise DataError(f"{where}: column {labels.get('prompt_length', 'prompt_length')!r} row {int(order[k])} "
                        f"differs from the other samples "
                        f"of prompt {group_ids[int(code[order[k]])]!r}")

    durations = None
    if "submit_time_s" in table.column_names and "finish_time_s" in table.column_names:
        submit = np.asarray(table["submit_time_s"].to_numpy(), dtype=np.float64)[order]
        finish = np.asarray(table["finish_time_s"].to_numpy(), dtype=np.float64)[order]
        durations = finish - submit
        bad = ~(np.isfinite(durations) & (durations >= 0))
        if bad.any():
            row = int(order[int(np.argmax(bad))])
            raise DataError(f"{where}: row {row}: finish_time_s - submit_time_s is "
                            f"{float(durations[int(np.argmax(bad))])!r}; expected a finite duration >= 0")
    reasons = None
    if "finish_reason" in table.column_names:
        reasons = np.asarray(table["finish_reason"].to_pylist(), dtype=object)[order]
    rewards = None
    if "reward" in table.column_names and table["reward"].null_count < table.num_rows:
        rewards = np.asarray([np.nan if r is None else float(r) for r in table["reward"].to_pylist()],
                             dtype=np.float64)[order]
    turns = None
    if "turns" in table.column_names and table["turns"].null_count < table.num_rows:
        rows = table["turns"].to_pylist()
        turns = SampleTurns.from_lists([_trace_turns(rows[int(r)], int(r), where) for r in order])
    return LengthTrace(prompt_ids=group_ids, prompt_lens=prompt_lens, lengths=lengths, offsets=offsets,
                       durations_s=durations, finish_reasons=reasons, source=source, rewards=rewards, turns=turns)


def _trace_turns(spans: list | None, row: int, where: str) -> list[tuple[int, int, float]] | None:
    """A trajectories row's ``turns`` spans as trace turns ``(sampled, env_tokens, env_s)``: each assistant span
    opens a turn, the environment spans after it add their tokens and their time (``end_s - start_s``). Two assistant
    spans with no environment span between (the agent added nothing) count the time between them instead."""
    if spans is None:
        return None
    out: list[list] = []
    last_end: float | None = None
    for j, span in enumerate(spans):
        role, n = span.get("role"), span.get("num_tokens")
        if type(n) is not int or n < 0:
            raise DataError(f"{where}: row {row}: turns[{j}].num_tokens is {n!r}; expected a token count >= 0")
        if role == "assistant":
            if (out and out[-1][1] == 0 and out[-1][2] == 0.0 and last_end is not None
                    and span.get("start_s") is not None):
                out[-1][2] = max(0.0, float(span["start_s"]) - last_end)
            if n == 0:
                continue   # a turn that sampled nothing (failed before its first token): nothing to replay
            out.append([n, 0, 0.0])
            last_end = span.get("end_s")
        elif role == "environment":
            if not out:
                raise DataError(f"{where}: row {row}: turns[{j}] is an environment span before any assistant span; "
                                f"a trace of turns starts with the model's turn")
            start, end = span.get("start_s"), span.get("end_s")
            out[-1][1] += n
            if start is not None and end is not None:
                out[-1][2] += max(0.0, float(end) - float(start))
        else:
            raise DataError(f"{where}: row {row}: turns[{j}].role is {role!r}; expected 'assistant' or 'environment'")
    if not out:
        return None
    return [(int(a), int(b), float(c)) for a, b, c in out]


def _int_column(table, name: str, where: str) -> np.ndarray:
    import pyarrow as pa

    col = table[name]
    if pa.types.is_integer(col.type):
        return np.asarray(col.to_numpy(), dtype=np.int64)
    if pa.types.is_floating(col.type):
        # a float column (verl and pandas dumps store lengths as doubles) is read when every value is whole
        values = np.asarray(col.to_numpy(), dtype=np.float64)
        bad = ~(np.isfinite(values) & (values == np.round(values)) & (np.abs(values) < 2.0**63))
        if bad.any():
            row = int(np.argmax(bad))
            raise DataError(f"{where}: column {name!r} row {row} is {float(values[row])!r}; expected a whole number "
                            f"(a float column is read when every value is one)")
        return values.astype(np.int64)
    raise DataError(f"{where}: column {name!r} must be integers (or whole floats), got {col.type}")
