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
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.tables import write_text_atomic
from pdsr_sdk.traces.trace import LengthTrace, SampleTurns

REQUIRED_KEYS = ("prompt_id", "prompt_len", "lengths")

#: trajectories columns needed for a trace, and the optional ones used when present
TRAJECTORY_COLUMNS = ("prompt_id", "sample_index", "prompt_length", "response_length")
TRAJECTORY_OPTIONAL = ("finish_reason", "submit_time_s", "finish_time_s", "reward", "turns")
#: optional per-sample keys of a JSONL trace line
OPTIONAL_KEYS = ("durations_s", "finish_reasons", "rewards", "turns")


def read_trace(path: str | Path) -> LengthTrace:
    """Read a JSONL length trace or a trajectories Parquet/Arrow file (detected from its content)."""
    path = Path(path)
    kind = detect_format(path)
    if kind == "jsonl":
        return read_trace_jsonl(path)
    return read_trajectories_trace(path, kind)


def detect_format(path: Path) -> str:
    """``"jsonl"``, ``"parquet"``, ``"arrow_file"`` or ``"arrow_stream"`` from the first bytes of ``path``."""
    if not path.exists():
        raise DataError(f"{path}: trace file does not exist")
    if path.is_dir():
        raise DataError(f"{path}: is a directory; expected a length trace (JSONL) or a trajectories file")
    with path.open("rb") as fh:
        head = fh.read(512)
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"ARROW1"):
        return "arrow_file"
    if head.startswith(b"\xff\xff\xff\xff"):
        return "arrow_stream"
    stripped = head.removeprefix(b"\xef\xbb\xbf").lstrip()  # tolerate a UTF-8 byte-order mark
    if not stripped or stripped.startswith(b"{"):
        return "jsonl"
    raise DataError(f"{path}: not a length trace (JSONL objects, one per line) nor a trajectories file "
                    f"(Parquet or Arrow IPC)")


# -- JSONL ------------------------------------------------------------------------------

def read_trace_jsonl(path: str | Path) -> LengthTrace:
    """Parse a JSONL length trace; errors name ``path:line`` and the offending key.

    Lines are checked for structure as they are read; the values of all lines
    are then converted and checked at once (vectorised), and only when that
    fails are the lines re-scanned to name the first bad one.
    """
    path = Path(path)
    ids: list[str] = []
    prompt_lens: list[int] = []
    lines: list[int] = []                      # line number of each group
    sizes: list[int] = []
    flat: dict[str, list] = {"lengths": [], "durations_s": [], "finish_reasons": [], "rewards": [], "turns": []}
    seen: dict[str, int] = {}
    has_opt: dict[str, int] = {}  # optional key -> +line / -line of the first group that has / lacks it
    for lineno, row in _parse_lines(path):
        where = f"{path}:{lineno}"
        if type(row) is not dict:
            raise DataError(f"{where}: expected a JSON object per line, got {type(row).__name__}")
        missing = [k for k in REQUIRED_KEYS if k not in row]
        if missing:
            raise DataError(f"{where}: missing key(s) {', '.join(map(repr, missing))}; a trace line needs "
                            f"{', '.join(REQUIRED_KEYS)}")
        pid = row["prompt_id"]
        if type(pid) is not str:
            if type(pid) is not int:
                raise DataError(f"{where}: prompt_id must be a string, got {_short(pid)}")
            pid = str(pid)
        if pid in seen:
            raise DataError(f"{where}: duplicate prompt_id {pid!r} (first on line {seen[pid]})")
        seen[pid] = lineno
        plen = row["prompt_len"]
        if type(plen) is not int or plen < 0:
            raise DataError(f"{where}: prompt_len must be a non-negative integer, got {_short(plen)}")
        lens = row["lengths"]
        if type(lens) is not list or not lens:
            raise DataError(f"{where}: lengths must be a non-empty list of integers, got {_short(lens)}")
        n = len(lens)
        flat["lengths"].extend(lens)
        for key in OPTIONAL_KEYS:
            value = row.get(key)
            present = value is not None
            first = has_opt.setdefault(key, lineno if present else -lineno)
            if present != (first > 0):
                raise DataError(f"{where}: this line {'has' if present else 'lacks'} {key!r} but line "
                                f"{abs(first)} {'has it' if first > 0 else 'does not'}; give it for every "
                                f"group or for none")
            if present:
                if type(value) is not list:
                    raise DataError(f"{where}: {key} must be a list, got {_short(value)}")
                if len(value) != n:
                    raise DataError(f"{where}: {key} has {len(value)} entries but lengths has {n}; "
                                    f"expected one per sample")
                flat[key].extend(value)
        ids.append(pid)
        prompt_lens.append(plen)
        lines.append(lineno)
        sizes.append(n)
    if not ids:
        raise DataError(f"{path}: the trace has no groups (expected one JSON object per line)")
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    check = _FlatCheck(path, offsets, lines)
    lengths = check.integers(flat["lengths"], "lengths")
    durations = check.seconds(flat["durations_s"], "durations_s") if has_opt["durations_s"] > 0 else None
    reasons = check.strings(flat["finish_reasons"], "finish_reasons") if has_opt["finish_reasons"] > 0 else None
    rewards = check.rewards(flat["rewards"], "rewards") if has_opt["rewards"] > 0 else None
    turns = check.turns(flat["turns"], lengths) if has_opt["turns"] > 0 else None
    return LengthTrace(prompt_ids=ids, prompt_lens=np.asarray(prompt_lens, dtype=np.int64), lengths=lengths,
                       offsets=offsets, durations_s=durations, finish_reasons=reasons, source=str(path),
                       rewards=rewards, turns=turns)


