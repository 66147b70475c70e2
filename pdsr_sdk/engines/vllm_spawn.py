"""Spawning a vLLM engine-core process: the environment it inherits is set only while it is spawned, one
engine at a time per event loop, and a start cancelled midway ends the processes it spawned."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import weakref

from pdsr_sdk.environ import patched_environ


async def spawn(create, env: dict[str, str]):
    """``create()`` in a thread, with ``env`` set until it has spawned the engine-core process.

    The core inherits the environment when it is spawned, early in ``from_engine_args``; hold
    ours (and a lock, so engines starting at once do not mix theirs) only until then. The long
    part, the core loading the model, overlaps with other engines' start-up.
    """
    async with _spawn_lock():
        with patched_environ(env):
            before = {p.pid for p in multiprocessing.active_children()}
            creating = asyncio.ensure_future(asyncio.to_thread(create))
            try:
                while not creating.done() and not {p.pid for p in multiprocessing.active_children()} - before:
                    await asyncio.wait({creating}, timeout=0.02)
            except BaseException:   # cancelled (Ctrl-C) before the core appeared
                await _abandon(creating, before)
                raise
    try:
        return await asyncio.shield(creating)
    except BaseException:
        await _abandon(creating, before)
        raise


async def _abandon(creating, before: set[int], timeout_s: float = 60.0) -> None:
    """Start-up was cancelled: end the engine processes ``create()`` spawned (it cannot be stopped
    itself; with its core gone it fails within a moment), and shut down what it made if it won."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not creating.done() and loop.time() < end:
        for proc in multiprocessing.active_children():
            if proc.pid not in before:
                _kill_tree(proc.pid)
        await asyncio.wait({creating}, timeout=0.05)
    if creating.done() and not creating.cancelled() and creating.exception() is None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(creating.result().shutdown, timeout=1.0)


def _kill_tree(pid: int) -> None:
    import signal

    try:
        import psutil  # a vLLM dependency

        pids = [p.pid for p in psutil.Process(pid).children(recursive=True)] + [pid]
    except Exception:  # noqa: BLE001 - gone already, or no psutil
        pids = [pid]
    for p in pids:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


_SPAWN_LOCKS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]" = weakref.WeakKeyDictionary()


def _spawn_lock() -> asyncio.Lock:
    """One lock per event loop around 'set the environment, spawn the engine core'."""
    loop = asyncio.get_running_loop()
    lock = _SPAWN_LOCKS.get(loop)
    if lock is None:
        lock = _SPAWN_LOCKS[loop] = asyncio.Lock()
    return lock



def unguarded_script_hint(main: object | None = None) -> str:
    """Words for an engine that failed to start where the program is a script (``python train.py``) with no
    ``if __name__ == "__main__":`` in it: vLLM's engine core is a spawned process that imports the script again, and
    the script starts engines at import there too, which fails in the child with Python's bootstrapping error while
    the parent sees only "Engine core initialization failed". Empty where the script has a guard or is no file."""
    import sys
    from pathlib import Path

    main = sys.modules.get("__main__") if main is None else main
    path = getattr(main, "__file__", None)
    if not path or not str(path).endswith(".py"):
        return ""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    if "__main__" in text:
        return ""
    return (f"; {path} has no `if __name__ == \"__main__\":`: vLLM's engine core is a new process that imports the "
            f"script again, so a script must start the engines under that guard (docs/sdk.md)")
