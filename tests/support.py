"""Markers and helpers the tests import (fixtures live in conftest.py, which pytest loads itself)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path

import pytest

#: the repository's root (tests sit in folders that mirror the package, at any depth)
ROOT = Path(__file__).resolve().parent.parent

#: how long a test waits for a condition on real engines or processes before it calls them hung: generous,
#: since on a loaded machine everything is slow (a test waits on the condition, never on the clock)
WAIT_S = float(os.environ.get("PDSR_TEST_WAIT_S", 600))

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_RAY = importlib.util.find_spec("ray") is not None

requires_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (install the 'cpu' or 'gpu' extra)")
requires_torch = pytest.mark.skipif(not HAVE_TORCH,
                                    reason="torch is not installed (install the 'torch' or 'cpu' extra)")
requires_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed (install the 'ray' extra)")


def interrupt_at_call(monkeypatch, module, name: str, call: int):
    """``module.name`` raises KeyboardInterrupt (a Ctrl-C) at its ``call``-th call and runs as itself before;
    returns the real function (to set back)."""
    real, calls = getattr(module, name), []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, interrupted)
    return real


def raised_in_thread(fn, hung: str) -> BaseException | None:
    """Run ``fn()`` in a daemon thread and return what it raised (None: nothing); fails with ``hung`` if it has
    not returned within WAIT_S (a call that would hang the test's own thread for good)."""
    import threading

    outcome: list[BaseException | None] = []

    def run():
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:   # noqa: BLE001 - what fn raised is the caller's to check
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), hung
    return outcome[0]


def weight_blocks() -> int:
    """The shared-memory weight blocks this process holds."""
    import glob

    from pdsr_sdk.engines.weights_shm import new_block_path

    return len(glob.glob(new_block_path().rsplit("-", 1)[0] + "-*"))


def run_on(loop, coro, timeout: float = 900):
    """Run ``coro`` on ``loop`` (another thread) and return its result."""
    import asyncio

    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


@contextlib.contextmanager
def serving(session, loop, model_name="tiny"):
    """``session.aserve`` (port 0) on ``loop`` while the block runs: yields the server's root URL
    (``http://127.0.0.1:PORT``); stops serving and waits for the session to close after it."""
    import asyncio
    import queue

    ready: queue.Queue = queue.Queue()

    async def serve():
        async with session:
            await session.aserve(port=0, on_ready=ready.put, model_name=model_name)

    running = asyncio.run_coroutine_threadsafe(serve(), loop)
    try:
        yield f"http://127.0.0.1:{ready.get(timeout=WAIT_S)}"
    finally:
        session.stop_serving()
        running.result(WAIT_S)


def load_bench(name: str):
    """``bench/<name>.py`` as a module (``bench_<name>``), registered so that its dataclasses find it; ``bench/`` goes
    on the path, as when the script runs, so that it finds its sibling modules."""
    import sys

    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def record_parquet_columns(monkeypatch) -> list:
    """The ``columns`` each ``ParquetFile.iter_batches`` call asks for, from now on; a whole-file read (pyarrow's or
    pdsr's ``read_table``) fails the test."""
    import pyarrow.parquet as pq

    import pdsr_sdk.io.tables

    asked: list = []
    iter_batches = pq.ParquetFile.iter_batches

    def recording(self, *args, **kwargs):
        asked.append(kwargs.get("columns"))
        return iter_batches(self, *args, **kwargs)

    def whole(*args, **kwargs):
        raise AssertionError("the whole file was read")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", recording)
    monkeypatch.setattr(pq, "read_table", whole)
    monkeypatch.setattr(pdsr_sdk.io.tables, "read_table", whole)
    return asked


def write_table_as(table, path, kind: str):
    """``table`` written to ``path`` as ``kind`` (parquet, arrow or jsonl) in blocks of 3000 rows, so that a
    reader of a few thousand rows at a time crosses them; returns ``path``."""
    import json

    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    if kind == "parquet":
        pq.write_table(table, path, row_group_size=3000)
    elif kind == "arrow":
        feather.write_feather(table, path, chunksize=3000)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
    return path
