"""The Ray side of a Ray engine: an async actor hosting a :class:`VllmEngine`.

The actor runs vLLM's ``AsyncLLM`` in its own event loop (through the local
engine class, so streaming, abort, load stats and engine-core error capture
behave exactly as on one machine) and keeps what the engine reports until the
orchestrator polls for it:

- ``commands(cmds)`` applies submits and aborts in the order they were issued;
- ``poll(max_wait_s)`` waits until something happened, then returns every
  request's new tokens since the last poll, the requests that ended, the
  engine's death (if it died) and a load snapshot.

Ray imports this module by name in the actor's worker process, so it must not
import ray, torch or vllm at the top.
"""

from __future__ import annotations

import asyncio
import os
import socket
import traceback
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WireSampling:
    """The sampling settings a request carries across the wire (what VllmEngine reads)."""

    temperature: float
    top_p: float
    top_k: int
    stop: tuple[str, ...]


def request_payload(request) -> tuple:
    """A SegmentRequest as a small picklable tuple (the Sample object stays behind)."""
    s = request.sampling
    return (request.request_id, list(request.context_ids), request.context_len, request.max_tokens,
            request.ignore_eos, WireSampling(s.temperature, s.top_p, s.top_k, tuple(s.stop)))


def error_info(exc: BaseException) -> dict[str, Any]:
    """An exception as plain data (EngineError's constructor does not survive pickling)."""
    from pdsr_sdk.errors import EngineError

    if isinstance(exc, EngineError):
        text = str(exc).split("\n--- engine traceback ---\n")[0]
        prefix = f"engine {exc.engine!r}: "
        message = text[len(prefix):] if text.startswith(prefix) else text
        if exc.exit_status is not None:
            message = message.removesuffix(f" (exit status {exc.exit_status})")
        return {"message": message, "exit_status": exc.exit_status, "remote_traceback": exc.remote_traceback}
    return {"message": f"{type(exc).__name__}: {exc}", "exit_status": None,
            "remote_traceback": "".join(traceback.format_exception(exc)).strip()}


class EngineActor:
    """Wrapped with ``ray.remote`` by :class:`pdsr_sdk.engines.ray_engine.RayEngine`; one per engine."""

    def __init__(self, spec, model: str, tokenizer: str | None, seed: int, logprobs_mode: str):
        from pdsr_sdk.engines.vllm_env import apply_cpu_defaults, is_cpu_build

        self.cpu = is_cpu_build()
        if self.cpu:
            apply_cpu_defaults()   # before anything in this process imports vllm
        elif spec.devices:
            spec = spec.model_copy(update={"devices": []})   # Ray set CUDA_VISIBLE_DEVICES for this actor
        from pdsr_sdk.engines.vllm_engine import VllmEngine

        self.engine = VllmEngine(spec, model=model, tokenizer=tokenizer, seed=seed, logprobs_mode=logprobs_mode,
                                 cpu=self.cpu)
        self.engine.bind(self)
        # request id -> (token ids, logprobs) generated since the last poll, in order of first arrival
        self._tokens: dict[str, tuple[list[int], list[float]]] = {}
        self._ends: list[tuple[str, str]] = []
        self._dead: dict[str, Any] | None = None
        self._dead_sent = False
        self._wakeup: asyncio.Event | None = None

    # ------------------------------------------------------------ called via Ray
    async def node_info(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname(),
                "pid": os.getpid(), "actor_id": ctx.get_actor_id(), "cpu_build": self.cpu,
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    async def start(self) -> dict[str, Any] | None:
        """Load the model; returns None, or the error as plain data."""
        self._wakeup = asyncio.Event()
        try:
            await self.engine.start()
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator as data
            return error_info(exc)
        return None

    async def commands(self, cmds: list[tuple[str, Any]]) -> None:
        """Apply ``("submit", payload)`` / ``("abort", request_id)`` in order; never raises."""
        from pdsr_sdk.dispatch.types import SegmentRequest

        for kind, arg in cmds:
            try:
                if kind == "submit":
                    rid, ids, ctx_len, max_tokens, ignore_eos, sampling = arg
                    self.engine.submit(SegmentRequest(request_id=rid, context_ids=ids, context_len=ctx_len,
                                                      max_tokens=max_tokens, ignore_eos=ignore_eos,
                                                      sampling=sampling, sample=None))
                elif kind == "abort":
                    self.engine.abort(arg)
                else:
                    raise ValueError(f"unknown command {kind!r}")
            except Exception as exc:  # noqa: BLE001 - the engine can no longer serve
                self.on_engine_dead(self.engine, exc)

    async def poll(self, max_wait_s: float) -> tuple[list, list, dict | None, tuple]:
        """Wait up to ``max_wait_s`` for news, then hand over everything queued since the last poll."""
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        if not self._has_news():
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), max_wait_s)
            except asyncio.TimeoutError:
                pass
        tokens = [(rid, ids, lps or None) for rid, (ids, lps) in self._tokens.items()]
        ends, self._tokens, self._ends = self._ends, {}, []
        dead = None
        if self._dead is not None and not self._dead_sent:
            dead, self._dead_sent = self._dead, True
        load = self.engine.load()
        return tokens, ends, dead, (load.running, load.waiting, load.kv_cache_usage)

    async def close(self) -> None:
        await self.engine.close()

    # ------------------------------------------------- EngineListener (inside)
    def on_tokens(self, engine, request_id: str, n: int, token_ids, logprobs) -> None:
        ids, lps = self._tokens.setdefault(request_id, ([], []))
        ids.extend(token_ids)
        if logprobs is not None:
            lps.extend(logprobs)
        self._wake()

    def on_segment_end(self, engine, request_id: str, finish_reason: str) -> None:
        self._ends.append((request_id, finish_reason))
        self._wake()

    def on_engine_dead(self, engine, error: BaseException) -> None:
        if self._dead is None:
            self._dead = error_info(error)
        self._wake()

    def _has_news(self) -> bool:
        return bool(self._tokens or self._ends or (self._dead is not None and not self._dead_sent))

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
