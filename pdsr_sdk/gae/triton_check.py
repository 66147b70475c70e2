"""What the Triton GAE backend and its kernel both check before running, without importing triton."""

from __future__ import annotations

import os

from pdsr_sdk.errors import ConfigError


def interpreting() -> bool:
    """Whether Triton runs (or will run) in its CPU interpreter: TRITON_INTERPRET=1 when triton is imported."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_device(device) -> None:
    """ConfigError unless the tensors are on CUDA or Triton interprets (checked before triton is imported)."""
    if device.type != "cuda" and not interpreting():
        raise ConfigError(f"GAE backend 'triton' needs CUDA tensors, got {device} "
                          f"(use backend 'torch' or 'numba' on the CPU, or set TRITON_INTERPRET=1 "
                          f"before importing triton to run the kernel in Triton's interpreter)")