def _parse_lines(path: Path) -> list[tuple[int, object]]:
    """(line number, parsed value) of every non-blank line.

    One ``json.loads`` of all lines joined as an array is several times
    faster than one call per line; only if it fails are lines parsed one by
    one to name the bad line.
    """
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read trace: {getattr(exc, 'strerror', None) or exc}") from None
    numbered = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    try:
        rows = json.loads("[" + ",".join(line for _, line in numbered) + "]")
        if len(rows) == len(numbered):
            return [(i, row) for (i, _), row in zip(numbered, rows)]
    except json.JSONDecodeError:
        pass
    parsed = []
    for lineno, line in numbered:
        try:
            parsed.append((lineno, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    return parsed


class _FlatCheck:
    """Vectorised checks of one per-sample key over all lines; errors name the first bad line and index."""

    def __init__(self, path: Path, offsets: np.ndarray, lines: list[int]):
        self.path, self.offsets, self.lines = path, offsets, lines

    def _fail(self, key: str, flat_index: int, what: str):
        g = int(np.searchsorted(self.offsets, flat_index, side="right") - 1)
        i = flat_index - int(self.offsets[g])
        raise DataError(f"{self.path}:{self.lines[g]}: {key}[{i}] {what}")

    def _first_bad_type(self, values: list, ok: tuple[type, ...]) -> int | None:
        if set(map(type, values)) <= set(ok):
            return None
        return next(k for k, v in enumerate(values) if type(v) not in ok)

    def integers(self, values: list, key: str) -> np.ndarray:
        bad = self._first_bad_type(values, (int, float))
        if bad is not None:
            self._fail(key, bad, f"is {_short(values[bad])}; expected an integer token count")
        try:
            arr = np.asarray(values)
        except OverflowError:
            arr = np.asarray(values, dtype=object)
        if arr.dtype.kind == "f":
            wrong = ~(np.isfinite(arr) & (arr == np.round(arr)))
            if wrong.any():
                k = int(np.argmax(wrong))
                self._fail(key, k, f"is {values[k]!r}; expected an integer token count")
        elif arr.dtype.kind not in "iu":
            k = next(k for k, v in enumerate(values) if abs(v) >= 2**63)
            self._fail(key, k, f"is {_short(values[k])}; too large for a token count")
        arr = arr.astype(np.int64)
        if arr.min() < 0:
            k = int(np.argmax(arr < 0))
            self._fail(key, k, f"is negative ({int(arr[k])}); lengths are token counts >= 0")
        return arr

    def seconds(self, values: list, key: str) -> np.ndarray:
        bad = self._first_bad_type(values, (int, float))
        if bad is not None:
            self._fail(key, bad, f"is {_short(values[bad])}; expected a number of seconds")
        arr = np.asarray(values, dtype=np.float64)
        wrong = ~(np.isfinite(arr) & (arr >= 0))
        if wrong.any():
            k = int(np.argmax(wrong))
            self._fail(key, k, f"is {values[k]!r}; expected a finite number of seconds >= 0")
        return arr

    def rewards(self, values: list, key: str) -> np.ndarray:
        """Rewards: finite numbers, or null (NaN) for a sample without one."""
        for k, v in enumerate(values):
            if v is not None and (type(v) not in (int, float) or not np.isfinite(v)):
                self._fail(key, k, f"is {_short(v)}; expected a finite number, or null for a sample without a reward")
        return np.asarray([np.nan if v is None else float(v) for v in values], dtype=np.float64)

    def turns(self, values: list, lengths: np.ndarray) -> SampleTurns:
        """Turns: per sample null or a non-empty list of ``[sampled, env_tokens, env_s]`` whose tokens add up to
        the sample's length."""
        out: list[list[tuple[int, int, float]] | None] = []
        for k, v in enumerate(values):
            if v is None:
                out.append(None)
                continue
            if type(v) is not list or not v:
                self._fail("turns", k, f"is {_short(v)}; expected null (a single-turn sample) or a non-empty list "
                                       f"of turns [sampled, env_tokens, env_s]")
            rows = []
            for j, turn in enumerate(v):
                what = f"turn {j} is {_short(turn)}; expected [sampled, env_tokens, env_s]: the tokens the model " \
                       f"sampled (>= 1), then the environment's tokens (>= 0) and its delay in seconds (>= 0)"
                if type(turn) is not list or len(turn) != 3 or not all(type(x) in (int, float) for x in turn):
                    self._fail("turns", k, what)
                sampled, env, delay = turn
                if (sampled != int(sampled) or env != int(env) or sampled < 1 or env < 0
                        or not np.isfinite(delay) or delay < 0):
                    self._fail("turns", k, what)
                rows.append((int(sampled), int(env), float(delay)))
            total = sum(r[0] + r[1] for r in rows)
            if total != int(lengths[k]):
                self._fail("turns", k, f"adds up to {total} tokens (sampled + environment) but lengths[] says "
                                       f"{int(lengths[k])}; a sample's length counts both")
            out.append(rows)
        return SampleTurns.from_lists(out)

    def strings(self, values: list, key: str) -> np.ndarray:
        bad = self._first_bad_type(values, (str,))
        if bad is not None:
            self._fail(key, bad, f"is {_short(values[bad])}; expected a string such as 'stop' or 'length'")
        return np.asarray(values, dtype=object)


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_trace_jsonl(trace: LengthTrace, path: str | Path) -> Path:
    """Write ``trace`` as JSONL (one group per line), atomically (temp file + rename)."""
    lengths = trace.lengths.tolist()
    durations = trace.durations_s.tolist() if trace.durations_s is not None else None
    reasons = [str(r) for r in trace.finish_reasons] if trace.finish_reasons is not None else None
    offsets = trace.offsets.tolist()
    prompt_lens = trace.prompt_lens.tolist()
    lines = []
    for g, pid in enumerate(trace.prompt_ids):
        lo, hi = offsets[g], offsets[g + 1]
        row: dict = {"prompt_id": pid, "prompt_len": prompt_lens[g], "lengths": lengths[lo:hi]}
        if durations is not None:
            row["durations_s"] = durations[lo:hi]
        if reasons is not None:
            row["finish_reasons"] = reasons[lo:hi]
        if trace.rewards is not None:
            row["rewards"] = [None if r != r else r for r in trace.rewards[lo:hi].tolist()]
        if trace.turns is not None:
            row["turns"] = [None if (t := trace.turns.of(i)) is None else [list(x) for x in t] for i in range(lo, hi)]
        lines.append(json.dumps(row))  # ASCII (non-ASCII ids escaped): safe under any locale encoding
    return write_text_atomic("\n".join(lines) + "\n", path)


# -- trajectories tables ----------------------------------------------------------------

def read_trajectories_trace(path: str | Path, kind: str | None = None) -> LengthTrace:
    """Read only the trace columns of a trajectories Parquet / Arrow IPC file and group them."""
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
                reader = pa.ipc.open_file(source) if kind == "arrow_file" else pa.ipc.open_stream(source)
                _require_columns(path, reader.schema.names)
                table = reader.read_all()
        else:
            raise DataError(f"{path}: not a trajectories table (Parquet or Arrow IPC)")
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types
        raise DataError(f"{path}: cannot read trajectories file: {exc}") from None
    return trace_from_trajectories(table, source=str(path))


def _require_columns(path: Path, names: list[str]) -> None:
    missing = [c for c in TRAJECTORY_COLUMNS if c not in names]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(map(repr, missing))} needed for a length trace; "
                        f"the file has: {', '.join(names) or '(no columns)'}")


