"""Reading a table a batch of rows at a time, so that memory holds a batch, not the file.

Parquet (one file, a folder of shards or a glob pattern of them, all of one schema) is streamed a few thousand
rows at a time; any other input (JSONL, Arrow, CSV, shards whose schemas differ) is read whole by
:func:`~pdsr_sdk.io.tables.read_table` and handed out in batches, so callers need one path only.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow as pa

from pdsr_sdk.errors import DataError
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


def open_table_batches(path: str | Path, columns: Sequence[str] = (), *, what: str = "input") -> TableBatches:
    """``path`` (a file, a folder of shards or a glob pattern, as :func:`~pdsr_sdk.io.tables.read_table` reads)
    ready to read in batches, checking that ``columns`` exist (a DataError naming the missing ones and what the
    file has). Parquet of one schema is streamed; anything else is read whole now."""
    path = Path(path)
    files = _parquet_files(path)
    schema = _one_schema(files) if files else None
    if schema is None:
        table = read_table(path, columns, what=what)
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


def _parquet_files(path: Path) -> list[Path]:
    """The Parquet files ``path`` names (itself, a folder's shards, a pattern's matches), or [] where it names
    anything else (read whole: read_table reads it, or says what is wrong)."""
    if not path.exists() and glob.has_magic(str(path)):
        candidates = sorted(Path(m) for m in glob.glob(str(path)) if Path(m).is_file())
    elif path.is_dir():
        candidates = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    elif path.is_file():
        return [path] if FORMATS.get(path.suffix.lower(), "parquet") == "parquet" else []
    else:
        return []
    shards = [p for p in candidates if p.suffix.lower() in FORMATS and p.name not in SAVE_TO_DISK_METADATA]
    if shards and all(FORMATS[p.suffix.lower()] == "parquet" for p in shards):
        return shards
    return []


def _one_schema(files: list[Path]) -> pa.Schema | None:
    """The schema the files share, or None (unreadable, or differing: read_table unifies them, or names why)."""
    import pyarrow.parquet as pq

    try:
        schemas = [pq.read_schema(f) for f in files]
    except (OSError, pa.ArrowException):
        return None
    first = schemas[0]
    return first if all(s.equals(first) for s in schemas[1:]) else None
