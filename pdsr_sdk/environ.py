"""Set environment variables for a block and put back what was there (tests run commands in one process)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` updated with ``values`` inside the block; each key restored (or removed) after it."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
