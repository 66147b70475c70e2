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


@pytest.fixture(scope="session")
def vllm_pair(engine_loop, tiny_model_dir):
    """Two real vLLM engines on the tiny model, started once for the whole run and shared by the modules that
    need local engines (tests/rollout/test_rollout_vllm.py, tests/engines/test_ray_engine.py): ``fast-0`` on
    core 0 and ``heavy-0`` on core 1. float32, so greedy continuation after a move is bit-exact (in bf16 a
    re-prefilled context differs from step-by-step decoding in the last bits, and greedy paths can fork). A
    test that loads other weights puts the model folder's back before it ends."""
    from pdsr_sdk.engines.vllm_engine import VllmEngine
    from pdsr_sdk.rollout.config import EngineSpec
    from support import HAVE_VLLM, run_on

    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed")
    specs = [EngineSpec(name="fast-0", pool="fast", devices=[0], max_num_seqs=8, max_model_len=1024, dtype="float32"),
             EngineSpec(name="heavy-0", pool="heavy", devices=[1], max_num_seqs=8, max_model_len=1024, dtype="float32")]
    built = [VllmEngine.from_spec(s, model=str(tiny_model_dir)) for s in specs]
    try:
        for e in built:
            run_on(engine_loop, e.start())
        yield built
    finally:
        for e in built:
            run_on(engine_loop, e.close())

