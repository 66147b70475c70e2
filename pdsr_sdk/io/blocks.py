"""Reading a table a batch of rows at a time, so that memory holds a batch, not the file.

Parquet (one file, a folder of shards or a glob pattern of them, all of one schema) is streamed a few thousand
rows at a time; any other input (JSONL, Arrow, CSV, shards whose schemas differ) is read whole by
:func:`~pdsr_sdk.io.tables.read_table` and handed out in batches, so callers need one path only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow as pa

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.paths import resolve_inputs, user_path
from pdsr_sdk.io.tables import FORMATS, SAVE_TO_DISK_METADATA, read_table

#: rows per batch read from a Parquet file
BATCH_ROWS = 4096


@dataclass
class TableBatches:
    """A table to read in batches (see :func:`open_table_batches`)."""

    path: Path
    schema: pa.Schema
    num_rows: int
    files: list[Path]            #: the Parquet files streamed, in order; empty when the table was read whole
    table: pa.Table | None = None

    @property
    def streamed(self) -> bool:
        return self.table is None

    def batches(self, columns: Sequence[str] | None = None, rows: int = BATCH_ROWS) -> Iterator[pa.Table]:
        """The rows in order, in tables of at most ``rows`` rows (only ``columns``, when given)."""
        if self.table is not None:
            table = self.table.select(list(columns)) if columns is not None else self.table
            for start in range(0, table.num_rows, rows):
                yield table.slice(start, rows)
            return
        import pyarrow.parquet as pq

        names = list(columns) if columns is not None else None
        for file in self.files:
            try:
                with pq.ParquetFile(file) as reader:
                    for batch in reader.iter_batches(batch_size=rows, columns=names):
                        yield pa.Table.from_batches([batch])
            except (OSError, pa.ArrowException) as exc:
                raise DataError(f"{file}: cannot read it as Parquet: {exc}") from None


def open_table_batches(path: str | Path, columns: Sequence[str] = (), *, what: str = "input",
                       setting: str | None = None) -> TableBatches:
    """``path`` (a file, a folder of shards or a glob pattern, as :func:`~pdsr_sdk.io.tables.read_table` reads)
    ready to read in batches, checking that ``columns`` exist (a DataError naming the missing ones and what the
    file has). Parquet of one schema is streamed; anything else is read whole now. ``setting``: the flag or config
    key that gave ``path``, named in the errors about the whole input."""
    path = user_path(path)
    files = _parquet_files(path, what, setting)
    schema = _one_schema(files) if files else None
    if schema is None:
        table = read_table(path, columns, what=what, setting=setting)
        return TableBatches(path, table.schema, table.num_rows, [], table)
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(repr(c) for c in missing)}; "
                        f"the file has: {', '.join(schema.names) or '(no columns)'}")
    import pyarrow.parquet as pq

    rows = 0
    for file in files:
        try:
            rows += pq.ParquetFile(file).metadata.num_rows
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{file}: cannot read {what} file as parquet: {exc}") from None
    return TableBatches(path, schema, rows, files)


def _parquet_files(path: Path, what: str, setting: str | None) -> list[Path]:
    """The Parquet files ``path`` names (itself, a folder's shards, a pattern's matches), or [] where it names
    other files (read whole); one that cannot be read as Parquet is read_table's to name."""
    files = resolve_inputs(path, FORMATS, what=what, setting=setting, ignore=SAVE_TO_DISK_METADATA)
    kind = FORMATS.get(files[0].suffix.lower(), "parquet")   # a single file of another name is read as Parquet
    return files if kind == "parquet" else []


def _one_schema(files: list[Path]) -> pa.Schema | None:
    """The schema the files share, or None (unreadable, or differing: read_table unifies them, or names why)."""
    import pyarrow.parquet as pq

    try:
        schemas = [pq.read_schema(f) for f in files]
    except (OSError, pa.ArrowException):
        return None
    first = schemas[0]
    return first if all(s.equals(first) for s in schemas[1:]) else None
