"""The asyncio pieces a rollout session runs on: the loop thread of its synchronous API, and awaiting a call on
every engine at once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from typing import Awaitable, Iterable

from pdsr_sdk.errors import RunError


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
        self.thread = threading.Thread(target=self._run, name="pdsr-session", daemon=True)
        self.thread.start()
        self._calls: set[concurrent.futures.Future] = set()   # calls running now (several threads may call)
        self._stopping = False

    def _run(self) -> None:
        while True:
            try:
                self.loop.run_forever()
                return   # stop()
            except (KeyboardInterrupt, SystemExit):
                # raised by code on the loop itself (a hook, a policy), where no Ctrl-C arrives: asyncio lets it
                # out of run_forever with the task that raised it already failed, but that failure reaches the
                # waiting call only through the loop's next callbacks; so the loop goes on and the call raises it
                continue

    def call(self, coro):
        if self._stopping:
            coro.close()
            raise RunError("the session is closed; open a new RolloutSession")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        self._calls.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._stopping:   # stop() ended it: the caller hears why, not a bare cancellation
                raise RunError("the session was closed while this call waited") from None
            raise
        except BaseException:
            # Ctrl-C or an error here: stop the coroutine too (its engines are closed by __exit__)
            future.cancel()
            raise
        finally:
            self._calls.discard(future)

    def stop(self) -> None:
        """Stop the loop; a call still waiting on it (a step blocked in another thread) ends with a RunError."""
        self._stopping = True
        for future in list(self._calls):
            future.cancel()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=60)
        if not self.thread.is_alive():
            self.loop.close()
