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
    """Instantiate the engine described by ``spec`` (an EngineSpec) with its backend."""
    return ENGINE_BACKENDS.get(spec.backend).from_spec(spec, **context)
