"""New policy weights on their way into the engines (``RolloutSession.update_weights``).

A trainer hands over a state dict, an iterator of ``(name, tensor)`` or a model folder. The
session stages it once (:func:`stage_weights`):

- tensors are written once into one shared-memory block (a file in ``/dev/shm`` mapped with
  ``torch.from_file(..., shared=True)``); each local engine process maps the same block and reads
  its tensors from it, so nothing is pickled or sent through a socket; only the table of
  ``(name, dtype, shape, offset)`` entries travels with the call (:class:`SharedWeights`);
- Ray engines get the block through Ray's object store (one ``ray.put`` per update, shared by
  every actor); an actor copies it into a block of its own node and loads from there;
- a model folder is read by each engine process itself (its ``*.safetensors`` files);
- on GPUs, when every tensor sits on one CUDA device and an engine runs on that same physical
  device (a colocated trainer), the engine opens the trainer's tensors by CUDA IPC handle
  (:class:`CudaIpcWeights`) instead: no copy through host memory. Engines on other devices take
  the shared block.

Names and shapes are checked against the engine's model folder (its safetensors headers) before
anything is copied, and again inside the engine process before any parameter changes: a bad
update names the parameter and leaves the engine's weights as they were.

The engine side is :mod:`pdsr_sdk.engines.vllm_worker`. No heavy import at module level.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import tempfile
import uuid
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from pdsr_sdk.errors import DataError, DataValueError

#: names a Hugging Face state dict may hold that vLLM's loaders skip
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


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


@dataclass(frozen=True)
class FolderWeights:
    """A Hugging Face model folder each engine reads itself."""

    path: str

    def message(self) -> dict[str, Any]:
        return {"kind": "folder", "path": self.path}


@dataclass(frozen=True)
class CudaIpcWeights:
    """Tensors on one CUDA device of this machine, shared by CUDA IPC handle (what crosses to a local
    engine on the same physical GPU). ``handles`` is the pickled list of
    ``torch.multiprocessing.reductions.reduce_tensor`` arguments, one per tensor, in ``names`` order;
    the engine rebuilds each on its own device index (the one it sees for that GPU)."""

    device_uuid: str
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    handles: bytes

    def message(self) -> dict[str, Any]:
        return {"kind": "cuda_ipc", "device_uuid": self.device_uuid, "names": list(self.names),
                "shapes": [list(s) for s in self.shapes], "handles": self.handles}


def cuda_device_uuid(device: Any) -> str | None:
    """The physical UUID of a CUDA device (stable across processes whatever their
    ``CUDA_VISIBLE_DEVICES``), or None for any other device."""
    if getattr(device, "type", None) != "cuda":
        return None
    import torch

    return str(torch.cuda.get_device_properties(device).uuid)


def share_cuda_tensors(items: list[tuple[str, Any]]) -> tuple[CudaIpcWeights, list[Any]]:
    """IPC handles for ``(name, tensor)`` pairs on one CUDA device, and the tensors the handles point
    into (contiguous copies where needed): the caller keeps them alive until every engine loaded."""
    import pickle

    from torch.multiprocessing.reductions import reduce_tensor

    uuid_ = cuda_device_uuid(items[0][1].device)
    keep, args = [], []
    for _, t in items:
        t = t.detach().contiguous()
        keep.append(t)
        args.append(reduce_tensor(t)[1])
    return CudaIpcWeights(str(uuid_), tuple(n for n, _ in items), tuple(tuple(t.shape) for _, t in items),
                          pickle.dumps(args)), keep


def open_cuda_tensors(message: Mapping[str, Any], device_index: int) -> Iterator[tuple[str, Any]]:
    """The engine side of :func:`share_cuda_tensors`: ``(name, tensor)`` views of the trainer's
    tensors, opened on this process's ``device_index`` (no copy)."""
    import pickle

    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    for name, args in zip(message["names"], pickle.loads(message["handles"])):
        args = list(args)
        args[6] = device_index          # the storage's device, as this process numbers it
        yield name, rebuild_cuda_tensor(*args)


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


