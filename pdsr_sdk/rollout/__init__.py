"""Rollout orchestration: P-DSR dispatch policies over engine pools.

- :class:`RolloutSession`: engines + policy, one batch after another (for trainers).
- :func:`run_rollout`: the ``pdsr rollout`` job (data in, trajectories Parquet out).
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "RolloutConfig": "pdsr_sdk.rollout.config",
    "RolloutSession": "pdsr_sdk.rollout.session",
    "run_rollout": "pdsr_sdk.rollout.run",
    "run_rollout_async": "pdsr_sdk.rollout.run",
    "Scheduler": "pdsr_sdk.rollout.scheduler",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name not in _LAZY:
        raise AttributeError(f"module 'pdsr_sdk.rollout' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
