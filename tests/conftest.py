"""Shared fixtures: the tiny model and vLLM's CPU environment."""

from __future__ import annotations

import importlib.util

import pytest

from pdsr_sdk.engines.vllm_env import apply_cpu_defaults

# Before anything imports vLLM: CPU KV cache, loopback sockets, quiet logs.
apply_cpu_defaults()

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_RAY = importlib.util.find_spec("ray") is not None

requires_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (install the 'cpu' or 'gpu' extra)")
requires_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (install the 'torch' or 'cpu' extra)")
requires_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed (install the 'ray' extra)")


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The built-in tiny random Qwen2 (built once per machine, cached)."""
    if not HAVE_TORCH:
        pytest.skip("torch is not installed")
    from pdsr_sdk.models.tiny import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch):
    # Tests never reach a model hub: everything is local.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def engine_loop():
    """One asyncio loop in a background thread for the whole session.

    vLLM's AsyncLLM is tied to the loop it first ran on, so engines shared
    between tests must live on one long-lived loop; tests submit coroutines
    to it with :func:`run_on`.
    """
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="engine-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=30)


def run_on(loop, coro, timeout: float = 900):
    """Run ``coro`` on ``loop`` (another thread) and return its result."""
    import asyncio

    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)
