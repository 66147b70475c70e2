"""Local models: the built-in tiny random model and the SmolLM2 preparation.

The names load on first use (torch and transformers only when a model is built).
"""

from __future__ import annotations

from pdsr_sdk.lazy import lazy_attributes as _lazy_attributes

_LAZY = {
    "build_tiny_model": "pdsr_sdk.models.tiny",
    "default_tiny_model_dir": "pdsr_sdk.models.tiny",
    "ensure_tiny_model": "pdsr_sdk.models.tiny",
    "prepare_smollm2": "pdsr_sdk.models.smollm2",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY)
