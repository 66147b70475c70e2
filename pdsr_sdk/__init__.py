"""pdsr SDK: the fast rollout side of LLM reinforcement learning.

Importing this package is cheap: the public functions below are loaded on
first use, and heavy dependencies (torch, vllm, numba, ray) are imported only
inside the backends that need them.
"""

from __future__ import annotations

import os as _os

from pdsr_sdk.lazy import lazy_attributes as _lazy_attributes

__version__ = "0.1.0"

#: public name -> module that defines it
_LAZY = {
    # a trainer's rollout (docs/sdk.md)
    "RolloutSession": "pdsr_sdk.rollout.session", "StepResult": "pdsr_sdk.rollout.session",
    "RolloutConfig": "pdsr_sdk.rollout.config", "SamplingConfig": "pdsr_sdk.rollout.config",
    "EngineSpec": "pdsr_sdk.rollout.config", "PromptRecord": "pdsr_sdk.rollout.data",
    "load_config": "pdsr_sdk.config",
    "compute_gae": "pdsr_sdk.gae",
    "grpo_advantages": "pdsr_sdk.gae",
    "masked_whiten": "pdsr_sdk.gae",
    "rloo_advantages": "pdsr_sdk.gae", "reinforce_pp_advantages": "pdsr_sdk.gae",
    "reinforce_pp_baseline_advantages": "pdsr_sdk.gae",
    "partition_by_tokens": "pdsr_sdk.batching",
    "restore_order": "pdsr_sdk.batching",
    "partition_for_data_parallel": "pdsr_sdk.batching", "inverse_permutation": "pdsr_sdk.batching",
    "per_token_logps": "pdsr_sdk.scoring",
    "trainer_batch": "pdsr_sdk.rollout.padded", "TrainerBatch": "pdsr_sdk.rollout.padded",
    "importance_weights": "pdsr_sdk.offpolicy", "token_versions_of_rows": "pdsr_sdk.offpolicy",
    "off_policy_share": "pdsr_sdk.offpolicy",
    "simulate": "pdsr_sdk.sim", "SimEngine": "pdsr_sdk.sim", "SimulateConfig": "pdsr_sdk.sim",
    "LengthTrace": "pdsr_sdk.traces", "read_trace": "pdsr_sdk.traces", "analyze_trace": "pdsr_sdk.analysis",
    "PdsrError": "pdsr_sdk.errors",
    "ConfigError": "pdsr_sdk.errors",
    "DataError": "pdsr_sdk.errors",
    "EngineError": "pdsr_sdk.errors",
    "RunError": "pdsr_sdk.errors", "DataValueError": "pdsr_sdk.errors", "ConfigValueError": "pdsr_sdk.errors",
    "UnsupportedError": "pdsr_sdk.errors",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY)

if _os.environ.get("PDSR_ORCHESTRATOR_PID"):
    # an engine process pdsr spawned imports the parent's main module first: watch the parent from now
    # on, not from when vLLM loads plugins (pdsr_sdk/parent_watch.py)
    from pdsr_sdk.parent_watch import arm_early as _arm_early

    _arm_early()
