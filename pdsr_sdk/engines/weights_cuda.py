"""Tensors on a CUDA device shared by CUDA IPC handle with an engine on the same physical GPU (a colocated
trainer's): the handles sent, and the engine side that opens them without a copy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping


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

