"""Reading only the columns of a rollout log that its trace uses (:func:`read_log_columns`): a log of 1-5 GB is
mostly token ids, log-probs and text a trace does not read. The log's schema is read first (cheap for Parquet and
Arrow IPC; a JSONL file is parsed through once for its keys and types, a batch at a time, converting only the keys a
role or ``extra_names`` name), then its rows a batch at a time, only the columns a role may be read from; a column
of token ids read as a response length is kept as each row's count, not its ids. Errors about a column list every column
of the log (:class:`LogColumns`)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Collection, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from pdsr_sdk.io.columns import TableColumns, is_token_ids


class LogColumns(TableColumns):
    """:class:`~pdsr_sdk.io.columns.TableColumns` of the columns read of a log, whose errors list the whole log's
    columns (``schema``), not only those read."""

    def __init__(self, table: pa.Table, path: Path, schema: pa.Schema):
        super().__init__(table, path)
        self.schema = schema

    def listing(self) -> str:
        return TableColumns(self.schema.empty_table(), self.path).listing()


def read_log_columns(path: Path, kind: str | None, roles: Mapping[str, Sequence[str]],
                     extra: Callable[[pa.Field], bool] = lambda field: False, *, what: str = "rollout log",
                     extra_names: Collection[str] | None = None) -> tuple[pa.Table, pa.Schema, int]:
    """The columns of the log at ``path`` (a file, a folder or a glob pattern of shards) that a trace may read, the
    whole log's schema and its rows (the table's, unless no column is read). ``roles``: each role's names, in the
    order they are looked for (one given by a flag, or the usual ones; a dotted path reads its first part's column):
    the names after the first the schema says is there are not read. ``extra``: whether a column of the log is read too.
    The column of role ``length`` only, when it holds lists of integers (token ids), comes as each row's count (null
    where the row is null).
    ``kind``: the format of the file's content (a :data:`~pdsr_sdk.io.tables.FORMATS` value), None: its name's.
    ``extra_names``: the names ``extra`` may accept (None: any); a JSONL log's keys that neither a role nor these
    name are parsed and typed, for the schema, but not converted."""
    from pdsr_sdk.io.blocks import TableBatches, open_table_batches
    from pdsr_sdk.io.tables import FORMATS, read_table

    if kind is not None and FORMATS.get(path.suffix.lower(), "parquet") != kind:
        # a file named otherwise than its format (server.log holding JSONL): read whole, as its content says
        table = read_table(path, what=what, kind=kind)
        log = TableBatches(path, table.schema, table.num_rows, [], table)
    else:
        only = None if extra_names is None else {part for names in roles.values() for name in names
                                                 for part in (name, name.split(".")[0])} | set(extra_names)
        log = open_table_batches(path, what=what, only=only)
    names, counted = _columns_read(log.schema, roles, extra, path)
    # none to read (the trace's reader says what is missing): no batches, which would read a column for their rows
    parts = [_counted(batch, counted) for batch in log.batches(names)] if names else []
    if not parts:
        parts = [_counted(pa.schema([log.schema.field(n) for n in names]).empty_table(), counted)]
    return pa.concat_tables(parts), log.schema, log.num_rows


def _columns_read(schema: pa.Schema, roles: Mapping[str, Sequence[str]], extra: Callable[[pa.Field], bool],
                  path: Path) -> tuple[list[str], list[str]]:
    """The columns to read (in the log's order), and those of them to count (token ids read as a length only)."""
    probe = TableColumns(schema.empty_table(), path)
    uses: dict[str, set[str]] = {}
    for role, names in roles.items():
        for name in names:
            head = name if name in schema.names else name.split(".")[0]
            if head in schema.names:
                uses.setdefault(head, set()).add("count" if role == "length" and head == name else "read")
            if not _picks_an_item(name, schema) and probe.has(name):
                break   # there on every row: the names after it are never looked for
    for field in schema:
        if extra(field):
            uses.setdefault(field.name, set()).add("read")
    read = [n for n in schema.names if n in uses]
    return read, [n for n in read if uses[n] == {"count"} and is_token_ids(schema.field(n).type)]


def _picks_an_item(name: str, schema: pa.Schema) -> bool:
    """Whether a dotted path picks a list's item (``choices.0.finish_reason``): whether a row has that item is in
    the rows, not the schema."""
    return name not in schema.names and any(part.isdigit() for part in name.split(".")[1:])


def _counted(batch: pa.Table, counted: list[str]) -> pa.Table:
    for name in counted:
        batch = batch.set_column(batch.schema.get_field_index(name), name, pc.list_value_length(batch[name]))
    return batch
