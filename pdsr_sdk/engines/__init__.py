"""Engines: where generation runs (vLLM processes, Ray actors, the simulator).

Backends are found by name in :data:`ENGINE_BACKENDS`; each is a class with
``from_spec(spec, **context)`` returning an object that implements
:class:`pdsr_sdk.dispatch.protocols.Engine`.
"""

from __future__ import annotations

from typing import Any as _Any

from pdsr_sdk.registry import Registry as _Registry

__all__ = ["ENGINE_BACKENDS", "build_engine"]

ENGINE_BACKENDS: _Registry[type] = _Registry("engine backend")
ENGINE_BACKENDS.register("vllm", "pdsr_sdk.engines.vllm_engine:VllmEngine")
ENGINE_BACKENDS.register("ray", "pdsr_sdk.engines.ray_engine:RayEngine")
ENGINE_BACKENDS.register("sim", "pdsr_sdk.sim.engine:SimEngine")


def build_engine(spec, **context: _Any):
    """Instantiate the engine described by ``spec`` (an EngineSpec) with its backend. A backend without
    ``from_spec``, or one whose ``from_spec`` returns no :class:`~pdsr_sdk.dispatch.protocols.Engine`, is a
    ConfigError naming the engine and the backend (the run would otherwise fail deep inside, or at its first
    request)."""
    from pdsr_sdk.dispatch.protocols import Engine
    from pdsr_sdk.errors import ConfigError

    backend = ENGINE_BACKENDS.get(spec.backend)
    where = f"engine {spec.name!r}: backend {spec.backend!r}"
    if not callable(getattr(backend, "from_spec", None)):
        raise ConfigError(f"{where} has no from_spec(spec, **context); an engine backend is a class whose "
                          f"from_spec returns an Engine (pdsr_sdk.dispatch.protocols.Engine)")
    engine = backend.from_spec(spec, **context)
    if not isinstance(engine, Engine):
        members = ("name", "pool", "max_concurrency", "segment_capacity_tokens", "kv_cache_tokens", "start", "bind",
                   "submit", "abort", "load", "close")
        missing = [m for m in members if not hasattr(engine, m)]
        raise ConfigError(f"{where}: from_spec returned {type(engine).__name__}, which lacks {', '.join(missing)} "
                          f"of the Engine protocol (pdsr_sdk.dispatch.protocols.Engine)")
    return engine
