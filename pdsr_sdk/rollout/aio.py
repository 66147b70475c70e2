"""The asyncio pieces a rollout session runs on: the loop thread of its synchronous API, and awaiting a call on
every engine at once."""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Awaitable, Iterable


async def failures(calls: Iterable[Awaitable]) -> list[BaseException]:
    """Await ``calls`` together, each to its end; the exceptions they raised (the caller raises the first)."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    return [r for r in results if isinstance(r, BaseException)]


async def reset_prefix_cache(engine) -> None:
    """An engine's ``reset_prefix_cache`` (async on vLLM and Ray engines, immediate on simulated ones; an engine
    without a prefix cache has none)."""
    result = getattr(engine, "reset_prefix_cache", lambda: None)()
    if inspect.isawaitable(result):
        await result


class LoopThread:
    """An asyncio loop in a daemon thread: where a synchronous session's engines live (vLLM's
    ``AsyncLLM`` stays on the loop it started on)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="pdsr-session", daemon=True)
        self.thread.start()

    def call(self, coro):
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            # Ctrl-C or an error here: stop the coroutine too (its engines are closed by __exit__)
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=60)
        if not self.thread.is_alive():
            self.loop.close()
