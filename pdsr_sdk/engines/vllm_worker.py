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
        from pdsr_sdk.engines.weights_check import ModelWeights, folder_tensors
        from pdsr_sdk.engines.weights_cuda import open_cuda_tensors
        from pdsr_sdk.engines.weights_shm import WeightEntry, read_block
        from pdsr_sdk.errors import PdsrError

        bucket = source.get("bucket")
        try:
            reference = self._pdsr_reference()
            if bucket is not None and source["kind"] != "folder":
                return self._pdsr_load_bucket(source, bucket, reference)
            if source["kind"] == "shared":
                entries = [WeightEntry.from_list(e) for e in source["entries"]]
                skip = reference.check(((e.name, e.shape) for e in entries), what="new weights")
                weights = read_block(source["path"], int(source["size"]), [e for e in entries if e.name not in skip])
            elif source["kind"] == "folder":
                given = ModelWeights.read(source["path"])
                skip = reference.check(((n, s) for n, (s, _) in given.shapes.items()),
                                       what=f"update_weights({source['path']})")
                weights = folder_tensors(source["path"], skip)
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
        try:
            self.pdsr_end_weights()      # a bucketed update left open (its session failed) is finished first
            self.reload_weights(weights_iterator=_tracked(weights, current), is_checkpoint_format=True)
            current[0] = None
            self._pdsr_reprocess_tied()
        except Exception as exc:  # noqa: BLE001 - reported as data
            return _load_error(current[0], exc)
        return None

    def _pdsr_load_bucket(self, source: dict[str, Any], bucket: dict[str, Any], reference) -> dict[str, Any] | None:
        """One bucket of an update sent in several (:mod:`pdsr_sdk.engines.weights_buckets`): vLLM's layer-wise
        reload (what ``reload_weights`` does in one call) is opened at bucket 0, fed each bucket with the model's
        ``load_weights``, and finished after the last. A layer is processed once all its tensors have come, so a
        layer split across buckets is whole (``reload_weights`` per bucket would process it half-loaded). Its
        tensors wait in vLLM's buffer until then: a bucket that is not the last is copied out of the block first
        (the session rewrites the block with the next bucket). A failure finishes the reload (the model stays
        usable, holding what was loaded) and comes back as data."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        from pdsr_sdk.engines.weights_cuda import open_cuda_tensors
        from pdsr_sdk.engines.weights_shm import WeightEntry, read_block
        from pdsr_sdk.errors import DataError, PdsrError

        index, last = int(bucket["index"]), bool(bucket["last"])
        if index == 0:
            self.pdsr_end_weights()
            self._pdsr_bucket_seen = set()
        elif getattr(self, "_pdsr_bucket_seen", None) is None or self._pdsr_bucket_next != index:
            self.pdsr_end_weights()
            return {"message": f"bucket {index} of new weights came without the buckets before it", "parameter": None}
        self._pdsr_bucket_next = index + 1
        what = f"new weights (bucket {index})"
        current: list[str | None] = [None]
        try:
            if source["kind"] == "shared":
                entries = [WeightEntry.from_list(e) for e in source["entries"]]
                pairs = ((e.name, e.shape) for e in entries)
            elif source["kind"] == "cuda_ipc" and source["device_uuid"] == self.pdsr_device_uuid():
                entries = None
                pairs = zip(source["names"], (tuple(s) for s in source["shapes"]))
            else:
                raise DataError(f"a bucket of new weights must come in a shared block or by CUDA IPC on this "
                                f"engine's GPU; got {source.get('kind')!r}")
            skip = reference.check(pairs, what=what, seen=self._pdsr_bucket_seen, complete=last)
            if entries is not None:
                weights = read_block(source["path"], int(source["size"]), [e for e in entries if e.name not in skip])
            else:
                weights = ((n, t) for n, t in open_cuda_tensors(source, self._pdsr_device_index()) if n not in skip)
            if not last:
                device = getattr(self, "device", None)
                weights = ((n, t.to(device, copy=True) if device is not None else t.clone()) for n, t in weights)
            model = self.model_runner.get_model()
            with set_current_vllm_config(self.vllm_config):
                if index == 0:
                    initialize_layerwise_reload(model)
                model.load_weights(_tracked(weights, current))
            current[0] = None
        except PdsrError as exc:
            self.pdsr_end_weights()
            return {"message": str(exc), "parameter": None}
        except Exception as exc:  # noqa: BLE001 - reported as data
            self.pdsr_end_weights()
            return _load_error(current[0], exc)
        if last:
            try:
                self.pdsr_end_weights()
            except Exception as exc:  # noqa: BLE001 - reported as data
                return _load_error(None, exc)
        return None

    def pdsr_end_weights(self) -> None:
        """Finish a bucketed update left open (vLLM's layer-wise reload: each layer not processed yet is, a
        layer no bucket reached gets its old tensors back); nothing when none is open. Called after the last
        bucket, and by the session when an update stops part-way (the engine then holds a partial update)."""
        if getattr(self, "_pdsr_bucket_seen", None) is None:
            return
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        self._pdsr_bucket_seen = None
        runner = self.model_runner
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(runner.get_model(), self.vllm_config.model_config)
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):   # as reload_weights does
            if hasattr(runner, reset):
                getattr(runner, reset)()
        self._pdsr_reprocess_tied()

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


def _tracked(weights, current: list):
    """``weights`` as they go, the name of the one loading kept in ``current[0]`` (what an error names)."""
    for name, tensor in weights:
        current[0] = name
        yield name, tensor


def _load_error(parameter: str | None, exc: Exception) -> dict[str, Any]:
    return {"message": f"loading parameter {parameter!r} failed: {type(exc).__name__}: {exc}",
            "parameter": parameter, "traceback": traceback.format_exc()}
