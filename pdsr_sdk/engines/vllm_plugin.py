"""vLLM general plugin (entry point ``vllm.general_plugins``), run in every vLLM process.

1. vLLM's bf16 CPU attention uses Intel AMX tiles. Linux grants AMX per
   process on request (``arch_prctl(ARCH_REQ_XCOMP_PERM)``) and clears the
   grant on exec, so a spawned engine-core process that never asks dies with
   SIGILL on its first attention call. torch has the request built in; we
   call it.
2. In an engine-core process started by pdsr (``PDSR_ENGINE_ERROR_FILE`` is
   set), errors the core logs and fatal signals are also written to that
   file, so the orchestrator can report the engine's own traceback.
3. In a process pdsr's orchestrator started (the engine core, vLLM's workers), a thread ends the
   process when its parent dies, SIGKILL included (see parent_watch.py).
"""

from __future__ import annotations

import logging
import multiprocessing
import os

_done = False


def register() -> None:
    global _done
    if _done:
        return
    _done = True
    _grant_amx()
    path = os.environ.get("PDSR_ENGINE_ERROR_FILE")
    if path and multiprocessing.parent_process() is not None:
        _capture_errors(path)
    _watch_parent()


def _grant_amx() -> None:
    try:
        import torch

        if not torch.cuda.is_available() and hasattr(torch.cpu, "_init_amx"):
            torch.cpu._init_amx()
    except Exception:  # noqa: BLE001 - never break engine start-up over this
        pass


def _watch_parent() -> None:
    try:
        from pdsr_sdk.parent_watch import arm_from_env

        arm_from_env()
    except Exception:  # noqa: BLE001 - never break engine start-up over this
        pass


def _capture_errors(path: str) -> None:
    try:
        import faulthandler

        stream = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        faulthandler.enable(file=stream, all_threads=True)
        handler = logging.StreamHandler(stream)
        handler.setLevel(logging.ERROR)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        logging.getLogger("vllm").addHandler(handler)
    except Exception:  # noqa: BLE001
        pass