def write_block(items: list[tuple[str, Any]], path: str | None = None) -> SharedWeights:
    """Copy ``(name, tensor)`` pairs once into a shared block: a new one, or the block at ``path``
    (rewritten in place when its size fits: its pages exist already, which makes the write several
    times faster than into fresh pages); returns its description."""
    import torch

    entries, size = pack_layout(items)
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


# ------------------------------------------------------------------ checks
@dataclass
class ModelWeights:
    """The parameters a model folder's checkpoint holds: name -> (shape, dtype), from the
    safetensors headers (no tensor is read)."""

    folder: str
    shapes: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    tied_embeddings: bool = False

    @classmethod
    def read(cls, folder: str | Path) -> "ModelWeights":
        folder = Path(folder)
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise DataError(f"{folder}: no *.safetensors files (update_weights reads safetensors checkpoints)")
        shapes: dict[str, tuple[tuple[int, ...], str]] = {}
        for f in files:
            for name, (shape, dtype) in safetensors_header(f).items():
                shapes[name] = (shape, dtype)
        tied = False
        cfg = folder / "config.json"
        if cfg.exists():
            try:
                conf = json.loads(cfg.read_text())
                tied = bool(conf.get("tie_word_embeddings", conf.get("text_config", {}).get("tie_word_embeddings", False)))
            except (OSError, ValueError):
                pass
        return cls(str(folder), shapes, tied)

    def check(self, items: Iterable[tuple[str, tuple[int, ...]]], *, what: str = "weights") -> set[str]:
        """Check ``(name, shape)`` pairs: every name known with its shape, every checkpoint tensor given.
        Returns the names to leave out (present in a trainer's state dict, skipped by vLLM: a tied
        ``lm_head.weight``, rotary ``inv_freq`` buffers). Raises a DataError naming the parameter."""
        skip: set[str] = set()
        seen: set[str] = set()
        for name, shape in items:
            ref = self.shapes.get(name)
            if ref is None:
                if name.endswith(_IGNORED_SUFFIXES) or (self.tied_embeddings and name == "lm_head.weight"):
                    skip.add(name)
                    continue
                close = _closest(name, self.shapes)
                hint = f" (did you mean {close!r}?)" if close else ""
                raise DataValueError(f"{what}: unknown parameter {name!r}: the model in {self.folder} has no such "
                                f"tensor{hint}")
            if tuple(shape) != tuple(ref[0]):
                raise DataValueError(f"{what}: parameter {name!r} has shape {list(shape)}; the model in {self.folder} "
                                f"expects {list(ref[0])}")
            if name in seen:
                raise DataValueError(f"{what}: parameter {name!r} is given twice")
            seen.add(name)
        missing = [n for n in self.shapes if n not in seen]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise DataValueError(f"{what}: {len(missing)} parameter(s) of the model in {self.folder} are missing: "
                            f"{', '.join(repr(m) for m in missing[:3])}{more} (update_weights takes every tensor "
                            f"of the model at once)")
        return skip


def safetensors_header(path: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of one safetensors file, from its JSON header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: (tuple(v["shape"]), v["dtype"]) for k, v in header.items() if k != "__metadata__"}


def _closest(name: str, known: Mapping[str, Any]) -> str | None:
    import difflib

    hits = difflib.get_close_matches(name, list(known), n=1, cutoff=0.8)
    return hits[0] if hits else None


