"""Reading a table a batch of rows at a time, so that memory holds a batch, not the file.

Parquet, Arrow IPC and JSONL inputs (one file, a folder of shards or a glob pattern of them; shards whose columns
differ as the union of their columns, null where a shard lacks one, as read_table concatenates them) are streamed a few
thousand rows at a time, with the columns, types and values that :func:`~pdsr_sdk.io.tables.read_table` gives for the
whole input: Parquet by row groups, Arrow IPC's file format memory-mapped and its stream format (a Hugging Face
dataset's ``save_to_disk`` files) a record batch at a time (a compressed record batch is decompressed whole), JSONL as
:mod:`~pdsr_sdk.io.json_stream` says (parsed once, first, for the whole file's columns and types, its batches kept in a
temporary file they are read from). The rest (CSV, a ``.json`` file holding one array, Feather V1) is read whole by
``read_table`` and handed out in batches, so callers need one path only; shards whose types differ are read_table's
error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, Iterator, Mapping, Sequence

import pyarrow as pa

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.json_rows import first_non_utf8, not_utf8
from pdsr_sdk.io.json_stream import JsonPlan, jsonl_batches, plan_jsonl
from pdsr_sdk.io.paths import labelled, resolve_inputs, user_path
from pdsr_sdk.io.tables import (FORMATS, SAVE_TO_DISK_METADATA, check_columns, conformed, json_array_file,
                                read_table)

#: rows per batch read from a file
BATCH_ROWS = 4096


@dataclass
class TableBatches:
    """A table to read in batches (see :func:`open_table_batches`)."""

    path: Path
    schema: pa.Schema
    num_rows: int
    files: list[Path]            #: the files streamed, in order; empty when the table was read whole
    table: pa.Table | None = None
    kind: str = "parquet"        #: the streamed files' format: parquet, arrow or jsonl
    plans: list[JsonPlan] = field(default_factory=list)   #: a JSONL file's columns, one per file
    file_schemas: list[pa.Schema] = field(default_factory=list)   #: each streamed file's own schema

    @property
    def streamed(self) -> bool:
        return self.table is None

    def batches(self, columns: Sequence[str] | None = None, rows: int = BATCH_ROWS) -> Iterator[pa.Table]:
        """The rows in order, in tables of at most ``rows`` rows (only ``columns``, when given)."""
        if self.table is not None:
            table = self.table.select(list(columns)) if columns is not None else self.table
            for start in range(0, table.num_rows, rows):
                yield table.slice(start, min(rows, table.num_rows - start))   # a table of no columns does not clamp
            return
        fields = [self.schema.field(n) for n in (columns if columns is not None else self.schema.names)]
        wanted = pa.schema(fields, metadata=self.schema.metadata)
        for index, (file, own) in enumerate(zip(self.files, self.file_schemas)):
            # a shard without some of the columns (or null throughout one) is read for those it has (at least one,
            # for its rows), the rest null, as read_table's concatenation makes them
            names = [f.name for f in fields if f.name in own.names]
            if self.kind == "jsonl" and not names and self.plans[index].converted is not None:
                # its first column may not be converted (open_table_batches' only): its rows are all there is
                read = _null_batches(self.plans[index].num_rows, wanted, rows)
            elif self.kind == "jsonl":
                read = jsonl_batches(self.plans[index], names or own.names[:1], rows)
            else:
                read = (_ipc_batches if self.kind == "arrow" else _parquet_batches)(file, names or own.names[:1], rows)
            for batch in read:
                if not fields:   # no column asked for: the rows still count, which a table built of no columns
                    yield batch.select([])   # (or given metadata, pyarrow 26) loses; a selection keeps them
                    continue
                fits = batch.column_names == wanted.names and batch.schema.types == wanted.types
                yield batch if fits else conformed(batch, wanted)


def open_table_batches(path: str | Path, columns: Sequence[str] | Mapping[str, str] = (), *,
                       what: str = "input", setting: str | None = None,
                       only: Collection[str] | None = None) -> TableBatches:
    """``path`` (a file, a folder of shards or a glob pattern, as :func:`~pdsr_sdk.io.tables.read_table` reads)
    ready to read in batches, checking that ``columns`` exist (:func:`~pdsr_sdk.io.tables.check_columns`).
    Parquet, Arrow IPC and JSONL are streamed, shards whose columns differ as their union (a JSONL file is parsed
    now, for its types, and its batches kept in a temporary file; its errors are read_table's); anything else is
    read whole now. ``setting``: the flag or config key that gave ``path``, named in the errors about the
    whole input. ``only``: the only columns ``batches`` will be asked for; a JSONL file's other keys are in the
    schema but not converted (nor are their values checked)."""
    path = user_path(path)
    files = resolve_inputs(path, FORMATS, what=what, setting=setting, ignore=SAVE_TO_DISK_METADATA)
    kind = FORMATS.get(files[0].suffix.lower(), "parquet")   # a single file of another name is read as Parquet
    plans: list[JsonPlan] = []
    if kind == "jsonl":
        plans = _jsonl_plans(files, path, what, setting, only)
        opened = [(p.schema, p.num_rows) for p in plans] or None
    elif kind == "arrow":
        opened = _ipc_files(files)
    elif kind == "parquet":
        opened = _parquet_files(files, what)
    else:
        opened = None
    schema = _one_schema([s for s, _ in opened]) if opened else None
    if schema is None:   # read_table names why the schemas do not unify
        table = read_table(path, columns, what=what, setting=setting)
        return TableBatches(path, table.schema, table.num_rows, [], table)
    check_columns(path, columns, schema.names)
    return TableBatches(path, schema, sum(rows for _, rows in opened or ()), files, kind=kind, plans=plans,
                        file_schemas=[s for s, _ in opened or ()])


def _one_schema(schemas: list[pa.Schema]) -> pa.Schema | None:
    """The shards' schema as read_table's concatenation makes it: theirs where they have one, else their union (the
    columns in order of first appearance across the shards; a column missing from a shard, or null throughout it,
    is null there); None where they do not unify (read_table names why)."""
    if all(s.equals(schemas[0]) for s in schemas[1:]):
        return schemas[0]
    try:
        return pa.unify_schemas(schemas, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


# ------------------------------------------------------------------ Parquet

def _parquet_files(files: list[Path], what: str) -> list[tuple[pa.Schema, int]] | None:
    """Each file's schema and rows, or None where one cannot be read (read_table names why)."""
    import pyarrow.parquet as pq

    try:
        schemas = [pq.read_schema(f) for f in files]
    except (OSError, pa.ArrowException):
        return None
    out = []
    for file, schema in zip(files, schemas):
        try:
            out.append((schema, pq.ParquetFile(file).metadata.num_rows))
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{file}: cannot read {what} file as parquet: {exc}") from None
    return out


def _parquet_batches(file: Path, names: list[str] | None, rows: int) -> Iterator[pa.Table]:
    import pyarrow.parquet as pq

    try:
        # no pre-buffering: it reads a row group's column chunks ahead whole (430 MiB of a 308 MB file held at once
        # in pdsr gae), where a 1 MiB read buffer holds about what a batch needs (136 MiB)
        with pq.ParquetFile(file, pre_buffer=False, buffer_size=1 << 20) as reader:
            for batch in reader.iter_batches(batch_size=rows, columns=names):
                yield pa.Table.from_batches([batch])
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{file}: cannot read it as Parquet: {exc}") from None


# ------------------------------------------------------------------ Arrow IPC

def _ipc_files(files: list[Path]) -> list[tuple[pa.Schema, int]] | None:
    """Each file's schema and rows (a stream's batches are read to count them), or None where one is neither
    format (read_table reads Feather V1, or names why not)."""
    out = []
    for file in files:
        try:
            with _ipc_reader(file) as reader:
                rows = reader.count_rows() if isinstance(reader, pa.ipc.RecordBatchFileReader) else \
                    sum(batch.num_rows for batch in reader)
                out.append((reader.schema, rows))
        except (OSError, pa.ArrowException):
            return None
    return out


def _ipc_reader(file: Path):
    """The file format's reader over a memory map (no copy: the rows are read as they are used), else the stream
    format's."""
    source = pa.memory_map(str(file))
    try:
        return pa.ipc.open_file(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_stream(source)


def _ipc_batches(file: Path, names: list[str] | None, rows: int) -> Iterator[pa.Table]:
    try:
        with _ipc_reader(file) as reader:
            if isinstance(reader, pa.ipc.RecordBatchFileReader):
                batches: Iterator[pa.RecordBatch] = (reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                batches = iter(reader)
            for batch in batches:
                batch = batch.select(names) if names is not None else batch
                for start in range(0, batch.num_rows, rows):
                    yield pa.Table.from_batches([batch.slice(start, rows)])
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{file}: cannot read it as Arrow IPC: {exc}") from None


# ------------------------------------------------------------------ JSONL

def _null_batches(num_rows: int, schema: pa.Schema, rows: int) -> Iterator[pa.Table]:
    for start in range(0, num_rows, rows):
        count = min(rows, num_rows - start)
        yield pa.Table.from_arrays([pa.nulls(count, f.type) for f in schema], schema=schema)


def _jsonl_plans(files: list[Path], path: Path, what: str, setting: str | None,
                 only: Collection[str] | None) -> list[JsonPlan]:
    """Each file's plan (:func:`~pdsr_sdk.io.json_stream.plan_jsonl`), with read_table's errors; [] where a file
    is a .json array (read whole)."""
    if any(json_array_file(f) for f in files):
        return []
    plans = []
    for file in files:
        where = labelled(path, setting) if files == [path] else str(file)   # as read_table names them
        if file.stat().st_size == 0:
            raise DataError(f"{where}: the {what} file is empty")
        try:
            plans.append(plan_jsonl(file, BATCH_ROWS, where, what, only))
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - what read_table says of it (an int beyond int64)
            if bad := first_non_utf8(file):
                raise DataError(not_utf8(file, *bad)) from None
            raise DataError(f"{where}: cannot read {what} file as jsonl: {exc}") from None
    return plans
