"""The calls a session makes on a running :class:`~pdsr_sdk.engines.vllm_engine.VllmEngine` between steps:
new weights, pause and resume, sleep and wake-up, and ``collective_rpc`` on its workers."""

from __future__ import annotations

from pdsr_sdk.engines.model_engine import CPU_CANNOT_SLEEP
from pdsr_sdk.errors import EngineError, UnsupportedError


class VllmControl:
    """VllmEngine's control calls, a mixin of the same state machine (the engine's ``AsyncLLM``).

    Relies on ``name``, ``cpu``, ``_llm`` (the ``AsyncLLM``, None when not running), ``_dead``,
    ``exit_status()`` and ``_read_error()``; sets ``_gpu_uuid`` and ``_gpu_asked`` in :meth:`device_uuid`
    (VllmEngine's ``__init__`` starts them at None and False).
    """

    # -------------------------------------------------------------- weights
    async def update_weights(self, weights, *, reset_prefix_cache: bool = True, bucket=None) -> None:
        """Load new weights (a :class:`~pdsr_sdk.engines.weights.StagedWeights`, or what its ``local()``
        gives) into the engine process, then reset the prefix cache (its KV blocks were computed with
        the old weights; ``reset_prefix_cache=False`` keeps them: ``kv_on_update: keep``). Call it while no
        request runs (or while requests are frozen, keeping the cache). Raises an EngineError naming this engine.

        ``bucket`` (a :class:`~pdsr_sdk.engines.weights.WeightsBucket`; by default the staged weights' own): one
        bucket of an update sent in several; the engine's model is whole again after the last one
        (:meth:`end_weights` ends one stopped part-way)."""
        if self._dead or self._llm is None:
            raise EngineError(self.name, "update_weights: the engine is not running")
        try:
            if hasattr(weights, "local"):
                # tensors on a GPU go by CUDA IPC handle to an engine on that same GPU
                gpu = await self.device_uuid() if getattr(weights, "cuda_uuid", None) else None
                source = weights.local(gpu)
            else:
                source = weights
            message = source.message()
            bucket = bucket if bucket is not None else getattr(weights, "bucket", None)
            if bucket is not None:
                message["bucket"] = bucket.message()
            results = await self._llm.collective_rpc("pdsr_load_weights", kwargs={"source": message})
        except Exception as exc:  # noqa: BLE001 - the engine process failed or died
            raise EngineError(self.name, f"update_weights failed: {type(exc).__name__}: {exc}",
                              exit_status=self.exit_status(), remote_traceback=self._read_error()) from None
        for err in results or ():
            if err:
                raise EngineError(self.name, f"update_weights: {err['message']}",
                                  remote_traceback=err.get("traceback"))
        if reset_prefix_cache and not await self._llm.reset_prefix_cache():
            raise EngineError(self.name, "update_weights: the weights changed but the prefix cache could not be "
                                         "reset (requests were running); update weights between steps")

    async def end_weights(self) -> None:
        """Finish a bucketed update that stopped part-way (the engine keeps what it loaded: a partial update;
        the layers no bucket reached keep their old weights), so the engine process is consistent again.
        Nothing when none is open. Raises an EngineError naming this engine."""
        if self._dead or self._llm is None:
            raise EngineError(self.name, "end_weights: the engine is not running")
        try:
            await self._llm.collective_rpc("pdsr_end_weights")
        except Exception as exc:  # noqa: BLE001 - the engine process failed or died
            raise EngineError(self.name, f"ending a partial weight update failed: {type(exc).__name__}: {exc}",
                              exit_status=self.exit_status(), remote_traceback=self._read_error()) from None

    async def reset_prefix_cache(self) -> None:
        """Forget every cached KV block (what a weight update needs unless its KV is kept). Call it while no
        request runs. Raises an EngineError naming this engine."""
        if self._dead or self._llm is None:
            raise EngineError(self.name, "reset_prefix_cache: the engine is not running")
        if not await self._llm.reset_prefix_cache():
            raise EngineError(self.name, "reset_prefix_cache: requests were running; reset the prefix cache "
                                         "between steps")

    async def device_uuid(self) -> str | None:
        """The physical UUID of this engine's GPU (asked once), None on the CPU."""
        if not self._gpu_asked:
            if self._dead or self._llm is None:
                raise EngineError(self.name, "device_uuid: the engine is not running")
            uuids = await self._llm.collective_rpc("pdsr_device_uuid")
            self._gpu_uuid = uuids[0] if uuids and len(set(uuids)) == 1 else None
            self._gpu_asked = True
        return self._gpu_uuid

    # ------------------------------------------------------- pause and sleep
    async def pause_generation(self, mode: str = "keep", *, clear_cache: bool = True) -> None:
        """Freeze (``keep``), drain (``wait``) or abort (``abort``) the engine's requests and start no
        new ones until :meth:`resume_generation` (vLLM's ``pause_generation``). The KV cache is cleared:
        kept requests recompute their context at resume, with the weights loaded by then;
        ``clear_cache=False`` keeps it (``kv_on_update: keep``: they go on from it)."""
        if self._dead or self._llm is None:
            raise EngineError(self.name, "pause: the engine is not running")
        try:
            await self._llm.pause_generation(mode=mode, clear_cache=clear_cache)
        except Exception as exc:  # noqa: BLE001 - the engine process failed
            raise EngineError(self.name, f"pause ({mode}) failed: {type(exc).__name__}: {exc}",
                              exit_status=self.exit_status(), remote_traceback=self._read_error()) from None

    async def resume_generation(self) -> None:
        """Go on after :meth:`pause_generation` (kept requests continue)."""
        if self._dead or self._llm is None:
            return
        try:
            await self._llm.resume_generation()
        except Exception as exc:  # noqa: BLE001 - the engine process failed
            raise EngineError(self.name, f"resume failed: {type(exc).__name__}: {exc}",
                              exit_status=self.exit_status(), remote_traceback=self._read_error()) from None

    def sleep_unsupported(self) -> str | None:
        """Why :meth:`sleep` cannot free this engine's memory, or None if it can."""
        if self._llm is None or self._dead:
            return "the engine is not running"
        if self.cpu:
            return CPU_CANNOT_SLEEP
        model_config = getattr(getattr(self._llm, "vllm_config", None), "model_config", None)
        if not getattr(model_config, "enable_sleep_mode", False):
            return ("started without sleep mode; set `engine_args: {enable_sleep_mode: true}` in its engine spec "
                    "(vLLM reserves memory for it at start-up)")
        return None

    async def sleep(self, level: int = 1) -> None:
        """Free the engine's memory (vLLM sleep mode): level 1 offloads the weights to host memory and drops
        the KV cache, level 2 drops the weights too (load weights again after :meth:`wake_up`). Only with no
        request running. Raises :class:`~pdsr_sdk.errors.UnsupportedError` where the engine cannot."""
        reason = self.sleep_unsupported()
        if reason is not None:
            raise UnsupportedError(f"engine {self.name!r} cannot sleep: {reason}")
        try:
            await self._llm.sleep(level)
        except Exception as exc:  # noqa: BLE001 - the engine process failed
            raise EngineError(self.name, f"sleep({level}) failed: {type(exc).__name__}: {exc}",
                              exit_status=self.exit_status(), remote_traceback=self._read_error()) from None

    async def wake_up(self) -> None:
        """Restore what :meth:`sleep` freed (and let requests run again)."""
        if self._dead or self._llm is None:
            raise EngineError(self.name, "wake_up: the engine is not running")
        try:
            await self._llm.wake_up()
        except Exception as exc:  # noqa: BLE001 - the engine process failed
            raise EngineError(self.name, f"wake_up failed: {type(exc).__name__}: {exc}",
                              exit_status=self.exit_status(), remote_traceback=self._read_error()) from None

    async def collective_rpc(self, method: str, **kwargs):
        """``AsyncLLM.collective_rpc`` on this engine's workers (one result per worker)."""
        if self._llm is None:
            raise EngineError(self.name, "engine is not running")
        return await self._llm.collective_rpc(method, kwargs=kwargs)
