"""Shared fixtures: the tiny model and vLLM's CPU environment."""

from __future__ import annotations

import pytest

from pdsr_sdk.engines.vllm_env import apply_cpu_defaults

# Before anything imports vLLM: CPU KV cache, loopback sockets, quiet logs.
apply_cpu_defaults()

from support import HAVE_TORCH  # noqa: E402  (after the vLLM environment is set)



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

