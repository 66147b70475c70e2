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
4. In a CPU engine core started with ``PDSR_FORK_WORKER=1`` (one worker, its cores known), vLLM's
   worker is forked from the core rather than spawned. vLLM's CPU platform spawns it: a fresh
   interpreter that imports torch, transformers and vLLM again, about 10 s of a 2-core machine's
   engine start (docs/notes/cpu.md); the core has imported all of that already. vLLM spawns because
   the worker's OpenMP binding is environment (GOMP_CPU_AFFINITY, OMP_NUM_THREADS) that the OpenMP
   runtime reads once, when it loads; pdsr spawns the core with the worker's binding instead, so the
   forked worker's runtime has it, and after the fork the core frees its own threads again (one
   torch thread, every thread on the orchestrator's CPUs), as with a spawned worker. The core has
   run no OpenMP region before the fork, so the worker starts its own thread team.
5. On vLLM's CPU build (no Triton), the rejection sampler's fallback that spreads each request's
   temperature, top-k and top-p over its drafted tokens leaves them uninitialised (vLLM 0.32); speculative
   decoding with random sampling then samples at arbitrary temperatures. pdsr's own expansion replaces it
   (vllm_fixes.py), and its top-k alone takes a step with no drafted token, where vLLM's raised.
"""

from __future__ import annotations

import functools
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
    _fork_worker()
    _fix_cpu_sampler()


def _never_fails(fn):
    """``fn``, a step of an engine process's start-up, run so that whatever it raises is dropped: never break
    engine start-up over one of these."""
    @functools.wraps(fn)
    def run(*args) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - never break engine start-up over this
            pass

    return run


@_never_fails
def _grant_amx() -> None:
    import torch

    if not torch.cuda.is_available() and hasattr(torch.cpu, "_init_amx"):
        torch.cpu._init_amx()


@_never_fails
def _watch_parent() -> None:
    from pdsr_sdk.parent_watch import arm_from_env

    arm_from_env()


@_never_fails
def _capture_errors(path: str) -> None:
    import faulthandler

    stream = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    faulthandler.enable(file=stream, all_threads=True)
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.ERROR)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    logging.getLogger("vllm").addHandler(handler)


@_never_fails
def _fix_cpu_sampler() -> None:
    from pdsr_sdk.engines.vllm_fixes import apply_cpu_sampler_fix

    apply_cpu_sampler_fix()


@_never_fails
def _fork_worker() -> None:
    from pdsr_sdk.engines.vllm_env import FORK_WORKER_ENV
    from pdsr_sdk.parent_watch import ENGINE_CORE_PID_ENV, ORCHESTRATOR_PID_ENV

    if os.environ.get(FORK_WORKER_ENV) != "1" or os.environ.get(ENGINE_CORE_PID_ENV) != str(os.getpid()):
        return   # not an engine core pdsr started so (vLLM's worker inherits the variable: it is not one either)
    try:   # what this core would run on had the OpenMP runtime not pinned it: its parent's CPUs
        cpus = os.sched_getaffinity(int(os.environ[ORCHESTRATOR_PID_ENV]))
    except (KeyError, ValueError, OSError):
        cpus = set(range(os.cpu_count() or 1))
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    os.register_at_fork(after_in_parent=lambda: _free_core_threads(cpus))


@_never_fails
def _free_core_threads(cpus) -> None:
    from pdsr_sdk.engines.vllm_env import free_core_threads

    free_core_threads(cpus)
