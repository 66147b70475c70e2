"""The dispatch layer: what engines, policies, the simulator and the rollout are built on.

- :mod:`~pdsr_sdk.dispatch.types`: samples, groups, segment records and requests.
- :mod:`~pdsr_sdk.dispatch.protocols`: the seams (Clock, Engine, Dispatcher, DispatchContext).
- :mod:`~pdsr_sdk.dispatch.clock`: wall clock on an asyncio loop, virtual clock for simulation.
- :mod:`~pdsr_sdk.dispatch.scheduler`: queues, engine slots, segments, the policy's commands.
- :mod:`~pdsr_sdk.dispatch.policy`: the policy base class (also ``pdsr_sdk.policies.base.Policy``).
- :mod:`~pdsr_sdk.dispatch.run`: one run (scheduler + policy + engines + clock) and its batch reports.
- :mod:`~pdsr_sdk.dispatch.config`, :mod:`~pdsr_sdk.dispatch.segments`, :mod:`~pdsr_sdk.dispatch.trajectory`:
  sampling/segment settings, the segment length formula, the trajectories table.

Nothing here imports engines, policies, the simulator or the rollout (``tests/test_layers.py``).
"""

from __future__ import annotations

from pdsr_sdk.lazy import lazy_attributes as _lazy_attributes

_LAZY = {
    "BatchReport": "pdsr_sdk.dispatch.run",
    "DispatchRun": "pdsr_sdk.dispatch.run",
    "STAT_KEYS": "pdsr_sdk.dispatch.run",
    "Policy": "pdsr_sdk.dispatch.policy",
    "Scheduler": "pdsr_sdk.dispatch.scheduler",
    "LoopClock": "pdsr_sdk.dispatch.clock",
    "VirtualClock": "pdsr_sdk.dispatch.clock",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY)
