"""Streaming, resumable trajectories output.

Finished groups are written as small Parquet part files (each written
atomically) into ``<out>.parts/`` while the run goes on, so an interrupted
run keeps every finished group. At the end the parts are merged into
``<out>`` (atomic rename) and the parts directory is removed. ``resume``
reads the finished prompt ids from both, and the run skips them. The merged file records how many part
files it holds (:data:`MERGED_KEY`), so that parts a run killed before removing them leaves beside it are
not read (nor merged) twice; new parts are numbered after them.
A file the writer cannot write (a full disk, a read-only folder) is a DataError naming it; so is a part file that
went missing while the run went on (the output folder deleted): the merge would otherwise present what is left as
the whole run.
``overwrite`` removes the old output only when the first new group is
written (a run that fails before that leaves it as it was). A multi-step
run also keeps the groups it carries between steps in
``<out>.parts/_carry.parquet``, which ``resume`` continues.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from pathlib import Path
from typing import Iterator

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.output_lock import parts_dir
from pdsr_sdk.io.tables import write_table_atomic

CARRY_FILE = "_carry.parquet"   # "_": dataset readers of the parts folder skip it
#: metadata of the merged output: the parts numbered below it are in it (parts are numbered on across resumes)
MERGED_KEY = b"pdsr_parts_merged"
_PART = re.compile(r"part-(\d+)\.parquet")


class TrajectoryWriter:
    def __init__(self, path: str | Path, schema, *, resume: bool = False, overwrite: bool = False,
                 flush_groups: int = 16, flush_interval_s: float = 10.0, metadata: dict[str, str] | None = None):
        import pyarrow as pa

        self.path = Path(path)
        self.parts_dir = parts_dir(self.path)
        self.schema = (schema.with_metadata({**(schema.metadata or {}),
                                             **{k.encode(): v.encode() for k, v in (metadata or {}).items()}})
                       if metadata else schema)
        self.flush_groups = flush_groups
        self.flush_interval_s = flush_interval_s
        self._rows: list[dict] = []
        self._groups = 0
        self._last_flush = time.monotonic()
        self._pa = pa
        exists = self.path.exists() or self.parts_dir.exists()
        if exists and not (resume or overwrite):
            raise DataError(f"{self.path}: output already exists (or an interrupted run left {self.parts_dir.name}/); "
                            f"pass --resume to continue it or --overwrite to replace it")
        self._replace = exists and overwrite and not resume
        self._next_part = 0 if self._replace else _next_part_number(self.path)
        #: the files the output is made of so far (a resumed run's, then each part written): all must be there to merge
        self._holds: list[Path] = [] if self._replace else existing_files(self.path)
        #: groups in the part files this writer wrote (0 once a part went missing)
        self.groups_on_disk = 0

    # -------------------------------------------------------------- resume
    def finished_prompt_ids(self) -> set[str]:
        """Prompt ids whose groups are already on disk (final file and part files)."""
        import pyarrow.parquet as pq

        done: set[str] = set()
        for f in self._existing_files():
            try:
                col = pq.read_table(f, columns=["prompt_id"]).column("prompt_id")
            except Exception as exc:  # noqa: BLE001
                raise DataError(f"{f}: cannot read the existing output to resume: {exc}") from None
            done.update(col.to_pylist())
        return done

    def _existing_files(self) -> list[Path]:
        return [] if self._replace else existing_files(self.path)

    def _remove_old(self) -> None:
        if self._replace:
            self.path.unlink(missing_ok=True)
            shutil.rmtree(self.parts_dir, ignore_errors=True)
            self._replace = False

    # -------------------------------------------------------------- writing
    def add_group(self, rows: list[dict]) -> None:
        self._rows.extend(rows)
        self._groups += 1
        if self._groups >= self.flush_groups or time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()

    def flush(self) -> None:
        """Write buffered groups as one part file (atomically)."""
        if not self._rows:
            return
        table = self._pa.Table.from_pylist(self._rows, schema=self.schema)
        self._remove_old()
        if self._holds and not self._holds[-1].exists():   # one stat: the last part is gone with its folder
            self._missing()
        part = self.parts_dir / f"part-{self._next_part:06d}.parquet"
        with write_errors_named(part):
            self.parts_dir.mkdir(parents=True, exist_ok=True)
            write_table_atomic(table, part)
        self._holds.append(part)
        self._next_part += 1
        self.groups_on_disk += self._groups
        self._rows.clear()
        self._groups = 0
        self._last_flush = time.monotonic()

    def write_carry(self, rows: list[dict], schema) -> None:
        """Replace ``<out>.parts/_carry.parquet`` (atomically) with the groups a multi-step run has in flight
        (``rows`` in ``schema``); no rows removes it. Call it after :meth:`flush`, so that a group is on
        disk as consumed or as carried, or (between the two writes) as both: resume drops a carried group
        that is also consumed."""
        path = carry_file(self.path)
        if not rows:
            path.unlink(missing_ok=True)
            return
        self._remove_old()
        with write_errors_named(path):
            self.parts_dir.mkdir(parents=True, exist_ok=True)
            write_table_atomic(self._pa.Table.from_pylist(rows, schema=schema.with_metadata(self.schema.metadata)),
                               path)

    def finalize(self) -> Path:
        """Merge everything on disk into the output file and remove the parts (a reward's dict fields become a
        struct column where they allow it: ``reward_extra_struct``)."""
        self.flush()
        self._remove_old()
        if any(not f.exists() for f in self._holds):
            self._missing()
        merged = self.schema.with_metadata({**(self.schema.metadata or {}), MERGED_KEY: str(self._next_part).encode()})
        with write_errors_named(self.path):   # killed from here to the parts' removal: MERGED_KEY skips them
            merge_files(self._existing_files(), merged, self.path)
        shutil.rmtree(self.parts_dir, ignore_errors=True)
        return self.path

    def _missing(self) -> None:
        gone = [f for f in self._holds if not f.exists()]
        more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
        self.groups_on_disk = 0   # nothing this run wrote is known to be kept
        raise DataError(f"{gone[0]}{more}: removed while the run was writing {self.path} (its folder, or "
                        f"{self.parts_dir.name}/, deleted?); the groups in them are lost, so the output is not "
                        f"merged as if complete. Rerun with --resume: the groups no longer on disk run again")


def merge_files(files: list[Path], schema, path: Path, *, batch_rows: int = 1024) -> None:
    """Write the rows of ``files`` (trajectory files, in order) to ``path`` in ``schema`` (atomically), streamed
    ``batch_rows`` rows at a time: a run of a million long responses does not fit in memory at once. Only the
    ``reward_extra`` column is read whole first, to decide whether it can be a struct column
    (:func:`~pdsr_sdk.dispatch.trajectory.reward_extra_struct` needs every row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pdsr_sdk.dispatch.trajectory import reward_extra_json, reward_extra_struct
    from pdsr_sdk.io.tables import atomic_path

    plain = pa.schema(list(schema))   # the columns' types, without the file's metadata
    extra = None
    if "reward_extra" in schema.names:
        field = schema.field("reward_extra")
        text = [reward_extra_json(pq.read_table(f, columns=["reward_extra"])).column("reward_extra").cast(field.type)
                for f in files]
        extra = reward_extra_struct(pa.table([pa.chunked_array([c for t in text for c in t.chunks], field.type)],
                                             schema=pa.schema([field]))).column("reward_extra")
        i = schema.get_field_index("reward_extra")
        schema = schema.set(i, schema.field(i).with_type(extra.type))
    def row_groups():
        """The rows in row groups of ``batch_rows`` (the last may be short): the same groups however the rows were
        split before, so a merged file merged again is the same file."""
        held: list = []
        for f in files:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=batch_rows):
                held.append(_conform(reward_extra_json(pa.Table.from_batches([batch])), plain))
                while sum(t.num_rows for t in held) >= batch_rows:
                    rows = pa.concat_tables(held)
                    yield rows.slice(0, batch_rows)
                    held = [rows.slice(batch_rows)]
        if held and sum(t.num_rows for t in held):
            yield pa.concat_tables(held)

    offset = 0
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, schema, compression="zstd") as out:
        for table in row_groups():
            if extra is not None:
                i = table.schema.get_field_index("reward_extra")
                table = table.set_column(i, schema.field(i), extra.slice(offset, table.num_rows))
            offset += table.num_rows
            out.write_table(table.replace_schema_metadata(schema.metadata))
        if offset == 0:
            out.write_table(schema.empty_table())


