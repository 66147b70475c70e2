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
batch is converted to the type inferred up to it and kept, compressed, in a temporary file
(:mod:`~pdsr_sdk.io.spill`); the batches converted to another than the file's final type (an int column with a
float on line 90,000) are converted once more to it, reading the file again up to the last of them. A column
mixing numbers and strings is read as strings, numbers written as JSON writes them (``rows_table``'s rule, over
the whole file): its batches from the first that mixes them on are kept as text.
A column that does not convert is the error ``rows_table`` gives, naming the file's line.

A plan of some keys only (``columns``) infers the others' types, for the schema, but does not convert them.

Cost: one reading and parsing of the file to plan it (a second, partial one where a column's type changed);
:func:`jsonl_batches` reads the temporary file, no JSON, as often as it is called (and the file may change
meanwhile: the batches are what was planned). Memory holds a batch of rows; the temporary file takes about a third
of the JSONL's size for token ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Iterator, Sequence

import pyarrow as pa

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.json_rows import column_misfit, json_lines, no_columns, value_kind
from pdsr_sdk.io.spill import Segment, Spill

#: the errors rows_table catches (it names the column and line); any other is raised as it is
_CAUGHT = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)
#: a column mixing these (and nulls) only is read as strings (json_rows.rows_table)
_NUMBERS_AND_STRINGS = {"a number", "a string"}


@dataclass(frozen=True)
class JsonPlan:
    """How a JSONL file's lines became tables: the whole file's schema and rows, and each batch's columns as the
    plan converted them (kept in ``spill``)."""

    path: Path
    schema: pa.Schema
    num_rows: int
    spill: Spill
    batches: list[_Batch]
    #: the columns converted (None: all); the others are in ``schema`` but cannot be read
    converted: frozenset[str] | None = None


@dataclass
class _Batch:
    """One batch of lines: its rows, first line, and where each column's array lies in the spill (none: null)."""

    rows: int
    first_line: int
    segments: dict[str, Segment] = field(default_factory=dict)
    unconverted: set[str] = field(default_factory=set)   #: columns with values that did not convert


@dataclass
class _Column:
    """One column's inference so far (see the module doc)."""

    kinds: set = field(default_factory=set)
    before: list = field(default_factory=list)   #: values standing for the batches before
    type: pa.DataType = field(default_factory=pa.null)
    final: bool = False     #: inference met a boolean, float or string: later values do not change the type
    error: Exception | None = None   #: why the values infer no type (a list beside a number)
    converted: list = field(default_factory=list)   #: (batch, type it was converted to, the error or None)
    read: bool = True   #: converted (else its type is inferred only, for the schema)

    def add(self, values: list, batch: int) -> pa.Array | None:
        """Infer from ``values`` (batch ``batch``'s) and convert them: the array, None where they are all null or
        do not convert (or the column is not ``read``). Once the column has mixed numbers and strings, the values
        as text (as the column is read unless a value of another kind follows, which is an error)."""
        self.kinds.update(value_kind(v) for v in values)
        if all(v is None for v in values):   # nulls convert to any type, infer none
            return None
        array = None
        if self.error is None and not self.final:
            try:
                self.type = pa.infer_type(self.before + values)
            except Exception as exc:  # noqa: BLE001 - kept, to be raised where read_table raises it
                self.error = exc
            else:
                self.final = any(isinstance(v, (bool, float, str)) for v in values)
                self.before = [] if self.final else [_standing_for(self.type)]
        if not self.read:
            return None
        if self.error is None:
            array, error = _convert(values, self.type)
            self.converted.append((batch, self.type, error))
        if self.kinds - {None} == _NUMBERS_AND_STRINGS:
            return pa.array(_as_text(values), pa.string())
        return array


