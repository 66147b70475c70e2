"""JSON objects (a JSONL file's lines, a .json file's array) as one Arrow table, one column per key.

The columns are every object's keys, in order of first appearance (as pyarrow.json and pandas read JSONL): a key
first written on a later line is a column too, null on the lines without it.

Arrow wants one type per column. Hand-made data often mixes numbers and strings in an answer or label column
(``"answer": 18`` on one line, ``"answer": "\\frac{1}{2}"`` on the next): such a column is read as strings,
each number as JSON writes it (``18``, ``0.5``), as a CSV's cells are. Any other mix is a DataError naming the
file, the line (or item) and the column, with the type it has there and where the column first had another.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa

from pdsr_sdk.errors import DataError


def json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number from 1, object) of each non-blank line of a JSONL file, a byte-order mark skipped (Windows
    tools write one); a DataError names the line of one that is not a JSON object, or not UTF-8 text."""
    try:
        with path.open(encoding="utf-8-sig") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise not_json_line(path, lineno, exc) from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}:{lineno}: expected a JSON object per line, got {type(row).__name__}")
                yield lineno, row
    except UnicodeDecodeError:
        # the codec's offset is into a read buffer, not the file: find the byte's line
        raise DataError(not_utf8(path, *(first_non_utf8(path) or (0, 0)))) from None


#: a file up to this size whose first line is no JSON is parsed whole, to say when it is one JSON document
WHOLE_DOCUMENT_BYTES = 64 << 20


def not_json_line(path: Path, lineno: int, exc: json.JSONDecodeError) -> DataError:
    """The error for a JSONL line that is no JSON. Where the line is the file's first and the whole file is one
    JSON object or array spread over lines (a pretty-printed report, such as ``pdsr rollout``'s ``.summary.json``
    or ``pdsr analyze``'s ``analysis.json``), it says so: the parser's words alone ("Expecting property name")
    call a valid JSON file invalid and do not say what the file is."""
    message = f"{path}:{lineno}: not valid JSON: {exc.msg} (column {exc.colno})"
    try:
        if path.stat().st_size > WHOLE_DOCUMENT_BYTES:
            return DataError(message)
        text = path.read_text(encoding="utf-8-sig")
        if lineno != next(i for i, line in enumerate(text.splitlines(), 1) if line.strip()):
            return DataError(message)
        whole = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError, StopIteration):
        return DataError(message)
    if not isinstance(whole, (dict, list)):
        return DataError(message)
    lines = text.count("\n") + (not text.endswith("\n"))
    what = (f"one JSON object over {lines} lines (a report, such as pdsr rollout's .summary.json or pdsr analyze's "
            f"analysis.json), not JSON Lines (one JSON object per line)" if isinstance(whole, dict) else
            f"one JSON array over {lines} lines, not JSON Lines (one JSON object per line)")
    return DataError(f"{path}: {what}; line {lineno} alone is not valid JSON ({exc.msg})")


def first_non_utf8(path: Path) -> tuple[int, int] | None:
    """(line number, byte) of the first byte of ``path`` that is not UTF-8, if any."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
        return None
    except UnicodeDecodeError as exc:
        return data.count(b"\n", 0, exc.start) + 1, data[exc.start]


def not_utf8(path: Path, line: int, byte: int) -> str:
    """The error for a text file with a byte that is not UTF-8 at ``line``."""
    return (f"{path}:{line}: not UTF-8 text (byte 0x{byte:02x}); pdsr reads text files as UTF-8: re-encode it "
            f"(e.g. iconv -f latin1 -t utf-8)")


def no_columns(where: str, what: str, objects: int, *, array: bool = False) -> DataError:
    """The error for a JSONL file (``array``: a .json file's array) that has no column: no object (blank lines
    only, an empty array), or ``objects`` objects of which none has a key."""
    if objects == 0:
        return DataError(f"{where}: the {what} file holds an empty array; expected an array of JSON objects" if array
                         else f"{where}: the {what} file has only blank lines; expected a JSON object per line")
    if objects == 1:
        every = "its one object is" if array else "its one line is"
    else:
        every = f"all {objects:,} objects of its array are" if array else f"all {objects:,} lines are"
    return DataError(f"{where}: the {what} file has no column: {every} {{}}, an object without keys")


def rows_table(rows: list[dict[str, Any]], path: Path, where: Callable[[int], str]) -> pa.Table:
    """``rows`` as a table, a column per key any row has; ``where(i)`` names row ``i`` in errors
    (``f"{path}:{lineno}"``)."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    try:
        return _table(rows, keys)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    for key in keys:
        kinds = {value_kind(row.get(key)) for row in rows} - {None}
        if kinds == {"a number", "a string"}:
            for row in rows:
                value = row.get(key)
                if value_kind(value) == "a number":
                    row[key] = json.dumps(value)
    try:
        return _table(rows, keys)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        for key in keys:
            _check_column(rows, key, path, where)
        raise DataError(f"{path}: cannot read its objects as one table: {exc}") from None


def _table(rows: list[dict[str, Any]], keys: list[str]) -> pa.Table:
    # not pa.Table.from_pylist: it takes the first row's keys as the columns and drops any other
    return pa.Table.from_pydict({key: [row.get(key) for row in rows] for key in keys})


def value_kind(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _check_column(rows: list[dict[str, Any]], key: str, path: Path, where: Callable[[int], str]) -> None:
    """A DataError at the first row whose ``key`` does not fit the type the column's values before it have."""
    try:
        pa.array([row.get(key) for row in rows])
        return
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    raise column_misfit(((where(i), row.get(key)) for i, row in enumerate(rows)), key, path)


def column_misfit(values: Iterable[tuple[str, Any]], key: str, path: Path) -> DataError:
    """The error for column ``key`` of ``path`` whose values do not make one Arrow column, at the first value that
    does not fit the column's first non-null one; ``values``: (where it is, e.g. ``f"{path}:{lineno}"``, value)."""
    first: tuple[str, Any] | None = None
    for here, value in values:
        if value is None:
            continue
        if first is None:
            first = here, value
            continue
        try:
            pa.array([first[1], value])
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            kind, there = value_kind(value), value_kind(first[1])
            what = (f"{kind} here but {there} at {first[0]}" if kind != there else
                    f"{kind} here whose fields do not match those at {first[0]} ({exc})")
            return DataError(f"{here}: column {key!r} is {what}; a column must keep one type (numbers and "
                             f"strings may mix: such a column is read as strings)")
    return DataError(f"{path}: column {key!r}: its values do not make one Arrow column")
