"""New policy weights on their way into the engines (``RolloutSession.update_weights``).

A trainer hands over a state dict, an iterator of ``(name, tensor)`` or a model folder. The
session stages it once (:func:`stage_weights`):

- tensors are written once into one shared-memory block (a file in ``/dev/shm`` mapped with
  ``torch.from_file(..., shared=True)``); each local engine process maps the same block and reads
  its tensors from it, so nothing is pickled or sent through a socket; only the table of
  ``(name, dtype, shape, offset)`` entries travels with the call
  (:class:`~pdsr_sdk.engines.weights_shm.SharedWeights`);
- Ray engines get the block through Ray's object store (one ``ray.put`` per update, shared by
  every actor); an actor copies it into a block of its own node and loads from there;
- a model folder is read by each engine process itself (its ``*.safetensors`` files);
- on GPUs, when every tensor sits on one CUDA device and an engine runs on that same physical
  device (a colocated trainer), the engine opens the trainer's tensors by CUDA IPC handle
  (:class:`~pdsr_sdk.engines.weights_cuda.CudaIpcWeights`) instead: no copy through host
  memory. Engines on other devices take the shared block.

Names and shapes are checked against the engine's model folder (its safetensors headers,
:mod:`pdsr_sdk.engines.weights_check`) before anything is copied, and again inside the engine
process before any parameter changes: a bad update names the parameter and leaves the engine's
weights as they were. An update bigger than the session's bucket goes in buckets, each staged like a whole
update (:mod:`pdsr_sdk.engines.weights_buckets`, which says what is checked when for an iterator).

The engine side is :mod:`pdsr_sdk.engines.vllm_worker`. No heavy import at module level.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from pdsr_sdk.engines.weights_check import ModelWeights, check_finite, folder_tensors
from pdsr_sdk.engines.weights_cuda import CudaIpcWeights, cuda_device_uuid, share_cuda_tensors
from pdsr_sdk.engines.weights_shm import SharedWeights, map_block, new_block_path, write_block
from pdsr_sdk.errors import DataError, DataValueError


@dataclass(frozen=True)
class FolderWeights:
    """A Hugging Face model folder each engine reads itself."""

    path: str

    def message(self) -> dict[str, Any]:
        return {"kind": "folder", "path": self.path}


@dataclass(frozen=True)
class WeightsBucket:
    """Where one bucket sits in an update sent in several (:mod:`pdsr_sdk.engines.weights_buckets`): ``index``
    (0 first) and whether it is the ``last``. An engine opens vLLM's layer-wise reload at bucket 0 and finishes
    it after the last."""

    index: int
    last: bool

    def message(self) -> dict[str, Any]:
        return {"index": self.index, "last": self.last}


class StagedWeights:
    """One update's weights, staged once for every engine (see the module docstring).

    Engines ask for the form they need: :meth:`local` (local engine processes: the shared block, the
    folder, or CUDA IPC handles for an engine on the tensors' GPU), :meth:`ray_ref` (Ray actors).
    :meth:`close` frees the shared block and releases the IPC-shared tensors.
    """

    def __init__(self, *, items: list[tuple[str, Any]] | None = None, folder: str | None = None,
                 block: "WeightsBlock | None" = None, bucket: WeightsBucket | None = None, min_size: int = 0):
        self.items = items
        self.folder = folder
        self.block = block         # a block kept across updates (its owner frees it), else a block of its own
        self.bucket = bucket       # one bucket of an update sent in several (weights_buckets), else None: all of it
        self.min_size = min_size   # the block's least size (a bucketed update's blocks all have the bucket size)
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

    @property
    def last(self) -> bool:
        """Whether the update is whole once this is loaded (the last bucket, or not bucketed)."""
        return self.bucket is None or self.bucket.last

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
            self._shared = write_block(self.items or [], self.block.path if self.block is not None else None,
                                       min_size=self.min_size)
            if self.block is None:   # a block of its own goes with this object even if close() is never called
                self._finalizer = weakref.finalize(self, _unlink, self._shared.path)
        return self._shared

    def again(self) -> "StagedWeights":
        """The same part, to load again later (a staggered update's engines that load after the others): a whole
        update from its kept block, written now if no engine has read it yet; a bucket from a block of its own,
        written now (the next bucket rewrites the kept one); a folder from the folder. Not CUDA IPC: the trainer's
        tensors may change before then. Call it before :meth:`close`."""
        if self.folder is not None:
            return StagedWeights(folder=self.folder)
        if self.bucket is not None:
            if self.items is None:
                raise ValueError("again: this bucket was closed; copy it before its engines load it")
            copy = StagedWeights(items=self.items, bucket=self.bucket)
            copy.shared()
            copy.items = None   # the bytes are in its block: the trainer's tensors are not held
            return copy
        if self.block is None:
            raise ValueError("again: a whole update is loaded again from the block a session keeps")
        copy = StagedWeights(block=self.block)
        copy._shared = self.shared()
        return copy

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
        tied: dict[str, Any] = {}
        for name, tensor in folder_tensors(folder):   # one read of the files (the engines then read them cached)
            check_finite(name, tensor, what=f"update_weights({folder})")
            if reference is not None:
                reference.check_tied_head([(name, tensor)], what=f"update_weights({folder})", pending=tied)
        return StagedWeights(folder=str(folder.resolve()))
    items = list(checked_pairs(weights))
    if not items:
        raise DataValueError("update_weights: no tensors given")
    if reference is not None:
        items = check_items(items, reference, what="update_weights")
    return StagedWeights(items=items, block=block)


def checked_pairs(weights: Any) -> Iterator[tuple[str, Any]]:
    """The ``(name, tensor)`` pairs of a state dict or an iterable of pairs, taken one at a time (an iterator is
    never materialised here); a DataValueError naming the item that is not such a pair."""
    if isinstance(weights, Mapping):
        pairs: Iterable = weights.items()
    elif isinstance(weights, Iterable):
        pairs = weights
    else:
        raise DataError(f"update_weights: expected a state dict, an iterable of (name, tensor) pairs or a model "
                        f"folder, got {type(weights).__name__}")
    for i, pair in enumerate(pairs):
        try:
            name, tensor = pair
        except (TypeError, ValueError):
            raise DataValueError(f"update_weights: item {i} is not a (name, tensor) pair: "
                                 f"{type(pair).__name__}") from None
        if not isinstance(name, str) or not hasattr(tensor, "shape") or not hasattr(tensor, "element_size"):
            raise DataValueError(f"update_weights: item {i} ({name!r}) is not a (str, torch.Tensor) pair")
        yield name, tensor


def check_items(items: list[tuple[str, Any]], reference: ModelWeights, *, what: str,
                seen: set[str] | None = None, complete: bool = True,
                tied: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
    """``items`` checked against the engines' model (names, shapes, what the tensors hold, a tied head; with
    ``seen``, ``complete`` and ``tied``: one bucket of an update, see :meth:`ModelWeights.check` and
    :meth:`ModelWeights.check_tied_head`), less the names vLLM skips."""
    skip = reference.check(((n, tuple(t.shape)) for n, t in items), what=what, seen=seen, complete=complete)
    reference.check_tensors(items, what=what)
    reference.check_tied_head(items, what=what, pending=tied)
    return [(n, t) for n, t in items if n not in skip] if skip else items
