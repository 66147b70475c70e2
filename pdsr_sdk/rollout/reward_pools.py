"""The pools reward calls run in: daemon threads (:class:`DaemonThreads`), or a spawned process pool whose worker
processes are ended on close (:func:`process_workers`, :func:`terminate`)."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import queue
import threading

__all__ = ["DaemonThreads", "process_workers", "terminate"]


class DaemonThreads(cf.Executor):
    """A pool of ``workers`` daemon threads (started at the first call). ``ThreadPoolExecutor``'s threads are joined
    when the interpreter exits, so one reward call that never returns kept a stopped run's process alive."""

    def __init__(self, workers: int, name: str):
        self._workers, self._name = workers, name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shut = False

    def submit(self, fn, /, *args, **kwargs) -> cf.Future:  # type: ignore[override]
        future: cf.Future = cf.Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put((future, fn, args, kwargs))
            while len(self._threads) < self._workers:
                thread = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True)
                thread.start()
                self._threads.append(thread)
        return future

    def add_worker(self) -> None:
        """Start one more thread: one of the pool's is held by a call that was given up (it runs on to its end)."""
        with self._lock:
            if self._shut:
                return
            self._workers += 1
            thread = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, as ThreadPoolExecutor does
                future.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
        if cancel_futures:
            with contextlib.suppress(queue.Empty):
                while True:
                    item = self._queue.get_nowait()
                    if item is not None:
                        item[0].cancel()
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def process_workers(pool: cf.Executor) -> list:
    """A process pool's worker processes (its own table of them; [] for threads)."""
    return list((getattr(pool, "_processes", None) or {}).values()) if isinstance(pool, cf.ProcessPoolExecutor) else []


def terminate(workers: list) -> None:
    """Terminate a shut-down pool's ``workers`` (one in a reward that never returns would be waited for at exit)."""
    for proc in workers:
        with contextlib.suppress(Exception):
            proc.terminate()