# ----------------------------------------------------------------- staging
class StagedWeights:
    """One update's weights, staged once for every engine (see the module docstring).

    Engines ask for the form they need: :meth:`local` (local engine processes: the shared block, the
    folder, or CUDA IPC handles for an engine on the tensors' GPU), :meth:`ray_ref` (Ray actors).
    :meth:`close` frees the shared block and releases the IPC-shared tensors.
    """

    def __init__(self, *, items: list[tuple[str, Any]] | None = None, folder: str | None = None,
                 block: "WeightsBlock | None" = None):
        self.items = items
        self.folder = folder
        self.block = block         # a block kept across updates (its owner frees it), else a block of its own
        self._shared: SharedWeights | None = None
        self._finalizer: weakref.finalize | None = None
        self._ray_ref = None
        self._ipc: CudaIpcWeights | None = None
        self._ipc_keep: list[Any] = []
        devices = {t.device for _, t in items or ()}
        #: the physical UUID of the one CUDA device every tensor is on, else None
        self.cuda_uuid = cuda_device_uuid(next(iter(devices))) if len(devices) == 1 else None

    @property
    def is_folder(self) -> bool:
        return self.folder is not None

    def local(self, device_uuid: str | None = None) -> SharedWeights | FolderWeights | CudaIpcWeights:
        """What a local engine process loads from; ``device_uuid``: the engine's GPU, if it has one."""
        if self.folder is not None:
            return FolderWeights(self.folder)
        if device_uuid is not None and device_uuid == self.cuda_uuid:
            if self._ipc is None:
                self._ipc, self._ipc_keep = share_cuda_tensors(self.items or [])
            return self._ipc
        return self.shared()

    def shared(self) -> SharedWeights:
        if self._shared is None:
            self._shared = write_block(self.items or [], self.block.path if self.block is not None else None)
            if self.block is None:   # a block of its own goes with this object even if close() is never called
                self._finalizer = weakref.finalize(self, _unlink, self._shared.path)
        return self._shared

    def ray_ref(self, ray):
        """An object-store reference to the packed bytes (put once, shared by every actor)."""
        if self._ray_ref is None:
            block = self.shared()
            self._ray_ref = ray.put(map_block(block.path, block.size).numpy())
        return self._ray_ref

    def close(self) -> None:
        if self._shared is not None:
            if self._finalizer is not None:
                self._finalizer()
            self._shared = None
        self._ray_ref = None
        self.items = None
        if self._ipc is not None:
            import torch

            self._ipc, self._ipc_keep = None, []
            torch.cuda.ipc_collect()        # the engines have loaded: free the shared copies' IPC slots


def _unlink(path: str) -> None:
    Path(path).unlink(missing_ok=True)


class WeightsBlock:
    """One shared-memory block name kept across weight updates (a session holds one): each update
    rewrites it in place instead of allocating a model's worth of fresh pages. Costs the model's size
    in shared memory while it lives; :meth:`close` (or garbage collection) removes it."""

    def __init__(self) -> None:
        self.path = new_block_path()
        self._finalizer = weakref.finalize(self, _unlink, self.path)

    def close(self) -> None:
        self._finalizer()


def stage_weights(weights: Any, reference: ModelWeights | None = None, *,
                  block: WeightsBlock | None = None) -> StagedWeights:
    """Stage ``weights`` (a state dict, an iterable of ``(name, tensor)``, or a model folder) after
    checking it against ``reference`` (the engines' model). Nothing is copied yet; tensors will be
    written into ``block`` if given (kept across updates), else into a block of their own."""
    if isinstance(weights, (str, os.PathLike)):
        folder = Path(weights)
        if not folder.is_dir():
            raise DataError(f"update_weights: {folder} is not a model folder")
        got = ModelWeights.read(folder)
        if reference is not None:
            reference.check(((n, s) for n, (s, _) in got.shapes.items()), what=f"update_weights({folder})")
        return StagedWeights(folder=str(folder.resolve()))
    if isinstance(weights, Mapping):
        pairs: Iterable = weights.items()
    elif isinstance(weights, Iterable):
        pairs = weights
    else:
        raise DataError(f"update_weights: expected a state dict, an iterable of (name, tensor) pairs or a model "
                        f"folder, got {type(weights).__name__}")
    items: list[tuple[str, Any]] = []
    for i, pair in enumerate(pairs):
        try:
            name, tensor = pair
        except (TypeError, ValueError):
            raise DataValueError(f"update_weights: item {i} is not a (name, tensor) pair: {type(pair).__name__}") from None
        if not isinstance(name, str) or not hasattr(tensor, "shape") or not hasattr(tensor, "element_size"):
            raise DataValueError(f"update_weights: item {i} ({name!r}) is not a (str, torch.Tensor) pair")
        items.append((name, tensor))
    if not items:
        raise DataValueError("update_weights: no tensors given")
    if reference is not None:
        skip = reference.check(((n, tuple(t.shape)) for n, t in items), what="update_weights")
        if skip:
            items = [(n, t) for n, t in items if n not in skip]
    return StagedWeights(items=items, block=block)
