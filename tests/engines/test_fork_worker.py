"""Engine start on the CPU build (issue 47, item 5): vLLM's worker is forked from the engine core
instead of spawned (a second import of vLLM, about 10 s of a 2-core machine's start). The core is
spawned with the worker's OpenMP binding (read once, when the runtime loads) and frees its own
threads after the fork. No vLLM needed here; tests/engines/test_vllm_engine.py checks a real
worker's binding."""

from __future__ import annotations

import os

import pytest

from support import requires_vllm
from pdsr_sdk.engines import vllm_env
from pdsr_sdk.engines.vllm_env import forks_worker_here, free_core_threads, worker_omp_env
from pdsr_sdk.rollout.config import EngineSpec


def test_the_core_gets_the_binding_vllm_gives_its_worker():
    """vLLM 0.32 with GNU OpenMP preloaded (vllm/utils/ompmultiprocessing.py): thread i on core i of the list."""
    assert worker_omp_env([0, 1]) == {"OMP_NUM_THREADS": "2", "GOMP_CPU_AFFINITY": "0 1"}
    assert worker_omp_env([3]) == {"OMP_NUM_THREADS": "1", "GOMP_CPU_AFFINITY": "3"}


@pytest.mark.parametrize("preload, fork", [
    ("", True),                                             # vLLM preloads torch's libgomp
    ("/usr/lib/x86_64-linux-gnu/libgomp.so.1", True),
    ("/usr/lib/libtcmalloc_minimal.so.4", True),
    ("/opt/intel/lib/libiomp5.so", False),                  # bound by KMP_AFFINITY: vLLM's spawn
    ("/usr/lib/llvm/lib/libomp.so", False),
])
def test_fork_only_with_the_runtime_vllm_preloads(monkeypatch, preload, fork):
    monkeypatch.setenv("LD_PRELOAD", preload)
    monkeypatch.delenv(vllm_env.FORK_WORKER_ENV, raising=False)
    assert forks_worker_here() is fork
    monkeypatch.setenv(vllm_env.FORK_WORKER_ENV, "0")    # the user's opt-out
    assert forks_worker_here() is False


def test_an_engine_forks_its_worker_only_with_one_worker_on_known_cores(monkeypatch):
    from pdsr_sdk.engines.vllm_engine import VllmEngine

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv(vllm_env.FORK_WORKER_ENV, raising=False)

    def forks(devices=(0, 1), **spec) -> bool:
        engine = VllmEngine(EngineSpec(name="e", pool="fast", devices=list(devices), **spec), model="/nonexistent")
        try:
            return engine._forks_worker(engine._engine_args(True))
        finally:
            engine._error_file.unlink(missing_ok=True)

    assert forks() and forks(devices=[1])
    assert not forks(devices=[])                 # vLLM's own binding ('auto'): left to it
    assert not forks(tensor_parallel_size=2)
    assert not forks(engine_args={"pipeline_parallel_size": 2})
    assert not forks(engine_args={"distributed_executor_backend": "mp"})


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_the_core_frees_its_threads_after_the_fork():
    """What the core runs after forking its worker, in a real child process: every thread back on the
    given CPUs, one torch thread."""
    torch = pytest.importorskip("torch")
    cpus = sorted(os.sched_getaffinity(0))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child plays the core: pinned as the OpenMP runtime pins it, then freed
        try:
            import threading

            os.sched_setaffinity(0, cpus[:1])
            torch.set_num_threads(2)   # as a core has (the tests' own process runs one: tests/conftest.py)
            started = threading.Event()
            t = threading.Thread(target=started.wait, daemon=True)   # started while pinned
            t.start()
            free_core_threads(set(cpus))
            masks = {sorted(os.sched_getaffinity(int(tid))) == cpus for tid in os.listdir("/proc/self/task")}
            os.write(w, f"{masks} {torch.get_num_threads()}".encode())
            started.set()
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 200).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert got == "{True} 1"


@requires_vllm
@pytest.mark.vllm
def test_vllm_inspects_models_in_this_process_once_told_to(monkeypatch):
    """A model architecture vLLM has not met on this machine is inspected in a fresh interpreter (11 s
    on 2 cores); on the CPU build pdsr has it done in the process instead."""
    from vllm.model_executor.models import registry

    monkeypatch.setattr(registry, "_run_in_subprocess", registry._run_in_subprocess)   # restored after the test
    vllm_env.inspect_models_in_process()
    vllm_env.inspect_models_in_process()          # idempotent
    assert registry._run_in_subprocess(lambda: os.getpid()) == os.getpid()