def plan_jsonl(path: Path, rows: int, where: str, what: str,
               columns: Collection[str] | None = None) -> JsonPlan:
    """Read ``path`` (a JSONL file) through, ``rows`` lines at a time, for its columns and their types, keeping
    each batch's columns in a spill. The error :func:`~pdsr_sdk.io.tables.read_table` gives, where it gives one: a
    DataError naming the line, or the exception it names the file with (an int beyond int64); one naming ``where``
    (the file) and ``what`` (the input) where the file has no column. ``columns``: the only keys to convert (the
    others' types are inferred, for the schema, and their values neither converted nor checked; the arrays of
    these, and the errors, are those of the file holding only them)."""
    # every line's keys, in order of first appearance (rows_table's columns)
    plan: dict[str, _Column] = {}
    spill = Spill(where)
    batches: list[_Batch] = []
    for chunk in _chunks(path, rows):
        for _, row in chunk:
            for name in row:
                if name not in plan:   # a column first seen now: null on the lines before, which infer nothing
                    plan[name] = _Column(read=columns is None or name in columns)
        batch = _Batch(len(chunk), chunk[0][0])
        for name, column in plan.items():
            values = [row.get(name) for _, row in chunk]
            array = column.add(values, len(batches))
            if array is not None:
                batch.segments[name] = spill.write(array)
            elif column.read and any(v is not None for v in values):
                batch.unconverted.add(name)
        batches.append(batch)
    names = list(plan)
    if not names:
        raise no_columns(where, what, sum(b.rows for b in batches))
    as_text = frozenset(n for n, c in plan.items() if c.kinds - {None} == _NUMBERS_AND_STRINGS)
    types = {n: pa.string() if n in as_text else plan[n].type for n in names}
    errors = _read_again(path, rows, plan, batches, types, as_text, spill)
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
    for batch in batches:
        for name in batch.unconverted:   # converted whole, read_table's table has it: read again, it does not
            raise DataError(f"{path}:{batch.first_line}: column {name!r} does not convert to {types[name]} in the "
                            f"{batch.rows} lines from here, though the file's column does: the file changed while "
                            f"being read")
    return JsonPlan(path, pa.schema(list(types.items())), sum(b.rows for b in batches), spill, batches,
                    None if columns is None else frozenset(n for n in names if plan[n].read))


def _read_again(path: Path, rows: int, columns: dict[str, _Column], batches: list[_Batch],
                types: dict[str, pa.DataType], as_text: frozenset[str], spill: Spill) -> dict[str, Exception]:
    """Each column's error converting it whole to its inferred type (that of its first value that does not
    convert), if any. The batches converted to another type than the file's (``types``) as it was read are read
    again, up to the last of them, and converted to it: the errors at the inferred type, the arrays (kept) at the
    file's."""
    errors_again: dict[int, list[str]] = {}
    arrays_again: dict[int, list[str]] = {}
    for name, column in columns.items():
        for index, typ, _ in column.converted:
            if column.error is None and typ != column.type:
                errors_again.setdefault(index, []).append(name)
    for index, batch in enumerate(batches):
        for name, segment in batch.segments.items():
            if segment.type != types[name]:
                arrays_again.setdefault(index, []).append(name)
        if batch.unconverted:
            arrays_again.setdefault(index, []).extend(batch.unconverted)
    redone: dict[tuple[str, int], Exception | None] = {}
    if errors_again or arrays_again:
        last = max(errors_again.keys() | arrays_again.keys())
        for index, chunk in enumerate(_chunks(path, rows)):
            batch = batches[index] if index < len(batches) else None
            if batch is None or (batch.rows, batch.first_line) != (len(chunk), chunk[0][0]):
                raise DataError(f"{path}:{chunk[0][0]}: the file changed while being read")
            for name in dict.fromkeys(errors_again.get(index, []) + arrays_again.get(index, [])):
                values = [row.get(name) for _, row in chunk]
                if name in errors_again.get(index, ()):
                    redone[name, index] = _convert(values, columns[name].type)[1]
                if name in arrays_again.get(index, ()):
                    array, _ = _convert(_as_text(values) if name in as_text else values, types[name])
                    if array is not None:   # else an error of the column, raised by plan_jsonl
                        batch.segments[name] = spill.write(array)
                        batch.unconverted.discard(name)
            if index == last:
                break
    errors: dict[str, Exception] = {}
    for name, column in columns.items():
        if not column.read:
            continue
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
    converted them."""
    names = columns if columns is not None else plan.schema.names
    if plan.converted is not None and (left := [n for n in names if n not in plan.converted]):
        raise ValueError(f"{plan.path}: column(s) {', '.join(left)} were not converted when the file was planned")
    fields = [plan.schema.field(n) for n in names]
    schema = pa.schema(fields)
    held: list[pa.Table] = []
    count = 0
    for batch in plan.batches:
        table = pa.Table.from_arrays([plan.spill.read(batch.segments[f.name]) if f.name in batch.segments
                                      else pa.nulls(batch.rows, f.type) for f in fields], schema=schema)
        start = 0
        while start < table.num_rows:
            take = min(rows - count, table.num_rows - start)
            held.append(table.slice(start, take))
            count += take
            start += take
            if count == rows:
                yield _joined(held)
                held, count = [], 0
    if held:
        yield _joined(held)


def _joined(tables: list[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables).combine_chunks()


def _chunks(path: Path, rows: int) -> Iterator[list[tuple[int, dict[str, Any]]]]:
    chunk: list[tuple[int, dict[str, Any]]] = []
    for item in json_lines(path):
        chunk.append(item)
        if len(chunk) == rows:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _convert(values: list, typ: pa.DataType) -> tuple[pa.Array | None, Exception | None]:
    try:
        return pa.array(values, type=typ), None
    except Exception as exc:  # noqa: BLE001 - kept, to be raised where read_table raises it
        return None, exc


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
