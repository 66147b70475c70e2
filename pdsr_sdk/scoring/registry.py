"""The scoring backends by name (:class:`~pdsr_sdk.scoring.backend.ScoringBackend`; see that module), apart from
the protocol so that the options model can check a name without importing it."""

from __future__ import annotations

from pdsr_sdk.registry import Registry

#: name -> scoring backend class (lazy import paths: torch and vLLM load only when used)
SCORING_BACKENDS: Registry[type] = Registry(
    "scoring backend", register_hint="pdsr_sdk.scoring.SCORING_BACKENDS.register('name', MyBackend)")
SCORING_BACKENDS.register("torch", "pdsr_sdk.scoring.torch_backend:TorchScoring")
SCORING_BACKENDS.register("vllm", "pdsr_sdk.scoring.vllm_backend:VllmScoring")
