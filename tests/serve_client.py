"""Shared by the ``session.serve`` tests: the server in a thread with an ``openai`` client on it."""

from __future__ import annotations

import contextlib
import queue
import threading

import openai

from support import WAIT_S


@contextlib.contextmanager
def serving(session, **serve_kwargs):
    """``session.serve`` in a thread for the block: an openai client on it (no retries), and its base URL."""
    ready: queue.Queue = queue.Queue()
    thread = threading.Thread(target=session.serve, kwargs={"port": 0, "on_ready": ready.put, **serve_kwargs})
    thread.start()
    try:
        base = f"http://127.0.0.1:{ready.get(timeout=WAIT_S)}/v1"
        yield openai.OpenAI(base_url=base, api_key="none", max_retries=0), base
    finally:
        session.stop_serving()
        thread.join(WAIT_S)
