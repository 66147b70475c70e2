"""vLLM general plugin (entry point ``vllm.general_plugins``), run in every vLLM process.

vLLM's bf16 CPU attention uses Intel AMX tiles. Linux grants AMX per process
on request (``arch_prctl(ARCH_REQ_XCOMP_PERM)``) and clears the grant on
exec, so a spawned engine-core process that never asks dies with SIGILL on
its first attention call. torch has the request built in; we call it.
"""

from __future__ import annotations


def register() -> None:
    try:
        import torch

        if not torch.cuda.is_available() and hasattr(torch.cpu, "_init_amx"):
            torch.cpu._init_amx()
    except Exception:  # noqa: BLE001 - never break engine start-up over this
        pass
