"""Rollout orchestration: P-DSR dispatch policies over engine pools.

- :class:`RolloutSession`: engines + policy, one training step after another (for trainers; docs/sdk.md).
- :func:`run_rollout`: the ``pdsr rollout`` job (data in, trajectories Parquet out).
- :func:`trainer_batch`: a step's samples as a trainer's padded tensors (verl's rollout batch).

The scheduler, clocks and types they run on are in :mod:`pdsr_sdk.dispatch`.
"""

from __future__ import annotations

from pdsr_sdk.lazy import lazy_attributes as _lazy_attributes

_LAZY = {
    "RolloutConfig": "pdsr_sdk.rollout.config",
    "RolloutSession": "pdsr_sdk.rollout.session",
    "StepResult": "pdsr_sdk.rollout.results",
    "TrainerBatch": "pdsr_sdk.rollout.padded",
    "run_rollout": "pdsr_sdk.rollout.run",
    "run_rollout_async": "pdsr_sdk.rollout.run",
    "trainer_batch": "pdsr_sdk.rollout.padded",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY)
