"""Tensors packed once into a shared-memory block of this machine (a file in ``/dev/shm`` that every local
engine process maps) and read back as views: the block's table of entries, and writing and reading it."""

from __future__ import annotations

import mmap
import os
import tempfile
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator


@dataclass(frozen=True)
class WeightEntry:
    """One tensor in a shared block: its name, dtype (``torch`` name, e.g. ``bfloat16``), shape, and
    where its bytes are."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def as_list(self) -> list:
        return [self.name, self.dtype, list(self.shape), self.offset, self.nbytes]

    @classmethod
    def from_list(cls, item: list) -> "WeightEntry":
        name, dtype, shape, offset, nbytes = item
        return cls(str(name), str(dtype), tuple(int(s) for s in shape), int(offset), int(nbytes))


@dataclass(frozen=True)
class SharedWeights:
    """Tensors packed in one shared-memory file of this machine (what crosses to a local engine)."""

    path: str
    size: int
    entries: tuple[WeightEntry, ...]

    def message(self) -> dict[str, Any]:
        """The plain-data form sent to the engine process (msgpack-able)."""
        return {"kind": "shared", "path": self.path, "size": self.size,
                "entries": [e.as_list() for e in self.entries]}


def shm_dir() -> str:
    """Where shared blocks live: ``$PDSR_SHM_DIR``, else ``/dev/shm`` (RAM), else the temp folder."""
    root = os.environ.get("PDSR_SHM_DIR")
    if root:
        return root
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def new_block_path(prefix: str = "pdsr-weights") -> str:
    return os.path.join(shm_dir(), f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:12]}")


def pack_layout(items: list[tuple[str, Any]]) -> tuple[list[WeightEntry], int]:
    """Entries (64-byte aligned offsets) for ``(name, tensor)`` pairs and the block size."""
    entries, offset = [], 0
    for name, t in items:
        nbytes = t.numel() * t.element_size()
        entries.append(WeightEntry(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
        offset += -(-nbytes // 64) * 64
    return entries, max(offset, 64)


def map_block(path: str, size: int, *, populate: bool = False):
    """The block at ``path`` as a flat shared ``uint8`` tensor (created at ``size`` bytes if missing).

    ``populate``: map an existing block with every page at once (``MAP_POPULATE``, one call into the
    kernel instead of a page fault per 4 KiB page on first touch): what a reader of the whole block wants."""
    import torch

    if populate and hasattr(mmap, "MAP_POPULATE"):
        with open(path, "r+b") as f:
            mapped = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        return torch.frombuffer(mapped, dtype=torch.uint8)
    return torch.from_file(path, shared=True, size=size, dtype=torch.uint8)


def write_block(items: list[tuple[str, Any]], path: str | None = None, *, min_size: int = 0) -> SharedWeights:
    """Copy ``(name, tensor)`` pairs once into a shared block: a new one, or the block at ``path``
    (rewritten in place when its size fits: its pages exist already, which makes the write several
    times faster than into fresh pages); returns its description. ``min_size``: the block is at least
    this big (the buckets of an update share one block of the bucket size)."""
    import torch

    entries, size = pack_layout(items)
    size = max(size, -(-min_size // 64) * 64)
    if path is not None and os.path.exists(path) and os.path.getsize(path) != size:
        os.unlink(path)           # another layout: a fresh block under the same name
    path = path or new_block_path()
    try:
        block = map_block(path, size)
        with torch.no_grad():
            for (_, t), e in zip(items, entries):
                if e.nbytes:
                    src = t.detach()
                    if src.device.type != "cpu":
                        src = src.cpu()
                    view = block[e.offset:e.offset + e.nbytes].view(src.dtype).view(src.shape)
                    view.copy_(src)
        del block
    except BaseException:
        Path(path).unlink(missing_ok=True)
        raise
    return SharedWeights(path, size, tuple(entries))


def write_buffer(buffer, entries: Iterable[WeightEntry], path: str | None = None) -> SharedWeights:
    """A packed byte buffer (e.g. a numpy array from Ray's object store) as a shared block here."""
    import numpy as np
    import torch

    entries = tuple(entries)
    data = np.frombuffer(buffer, dtype=np.uint8)
    path = path or new_block_path()
    try:
        block = map_block(path, max(int(data.nbytes), 64))
        with warnings.catch_warnings():   # a read-only source (Ray's object store) is only read here
            warnings.simplefilter("ignore", UserWarning)
            source = torch.from_numpy(data)
        block[:data.nbytes].copy_(source)
        del block
    except BaseException:
        Path(path).unlink(missing_ok=True)
        raise
    return SharedWeights(path, max(int(data.nbytes), 64), entries)


def read_block(path: str, size: int, entries: Iterable[WeightEntry]) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` views into a shared block (no copy)."""
    import torch

    block = map_block(path, size, populate=True)
    for e in entries:
        dtype = getattr(torch, e.dtype)
        yield e.name, block[e.offset:e.offset + e.nbytes].view(dtype).view(e.shape)