@contextlib.contextmanager
def write_errors_named(path: Path) -> Iterator[None]:
    """An OSError writing ``path`` (a full disk, a file size limit, a read-only or deleted folder) as a DataError
    naming it: pyarrow's own message names no file."""
    try:
        yield
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise DataError(f"{path}: cannot write it ({reason})") from exc


def carry_file(path: str | Path) -> Path:
    """Where a multi-step run writing ``path`` keeps the groups it has in flight (see ``write_carry``)."""
    return parts_dir(path) / CARRY_FILE


def existing_files(path: str | Path) -> list[Path]:
    """The trajectory files of ``path`` on disk: the merged file, then the part files of an unfinished run (those
    the merged file already holds left out)."""
    path = Path(path)
    merged = _merged_parts(path)
    files = [path] if path.exists() else []
    return files + [p for n, p in _part_files(path) if n >= merged]


def _part_files(path: Path) -> list[tuple[int, Path]]:
    """(number, path) of every part file of ``path``, in order."""
    parts = parts_dir(path)
    found = ((_PART.fullmatch(p.name), p) for p in parts.glob("part-*.parquet")) if parts.is_dir() else ()
    return sorted((int(m.group(1)), p) for m, p in found if m)


def _merged_parts(path: Path) -> int:
    """How many part files the merged output ``path`` holds (0 without one, or written before it said)."""
    import pyarrow.parquet as pq

    if not path.is_file():
        return 0
    try:
        return int((pq.read_schema(path).metadata or {}).get(MERGED_KEY, b"0"))
    except Exception:  # noqa: BLE001 - unreadable: reading its rows says so, naming the file
        return 0


def _next_part_number(path: Path) -> int:
    """The number of the next part file: after every part on disk and every part merged into ``path``."""
    return max([_merged_parts(path)] + [n + 1 for n, _ in _part_files(path)])


def _conform(table, schema):
    """``table`` (a part or earlier file) in ``schema``: a nullable column it lacks (one a later pdsr added, such as
    stop_reason, in a run resumed from an older one's file) is null."""
    import pyarrow as pa

    for field in schema:
        if field.name not in table.column_names and field.nullable:
            table = table.append_column(field.name, pa.nulls(len(table), field.type))
    return table.select(schema.names).cast(schema)
