"""Table helpers shared by the commands.

- ``read_table`` reads Parquet, Arrow IPC (file or stream), JSONL (or a JSON
  array), CSV/TSV, or a folder or glob pattern of such shards; checks the file and the columns
  a command needs and names them in errors.
- ``check_writable`` says before a long run whether an output can be written.
- ``write_table_atomic`` / ``write_text_atomic`` / ``atomic_path`` write to a
  temp file beside the target and rename, so an interrupted run never leaves
  a half-written output.
- ``list_column_to_numpy`` / ``numpy_to_list_array`` convert between Arrow
  list columns (one ragged row per sample) and flat numpy buffers.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
from pydantic import AfterValidator

from pdsr_sdk.errors import ConfigError, ConfigValueError, DataError
from pdsr_sdk.io.json_rows import first_non_utf8, json_lines, no_columns, not_utf8, rows_table
from pdsr_sdk.io.paths import labelled, resolve_inputs, user_path
from pdsr_sdk.io.padding import pad_rows


#: the formats read_table knows by a file's suffix; any other name is read as Parquet
FORMATS = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".arrow": "arrow", ".ipc": "arrow",
           ".feather": "arrow", ".csv": "csv", ".tsv": "csv"}


#: what a Hugging Face dataset's save_to_disk writes beside its .arrow files: not data
SAVE_TO_DISK_METADATA = frozenset({"dataset_info.json", "state.json"})


def read_table(path: str | Path, columns: Sequence[str] | Mapping[str, str] = (), *, what: str = "input",
               kind: str | None = None, setting: str | None = None) -> pa.Table:
    """Read a Parquet, Arrow IPC, JSONL (or a .json array of objects) or CSV/TSV file (by its suffix; any other
    is read as Parquet; ``kind``, one of ``FORMATS``' values, reads a file as that format whatever its name), or a
    folder of such files or a glob pattern matching them (shards of one format, in name order:
    :func:`~pdsr_sdk.io.paths.resolve_inputs`), checking that ``columns`` exist (:func:`check_columns`). A CSV's
    columns are all read as text, as written (an answer ``0.50`` or an id ``007`` is not turned into a number); an
    empty cell is missing (null). ``setting``: the flag or config key that gave ``path``, named in the errors about the
    whole input."""
    path = user_path(path)
    files = resolve_inputs(path, FORMATS, what=what, setting=setting, ignore=SAVE_TO_DISK_METADATA)
    if files == [path]:
        table = _read_file(path, what, kind, setting)
    else:
        table = _concat([_read_file(f, what) for f in files], labelled(path, setting))
    check_columns(path, columns, table.column_names)
    return table


def check_columns(path: str | Path, columns: Sequence[str] | Mapping[str, str], have: Sequence[str]) -> None:
    """A DataError naming the ``columns`` that ``have`` lacks, and what the file has. ``columns`` may map each name
    to the flag or config key that chose it, named beside it (``'response_token_ids' (--response-column)``)."""
    missing = [c for c in columns if c not in have]
    if missing:
        chosen = columns if isinstance(columns, Mapping) else {}
        named = ", ".join(f"{c!r} ({chosen[c]})" if c in chosen else repr(c) for c in missing)
        raise DataError(f"{path}: missing column(s) {named}; the file has: {', '.join(have) or '(no columns)'}")


def _read_file(path: Path, what: str, kind: str | None = None, setting: str | None = None) -> pa.Table:
    suffix = path.suffix.lower()
    kind = kind or FORMATS.get(suffix, "parquet")
    where = labelled(path, setting)
    if path.stat().st_size == 0:
        raise DataError(f"{where}: the {what} file is empty")
    try:
        if kind == "jsonl":
            table = _read_jsonl(path, where, what)
        elif kind == "arrow":
            table = _read_arrow(path)
        elif kind == "csv":
            table = _read_csv(path, "\t" if suffix == ".tsv" else ",")
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(path)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types
        if kind in ("jsonl", "csv") and (bad := first_non_utf8(path)):
            raise DataError(not_utf8(path, *bad)) from None
        known = "" if suffix in FORMATS or kind != "parquet" else (
            f" (a {suffix or 'suffix-less'} name is read as Parquet; pdsr reads {', '.join(FORMATS)})")
        raise DataError(f"{where}: cannot read {what} file as {kind}{known}: {exc}") from None
    if table.num_columns == 0 and table.num_rows == 0:   # blank lines only
        raise DataError(f"{where}: the {what} file is empty")
    return table


def _concat(tables: list[pa.Table], where: str) -> pa.Table:
    """Shards as one table; ``where`` names the folder or pattern. Their columns are the union of theirs (in order of
    first appearance), a column a shard lacks null there (Arrow's "default" promotion)."""
    try:
        schema = pa.unify_schemas([t.schema for t in tables], promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DataError(f"{where}: its files do not share one schema: {exc}") from None
    return pa.concat_tables([conformed(t, schema) for t in tables])


def conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` (a shard) with the columns of ``schema``, the shards' union (:func:`pyarrow.unify_schemas`, default
    promotion): a column the shard lacks is null; one whose type has nulls where the union's has not (null,
    list<null>, an object without some of the union's fields) is cast."""
    columns = []
    for f in schema:
        if f.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, f.type))
            continue
        column = table.column(f.name)
        if column.type == f.type:
            columns.append(column)
        elif _null_inside(column.type):
            # pyarrow (26) casts a list<null> inside an object to an invalid array (its child's length is the
            # object's): converted from Python instead, slower, for such a column only
            columns.append(pa.array(column.to_pylist(), type=f.type))
        else:
            columns.append(column.cast(f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _null_inside(typ: pa.DataType) -> bool:
    """Whether a nested type holds the null type (list<null>, struct<a: list<null>>)."""
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return pa.types.is_null(typ.value_type) or _null_inside(typ.value_type)
    if pa.types.is_struct(typ):
        return any(pa.types.is_null(f.type) or _null_inside(f.type) for f in typ)
    return False


def _read_arrow(path: Path) -> pa.Table:
    """An Arrow IPC file (Feather), or an Arrow IPC stream (what a Hugging Face dataset's ``save_to_disk`` writes
    into its ``.arrow`` files)."""
    import pyarrow.feather as feather

    try:
        return feather.read_table(path)
    except pa.ArrowInvalid:
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).read_all()


def _read_csv(path: Path, delimiter: str) -> pa.Table:
    import pyarrow.csv as csv

    parse = csv.ParseOptions(delimiter=delimiter, newlines_in_values=True)   # a quoted prompt may span lines
    with csv.open_csv(path, parse_options=parse) as reader:   # the header: every column's name
        names = reader.schema.names
    return csv.read_csv(path, parse_options=parse,
                        convert_options=csv.ConvertOptions(column_types={n: pa.string() for n in names},
                                                           strings_can_be_null=True, null_values=[""]))


def _read_jsonl(path: Path, where: str, what: str) -> pa.Table:
    """JSON Lines, one object a line; a ``.json`` file may instead hold one array of objects. The columns are every
    object's keys (null where an object lacks one). A column mixing numbers and strings is read as strings; any
    other mix of types is an error naming the line and column (:func:`~pdsr_sdk.io.json_rows.rows_table`). A file
    without a column (blank lines, an empty array, objects without keys) is an error naming ``where``."""
    if path.suffix.lower() == ".json" and _starts_array(path):
        try:
            items = json.loads(path.read_text(encoding="utf-8-sig"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
        bad = next((i for i, item in enumerate(items) if not isinstance(item, dict)), None)
        if bad is not None:
            raise DataError(f"{path}: item {bad} of the array: expected a JSON object, got {type(items[bad]).__name__}")
        if not any(items):
            raise no_columns(where, what, len(items), array=True)
        return rows_table(items, path, lambda i: f"{path}: item {i} of the array")
    rows, linenos = [], []
    for lineno, row in json_lines(path):
        rows.append(row)
        linenos.append(lineno)
    if not any(rows):
        raise no_columns(where, what, len(rows))
    return rows_table(rows, path, lambda i: f"{path}:{linenos[i]}")


def json_array_file(path: Path) -> bool:
    """Whether ``path`` is a .json file holding one array of objects (read whole), not JSON Lines."""
    return path.suffix.lower() == ".json" and _starts_array(path)


def _starts_array(path: Path) -> bool:
    with path.open(encoding="utf-8-sig", errors="replace") as fh:
        while chunk := fh.read(4096):
            head = chunk.lstrip()
            if head:
                return head.startswith("[")
    return False


def write_table_atomic(table: pa.Table, path: str | Path, *, compression: str = "zstd") -> Path:
    """Write ``table`` as Parquet to ``path`` via a temp file and an atomic rename."""
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression=compression)
    return Path(path)


def write_text_atomic(text: str, path: str | Path) -> Path:
    """Write a small text file (JSON summaries) atomically."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)
    return Path(path)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[str]:
    """Yield a temp file's path beside ``path`` to write; rename it over ``path`` when the block
    succeeds, remove it when it fails (an interrupted write never leaves a half-written file)."""
    path = Path(path)
    tmp = _temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parquet_name(path: Path) -> Path:
    """``path``, unless its suffix names a format other than Parquet (``out.jsonl``, ``out.csv``): pdsr's outputs
    are Parquet and :func:`read_table` reads a file by its suffix, so such a name could not be read back."""
    kind = FORMATS.get(path.suffix.lower())
    if kind not in (None, "parquet"):
        raise ConfigValueError(f"{path}: this output is written as Parquet, not {path.suffix}; name it "
                               f"{path.with_suffix('.parquet').name}")
    return path


#: a config's output path of a Parquet file, ``~`` expanded (:func:`parquet_name` checks it when the config is
#: validated)
ParquetPath = Annotated[Path, AfterValidator(user_path), AfterValidator(parquet_name)]


def check_new_output(path: str | Path, what: str, *, overwrite: bool, config_key: str | None = "overwrite",
                     inputs: Iterable[tuple[str, str | Path | None]] = ()) -> None:
    """:func:`check_writable`, and an existing file at ``path`` is an error unless ``overwrite`` (a job that writes
    one file, such as ``pdsr score`` or ``pdsr gae``, replaces nothing it was not told to). ``config_key``: the
    job's config key that allows it, named beside the flag (None: a flag only). ``inputs``: (flag or argument, path)
    of each file the job reads; ``path`` being one of them is an error, ``overwrite`` or not."""
    check_distinct(path, what, inputs)
    if Path(path).exists() and not overwrite:
        key = f" ({config_key}: true)" if config_key else ""
        raise DataError(f"{what} {path}: already exists; pass --overwrite{key} to replace it")
    check_writable(path, what)


def check_distinct(path: str | Path, what: str, others: Iterable[tuple[str, str | Path | None]]) -> None:
    """A ConfigError naming ``what`` and the other's flag where ``path`` is one of ``others`` ((flag, path), a
    None path skipped): an output must not be a job's input or another of its outputs."""
    for name, other in others:
        if other is not None and _same_file(path, other):
            raise ConfigError(f"{what} and {name} are the same file {path}; give them different paths")


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)   # links too
    except OSError:   # one does not exist (yet)
        return Path(a).resolve() == Path(b).resolve()


def check_writable(path: str | Path, what: str) -> None:
    """Raise DataError (naming ``what``, e.g. "--out", and the path) unless ``path`` can be written atomically:
    not a folder, and its folder (or the nearest existing ancestor, for one still to be created) takes a new
    file. Tries a temp file there (removed at once), so it holds for root and read-only mounts too."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{what} {path}: is a folder; expected a file path")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise DataError(f"{what} {path}: cannot create its folder: {folder} is a file, not a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".check", dir=folder)
    except OSError as exc:
        raise DataError(f"{what} {path}: cannot write in {folder}: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(tmp)


def write_png(fig, path: str | Path, *, dpi: int = 110) -> None:
    """Save a matplotlib figure as a PNG atomically, then close it if pyplot made it (pyplot keeps its figures
    alive; a figure made outside pyplot has nothing to close, and pyplot is not imported for it)."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi, format="png", bbox_inches="tight")  # nothing clipped at the edges
    finally:
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            pyplot.close(fig)


def remove_stale_temps(path: str | Path) -> list[Path]:
    """Remove the temp files that atomic writes of ``path`` left when their process was killed (``kill -9``: no
    clean-up ran), half-written; returns them. Only for a path no other process is writing (a held lock)."""
    path = Path(path)
    stale = sorted(path.parent.glob(f".{glob.escape(path.name)}.{'?' * 8}.tmp")) if path.parent.is_dir() else []
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return stale


def _temp_beside(path: Path) -> str:
    """A new empty file next to ``path`` (same filesystem: the rename is atomic) with the
    permissions a plain ``open`` would give it (``mkstemp`` makes it 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
    finally:
        os.close(fd)
    return tmp


_UMASK: int | None = None


def _umask() -> int:
    global _UMASK
    if _UMASK is None:   # reading the umask means setting it; once per process
        _UMASK = os.umask(0o022)
        os.umask(_UMASK)
    return _UMASK


def list_column_to_numpy(column: pa.ChunkedArray | pa.Array, dtype, *, name: str = "column",
                         path: str | Path = "") -> tuple[np.ndarray, np.ndarray]:
    """Flatten a list column: returns (values, offsets) with ``offsets[i]:offsets[i+1]`` for row i.

    Raises DataError naming the first null row, or the column where ``dtype`` is given and its items are not
    numbers (``dtype=None`` takes the items as they are).
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        raise DataError(f"{path}: column {name!r} must be a list column, got {column.type}")
    if column.null_count:
        row = int(np.flatnonzero(~np.asarray(column.is_valid()))[0])
        raise DataError(f"{path}: column {name!r} row {row} is null; expected a list")
    item = column.type.value_type
    numbers = pa.types.is_integer(item) or pa.types.is_floating(item) or pa.types.is_boolean(item)
    # list<null>: every list empty (a JSON reader's type for [] throughout); a null item is refused below
    if dtype is not None and not (numbers or pa.types.is_null(item)):
        raise DataError(f"{path}: column {name!r} must be a list of numbers per row, got {column.type}")
    offsets = np.asarray(column.offsets, dtype=np.int64)
    values = column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    offsets = offsets - offsets[0]
    if values.null_count:
        flat = int(np.flatnonzero(~np.asarray(values.is_valid()))[0])
        row = int(np.searchsorted(offsets, flat, side="right") - 1)
        raise DataError(f"{path}: column {name!r} row {row} has a null element")
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=dtype), offsets


def numpy_to_list_array(values: np.ndarray, offsets: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    """Inverse of :func:`list_column_to_numpy`."""
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=value_type))


def ragged_to_padded(values: np.ndarray, offsets: np.ndarray, *, fill=0, dtype=None) -> tuple[np.ndarray, np.ndarray]:
    """Flat ragged rows -> a right-padded [B, T_max] array and the row lengths."""
    lengths = np.diff(offsets)
    width = int(lengths.max()) if len(lengths) else 0
    return pad_rows(values, offsets, width, fill=fill, dtype=dtype), lengths


def padded_to_ragged(padded: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A right-padded [B, T] array -> (flat values, offsets)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    mask = np.arange(padded.shape[1])[None, :] < lengths[:, None]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return padded[mask], offsets


def iter_rows_as_lists(column: pa.ChunkedArray) -> Iterable[list]:
    """Python lists of a list column, row by row (for small tables and messages)."""
    for chunk in column.chunks:
        yield from chunk.to_pylist()