def trace_from_trajectories(table, *, source: str | None = None) -> LengthTrace:
    """Group a trajectories table (one row per sample) into a ``LengthTrace``.

    Groups appear in the order of their first row; samples are ordered by
    ``sample_index``, which must be exactly 0..n-1 within each group.
    Durations are ``finish_time_s - submit_time_s`` when both columns exist.
    """
    import pyarrow as pa

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
        raise DataError(f"{where}: prompt {group_ids[g]!r} has sample_index values {_short(have)}; expected "
                        f"0..{counts[g] - 1}, each once (0 is the probe)")

    lengths = _int_column(table, "response_length", where)[order]
    if lengths.min() < 0:
        row = int(order[int(np.argmax(lengths < 0))])
        raise DataError(f"{where}: column 'response_length' row {row} is negative")
    plen_rows = _int_column(table, "prompt_length", where)[order]
    prompt_lens = plen_rows[offsets[:-1]]
    if (plen_rows != np.repeat(prompt_lens, counts)).any():
        k = int(np.argmax(plen_rows != np.repeat(prompt_lens, counts)))
        raise DataError(f"{where}: column 'prompt_length' row {int(order[k])} differs from the other samples "
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
                            f"{durations[int(np.argmax(bad))]!r}; expected a finite duration >= 0")
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
            if out and out[-1][1] == 0 and out[-1][2] == 0.0 and last_end is not None and span.get("start_s") is not None:
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
    if not pa.types.is_integer(col.type):
        raise DataError(f"{where}: column {name!r} must be integers, got {col.type}")
    return np.asarray(col.to_numpy(), dtype=np.int64)
