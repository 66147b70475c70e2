"""A temporary file of Arrow arrays, written once and read back any number of times: the columns a JSONL file's
lines became while :func:`~pdsr_sdk.io.json_stream.plan_jsonl` read it for its types, so that reading its batches
afterwards parses no JSON.

Each array is an Arrow IPC stream of its own, zstd-compressed (token ids take a third of their JSONL text), at an
offset its :class:`Segment` keeps, so a batch reads only the columns it wants. The file lies in the temporary
folder (``TMPDIR``), without a name where the system allows (a killed process leaves nothing), and is closed with
the :class:`Spill`.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from dataclasses import dataclass

import pyarrow as pa

from pdsr_sdk.errors import DataError

_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


@dataclass(frozen=True)
class Segment:
    """Where one array lies in the spill, and its type."""

    offset: int
    length: int
    type: pa.DataType


class Spill:
    """Arrays written to a temporary file; ``where`` names the input in errors (a full disk)."""

    def __init__(self, where: str):
        self.where = where
        try:
            self._file = tempfile.TemporaryFile(prefix="pdsr-", suffix=".arrows")
        except OSError as exc:
            raise self._error(exc) from None
        self._size = 0
        self._unflushed = False
        weakref.finalize(self, self._file.close)

    def write(self, array: pa.Array) -> Segment:
        sink = pa.BufferOutputStream()
        batch = pa.record_batch([array], names=["values"])
        with pa.ipc.new_stream(sink, batch.schema, options=_OPTIONS) as writer:
            writer.write_batch(batch)
        data = sink.getvalue()
        try:
            self._file.write(data)
        except OSError as exc:
            raise self._error(exc) from None
        segment = Segment(self._size, data.size, array.type)
        self._size += data.size
        self._unflushed = True
        return segment

    def read(self, segment: Segment) -> pa.Array:
        if self._unflushed:
            self._file.flush()
            self._unflushed = False
        data = os.pread(self._file.fileno(), segment.length, segment.offset)   # no shared file position
        return pa.ipc.open_stream(data).read_next_batch().column(0)

    @property
    def size(self) -> int:
        """Bytes written."""
        return self._size

    def _error(self, exc: OSError) -> DataError:
        return DataError(f"{self.where}: cannot write the temporary copy of its rows in {tempfile.gettempdir()} "
                         f"({exc.strerror or exc}); set TMPDIR to a folder with room for about a third of the "
                         f"file's size")
