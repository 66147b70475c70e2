"""What pdsr adds to vLLM's workers (``worker_extension_cls``): loading new weights in place, and handing the
model runner to pdsr's speculative proposer (:mod:`pdsr_sdk.engines.group_drafter`).

vLLM mixes this class into its worker class inside the engine process; the orchestrator calls
its methods with ``AsyncLLM.collective_rpc("pdsr_...")`` (method names, plain-data arguments, so
no pickled code crosses). Loading goes through the worker's own ``reload_weights``
(vLLM's layer-wise in-place reload), which re-runs each layer's weight processing: on the CPU
build linear weights are repacked for oneDNN / the packed-GEMM kernels after loading, so
copying into the parameters alone would leave the packed copies stale.

Methods never raise: an error comes back as data (``{"message": ..., "parameter": ...}``) and
the orchestrator reports it with the engine's name. Names and shapes are checked against the
engine's model folder before the first parameter changes, so a bad update leaves the weights
as they were.
"""

from __future__ import annotations

import traceback
from typing import Any


class PdsrWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); one instance per worker."""

    def pdsr_load_weights(self, source: dict[str, Any]) -> dict[str, Any] | None:
        """Load new weights from ``source`` (see :mod:`pdsr_sdk.engines.weights`): a shared block
        (``{"kind": "shared", "path", "size", "entries"}``), a model folder
        (``{"kind": "folder", "path"}``) or CUDA IPC handles of tensors on this worker's GPU
        (``{"kind": "cuda_ipc", "device_uuid", "names", "shapes", "handles"}``). Returns None, or the
        error as data."""
        from pdsr_sdk.engines.weights_check import ModelWeights
        from pdsr_sdk.engines.weights_cuda import open_cuda_tensors
        from pdsr_sdk.engines.weights_shm import WeightEntry, read_block
        from pdsr_sdk.errors import PdsrError

        try:
            reference = self._pdsr_reference()
            if source["kind"] == "shared":
                entries = [WeightEntry.from_list(e) for e in source["entries"]]
                skip = reference.check(((e.name, e.shape) for e in entries), what="new weights")
                weights = read_block(source["path"], int(source["size"]), [e for e in entries if e.name not in skip])
            elif source["kind"] == "folder":
                given = ModelWeights.read(source["path"])
                skip = reference.check(((n, s) for n, (s, _) in given.shapes.items()), what=f"update_weights({source['path']})")
                weights = _read_folder(source["path"], skip)
            elif source["kind"] == "cuda_ipc":
                here = self.pdsr_device_uuid()
                if source["device_uuid"] != here:
                    return {"message": f"the new weights are on GPU {source['device_uuid']}, shared by CUDA IPC, but "
                                       f"this engine runs on {'GPU ' + here if here else 'the CPU'}",
                            "parameter": None}
                skip = reference.check(zip(source["names"], (tuple(s) for s in source["shapes"])),
                                       what="new weights")
                weights = ((n, t) for n, t in open_cuda_tensors(source, self._pdsr_device_index()) if n not in skip)
            else:
                return {"message": f"unknown weights source {source.get('kind')!r}", "parameter": None}
        except PdsrError as exc:
            return {"message": str(exc), "parameter": None}
        except Exception as exc:  # noqa: BLE001 - reported as data
            return {"message": f"{type(exc).__name__}: {exc}", "parameter": None,
                    "traceback": traceback.format_exc()}

        current: list[str | None] = [None]

        def tracked():
            for name, tensor in weights:
                current[0] = name
                yield name, tensor

        try:
            self.reload_weights(weights_iterator=tracked(), is_checkpoint_format=True)
            current[0] = None
            self._pdsr_reprocess_tied()
        except Exception as exc:  # noqa: BLE001 - reported as data
            return {"message": f"loading parameter {current[0]!r} failed: {type(exc).__name__}: {exc}",
                    "parameter": current[0], "traceback": traceback.format_exc()}
        return None

    def _pdsr_reprocess_tied(self) -> None:
        """Re-run weight processing of layers that share their weight with another (a tied LM head).

        The in-place reload loads the embedding and skips the tied head (no checkpoint tensor of
        its own), so the head's processed copy (on the CPU build, the packed GEMM weight made from
        the shared tensor) would stay that of the old weights."""
        model = self.model_runner.get_model()
        owners: dict[int, list] = {}
        for module in model.modules():
            weight = module.__dict__.get("_parameters", {}).get("weight")
            if weight is not None and getattr(module, "quant_method", None) is not None:
                owners.setdefault(id(weight), []).append(module)
        for modules in owners.values():
            if len(modules) > 1:
                for module in modules:
                    module.quant_method.process_weights_after_loading(module)

    def pdsr_attach_drafter(self) -> bool:
        """Hand the model runner to pdsr's speculative proposer (``group``: it needs the request ids of the
        batch's rows, which vLLM's ``propose`` call does not pass; see group_drafter.py). True if there is one."""
        drafter = getattr(getattr(self, "model_runner", None), "drafter", None)
        if not hasattr(drafter, "attach"):
            return False
        drafter.attach(self.model_runner)
        return True

    def pdsr_device_uuid(self) -> str | None:
        """The physical UUID of this worker's GPU (what CUDA IPC weights must sit on), None on the CPU."""
        from pdsr_sdk.engines.weights_cuda import cuda_device_uuid

        device = getattr(self, "device", None)
        return cuda_device_uuid(device) if device is not None else None

    def _pdsr_device_index(self) -> int:
        import torch

        device = getattr(self, "device", None)
        index = getattr(device, "index", None)
        return int(index) if index is not None else torch.cuda.current_device()

    def pdsr_weight_checksum(self) -> float:
        """Sum of every parameter (as float64): a cheap fingerprint for tests."""
        import torch

        model = self.model_runner.get_model()
        with torch.no_grad():
            return float(sum(p.detach().double().sum().item() for p in model.parameters()))

    def _pdsr_reference(self):
        from pdsr_sdk.engines.weights_check import ModelWeights

        ref = getattr(self, "_pdsr_reference_weights", None)
        if ref is None:
            ref = ModelWeights.read(self.vllm_config.model_config.model)
            self._pdsr_reference_weights = ref
        return ref


def _read_folder(folder: str, skip: set[str]):
    from pathlib import Path

    from safetensors import safe_open

    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if name not in skip:
                    yield name, f.get_tensor(name)
