"""A table's columns by name or by a dotted path into struct and list columns (:class:`TableColumns`), with errors
that name the file, the flag and config key, and what was expected: how ``pdsr rollout`` reads a prompt dataset's
columns and ``pdsr trace convert`` another tool's log."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pdsr_sdk.errors import DataError


def is_token_ids(kind: pa.DataType) -> bool:
    """Whether a column of type ``kind`` holds token ids: lists of integers (``list<null>`` where every list is
    empty or null, as Arrow types a column it saw no id in)."""
    return ((pa.types.is_list(kind) or pa.types.is_large_list(kind))
            and (pa.types.is_integer(kind.value_type) or pa.types.is_null(kind.value_type)))


def integer_token_ids(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A token-id column (:func:`is_token_ids`) with integer items: a ``list<null>`` one (no id seen: every list
    empty or null) as lists of int64, its nulls kept for the caller's checks; another as it is."""
    kind = column.type
    if not pa.types.is_null(kind.value_type):
        return column
    return column.cast(pa.large_list(pa.int64()) if pa.types.is_large_list(kind) else pa.list_(pa.int64()))


class TableColumns:
    """A table's columns by name, or by a dotted path into struct columns (a number in the path picks that item of a
    list column: ``choices.0.finish_reason``); errors name the file, the flag and config key (when it has one),
    and what was expected."""

    def __init__(self, table: pa.Table, path: Path):
        self.table, self.path = table, path

    def has(self, name: str) -> bool:
        return self._find(name)[0] is not None

    def get(self, name: str, key: str | None, flag: str) -> pa.ChunkedArray:
        column, missing = self._find(name)
        if column is None:
            raise DataError(f"{self.path}: {f'{key} ({flag})' if key else flag} is {name!r} but {missing}; columns: "
                            f"{self.listing()}")
        return column

    def expect(self, name: str, ok, expected: str, key: str | None, flag: str) -> None:
        kind = self.get(name, key, flag).type
        if ok(kind):
            return
        hint = ""
        if pa.types.is_struct(kind):
            fields = [kind.field(i).name for i in range(kind.num_fields)]
            hint = f": name one of its fields ({', '.join(fields)}) with a dotted path, e.g. {flag} {name}.{fields[0]}"
        raise DataError(f"{self.path}: column {name!r} ({f'{key}, {flag}' if key else flag}) is {kind}; "
                        f"expected {expected}{hint}")

    def values(self, name: str) -> list:
        return self._find(name)[0].to_pylist()

    def listing(self) -> str:
        out = []
        for field in self.table.schema:
            kind = field.type
            sub = [kind.field(i).name for i in range(kind.num_fields)] if pa.types.is_struct(kind) else []
            out.append(f"{field.name} (fields: {', '.join(sub)})" if sub else field.name)
        return ", ".join(out) or "(no columns)"

    def _find(self, name: str) -> tuple[pa.ChunkedArray | None, str]:
        column, missing = self._lookup(name)
        if column is not None and pa.types.is_dictionary(column.type):
            # a pandas categorical written to Parquet (data_source, an answer): read as its values' type
            column = column.cast(column.type.value_type)
        return column, missing

    def _lookup(self, name: str) -> tuple[pa.ChunkedArray | None, str]:
        if name in self.table.column_names:
            return self.table.column(name), ""
        head, *rest = name.split(".")
        if head not in self.table.column_names:
            return None, "the file has no such column"
        column, done = self.table.column(head), head
        for part in rest:
            kind = column.type
            if part.isdigit() and (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
                try:
                    column, done = pc.list_element(column, int(part)), f"{done}.{part}"
                except pa.ArrowInvalid:
                    return None, f"a row's {done!r} has fewer than {int(part) + 1} item(s)"
                continue
            if not pa.types.is_struct(kind) or kind.get_field_index(part) < 0:
                fields = ([kind.field(i).name for i in range(kind.num_fields)] if pa.types.is_struct(kind) else [])
                return None, (f"column {done!r} has no field {part!r}" + (f" (fields: {', '.join(fields)})"
                                                                         if fields else f" (it is {kind})"))
            column, done = pc.struct_field(column, part), f"{done}.{part}"
        return column, ""
