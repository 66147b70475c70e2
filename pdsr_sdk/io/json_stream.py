"""A JSONL file as Arrow tables of a few thousand rows, each column of the type (and values) that reading the whole
file gives (:func:`~pdsr_sdk.io.tables.read_table`, :func:`~pdsr_sdk.io.json_rows.rows_table`), so that a resumed
run and a fresh one, or a streamed read and a whole one, see the same table.

The columns are every line's keys in order of first appearance, as for the whole file: the plan reads the file
through before the first batch is handed out, and every batch has the whole file's columns (null where its lines
lack a key). The whole file's types are Arrow's inference over each column's values, which reads one type per
column from the values up to the first boolean, float (a number written with a point or an exponent) or string
(``[1, 2, 0.5]`` is double; ``[True, 1]`` bool, and a failed conversion), counting every value below (list
items, object fields). :func:`plan_jsonl` reads the file once, a batch at a time, and keeps per column a value
standing for the batches before (of the type inferred so far: ``0`` for int64, ``[0]`` for list<int64>,
``{"a": None}`` for struct<a: null>), which Arrow's inference counts as it would the rows it stands for. Each
batch is converted to the type inferred up to it; the batches converted to another than the file's final type
(an int column with a float on line 90,000) are converted once more to it, reading the file again up to the
last of them. A column mixing numbers and strings is read as strings, numbers written as JSON writes them
(``rows_table``'s rule, over the whole file).
A column that does not convert is the error ``rows_table`` gives, naming the file's line.

Cost: one reading of the file to plan it (a second, partial one where a column's type changed), and one per
:func:`jsonl_batches` call; memory holds a batch of rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow as pa

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.json_rows import column_misfit, json_lines, no_columns, value_kind

#: the errors rows_table catches (it names the column and line); any other is raised as it is
_CAUGHT = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)
#: a column mixing these (and nulls) only is read as strings (json_rows.rows_table)
_NUMBERS_AND_STRINGS = {"a number", "a string"}


@dataclass(frozen=True)
class JsonPlan:
    """How a JSONL file's lines become tables: the whole file's schema and rows, and the columns whose numbers
    are written as text."""

    path: Path
    schema: pa.Schema
    num_rows: int
    as_text: frozenset[str]


@dataclass
class _Column:
    """One column's inference so far (see the module doc)."""

    kinds: set = field(default_factory=set)
    before: list = field(default_factory=list)   #: values standing for the batches before
    type: pa.DataType = field(default_factory=pa.null)
    final: bool = False     #: inference met a boolean, float or string: later values do not change the type
    error: Exception | None = None   #: why the values infer no type (a list beside a number)
    converted: list = field(default_factory=list)   #: (batch, type it was converted to, the error or None)

    def add(self, values: list, batch: int) -> None:
        self.kinds.update(value_kind(v) for v in values)
        if self.error is not None or all(v is None for v in values):   # nulls convert to any type, infer none
            return
        if not self.final:
            try:
                self.type = pa.infer_type(self.before + values)
            except Exception as exc:  # noqa: BLE001 - kept, to be raised where read_table raises it
                self.error = exc
                return
            self.final = any(isinstance(v, (bool, float, str)) for v in values)
            self.before = [] if self.final else [_standing_for(self.type)]
        self.converted.append((batch, self.type, _conversion_error(values, self.type)))


def plan_jsonl(path: Path, rows: int, where: str, what: str) -> JsonPlan:
    """Read ``path`` (a JSONL file) through, ``rows`` lines at a time, for its columns and their types. The error
    :func:`~pdsr_sdk.io.tables.read_table` gives, where it gives one: a DataError naming the line, or the
    exception it names the file with (an int beyond int64); one naming ``where`` (the file) and ``what`` (the
    input) where the file has no column."""
    columns: dict[str, _Column] = {}   # every line's keys, in order of first appearance (rows_table's columns)
    count = batch = 0
    for chunk in _chunks(path, rows):
        for _, row in chunk:
            for name in row:
                if name not in columns:   # a column first seen now: null on the lines before, which infer nothing
                    columns[name] = _Column()
        for name, column in columns.items():
            column.add([row.get(name) for _, row in chunk], batch)
        count += len(chunk)
        batch += 1
    names = list(columns)
    if not names:
        raise no_columns(where, what, count)
    as_text = frozenset(n for n, c in columns.items() if c.kinds - {None} == _NUMBERS_AND_STRINGS)
    errors = _first_errors(path, rows, columns)
    # rows_table: Arrow names the first column that fails; an error other than Arrow's (an int
    # beyond int64) is raised as it is; after Arrow's, it reads the columns mixing numbers and strings as strings
    # and tries again, then names the first column that still fails and its line.
    for name in names:
        if name in errors:
            if not isinstance(errors[name], _CAUGHT):
                raise errors[name]
            break
    for name in names:
        if name in errors and name not in as_text:
            if not isinstance(errors[name], _CAUGHT):
                raise errors[name]
            raise column_misfit(((f"{path}:{lineno}", row.get(name)) for lineno, row in json_lines(path)), name,
                                path)
    types = [(n, pa.string() if n in as_text else columns[n].type) for n in names]
    return JsonPlan(path, pa.schema(types), count, as_text)


def _first_errors(path: Path, rows: int, columns: dict[str, _Column]) -> dict[str, Exception]:
    """Each column's error converting it whole to its type (that of its first value that does not convert), if
    any: batches converted to another type as the file was read are converted again (read again up to them)."""
    again: dict[int, list[str]] = {}
    for name, column in columns.items():
        for index, typ, _ in column.converted:
            if column.error is None and typ != column.type:
                again.setdefault(index, []).append(name)
    redone: dict[tuple[str, int], Exception | None] = {}
    if again:
        last = max(again)
        for index, chunk in enumerate(_chunks(path, rows)):
            for name in again.get(index, ()):
                redone[name, index] = _conversion_error([row.get(name) for _, row in chunk], columns[name].type)
            if index == last:
                break
    errors: dict[str, Exception] = {}
    for name, column in columns.items():
        if column.error is not None:
            errors[name] = column.error
            continue
        for index, typ, error in column.converted:
            error = redone[name, index] if typ != column.type else error
            if error is not None:
                errors[name] = error
                break
    return errors


def jsonl_batches(plan: JsonPlan, columns: Sequence[str] | None, rows: int) -> Iterator[pa.Table]:
    """The file's rows in tables of at most ``rows`` rows (only ``columns``, when given), as :func:`plan_jsonl`
    planned them."""
    fields = [plan.schema.field(n) for n in (columns if columns is not None else plan.schema.names)]
    schema = pa.schema(fields)
    for chunk in _chunks(plan.path, rows):
        arrays = []
        for f in fields:
            values = [row.get(f.name) for _, row in chunk]
            try:
                arrays.append(pa.array(_as_text(values) if f.name in plan.as_text else values, type=f.type))
            except Exception as exc:  # noqa: BLE001 - pyarrow raises many types
                raise DataError(f"{plan.path}:{chunk[0][0]}-{chunk[-1][0]}: column {f.name!r} no longer converts "
                                f"to {f.type}, as it did when the file was first read: the file changed while "
                                f"being read ({exc})") from None
        yield pa.Table.from_arrays(arrays, schema=schema)


def _chunks(path: Path, rows: int) -> Iterator[list[tuple[int, dict[str, Any]]]]:
    chunk: list[tuple[int, dict[str, Any]]] = []
    for item in json_lines(path):
        chunk.append(item)
        if len(chunk) == rows:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _conversion_error(values: list, typ: pa.DataType) -> Exception | None:
    try:
        pa.array(values, type=typ)
        return None
    except Exception as exc:  # noqa: BLE001 - kept, to be raised where read_table raises it
        return exc


def _as_text(values: list) -> list:
    return [json.dumps(v) if value_kind(v) == "a number" else v for v in values]


def _standing_for(typ: pa.DataType) -> Any:
    """A value Arrow's inference counts as it counts values of ``typ`` (of the kinds before inference stops)."""
    if pa.types.is_null(typ):
        return None
    if pa.types.is_list(typ):
        return [_standing_for(typ.value_type)]
    if pa.types.is_struct(typ):
        return {f.name: _standing_for(f.type) for f in typ}
    if pa.types.is_boolean(typ):
        return True
    if pa.types.is_floating(typ):
        return 0.5
    if pa.types.is_integer(typ):
        return 0
    if pa.types.is_string(typ):
        return ""
    raise AssertionError(f"JSON does not infer {typ}")
