"""Progress and status reporting that the caller controls.

The SDK never prints. Long-running SDK functions take ``progress``, a
factory ``progress(desc, total, unit) -> bar`` whose bars have ``update(n)``,
``set_postfix_str(text)`` and ``close()``. The default makes silent bars; the
CLI passes :func:`stderr_progress` (tqdm bars on a terminal, plain lines in a
log); a trainer can pass its own (e.g. to log).

One-line messages about what is happening (``starting 2 vLLM engines ...``)
go to a ``status`` callback, ``status(message) -> None`` (default
:func:`silent_status`); :class:`~pdsr_sdk.rollout.session.RolloutSession`
calls its ``hooks.on_status`` callbacks.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any, Callable, Protocol


class ProgressBar(Protocol):
    def update(self, n: int = 1) -> Any: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> Any: ...

    def close(self) -> Any: ...


ProgressFactory = Callable[..., ProgressBar]
#: ``status(message)``: one line about what is happening, e.g. ``engines ready in 23.1 s``
StatusFn = Callable[[str], None]


def silent_status(message: str) -> None:
    """A status callback that reports nothing (the SDK default)."""


class _SilentBar:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def silent_progress(desc: str = "", total: int | None = None, unit: str = "it") -> ProgressBar:
    """A progress factory that reports nothing (the SDK default)."""
    return _SilentBar()


def tqdm_progress(desc: str = "", total: int | None = None, unit: str = "it") -> ProgressBar:
    """A progress factory that draws tqdm bars on stderr (for a terminal: bars redraw in place)."""
    from tqdm.auto import tqdm

    return tqdm(desc=desc, total=total, unit=unit, dynamic_ncols=True, leave=True)


class PlainBar:
    """A progress bar for a log file: whole lines, at most one per ``interval_s`` (and one at the end),
    never a carriage return or cursor code. ``samples: 12/32 (38%), 4.1 sample/s, 3 s``."""

    def __init__(self, desc: str = "", total: int | None = None, unit: str = "it", *,
                 file: IO[str] | None = None, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.desc, self.total, self.unit = desc, total, unit
        self.file, self.interval_s, self.clock = file, interval_s, clock
        self.n = 0
        self.postfix = ""
        self.start = self.last = clock()
        self.closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if now - self.last >= self.interval_s:
            self.last = now
            self._write(now)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._write(self.clock())

    def line(self, now: float) -> str:
        elapsed = now - self.start
        count = f"{self.n}/{self.total}" if self.total else str(self.n)
        if self.total:
            count += f" ({100 * self.n / self.total:.0f}%)"
        rate = f", {self.n / elapsed:.3g} {self.unit}/s" if elapsed > 0 and self.n else ""
        post = f", {self.postfix}" if self.postfix else ""
        return f"{self.desc + ': ' if self.desc else ''}{count}{rate}, {elapsed:.0f} s{post}"

    def _write(self, now: float) -> None:
        out = self.file if self.file is not None else sys.stderr
        print(self.line(now), file=out, flush=True)


def plain_progress(desc: str = "", total: int | None = None, unit: str = "it") -> ProgressBar:
    """A progress factory that writes plain lines on stderr (every 10 s and at the end): for log files."""
    return PlainBar(desc=desc, total=total, unit=unit)


def stderr_progress(desc: str = "", total: int | None = None, unit: str = "it") -> ProgressBar:
    """tqdm bars when stderr is a terminal, else :class:`PlainBar` lines (no redraws in a log file)."""
    isatty = getattr(sys.stderr, "isatty", None)
    if isatty is not None and isatty():
        return tqdm_progress(desc=desc, total=total, unit=unit)
    return plain_progress(desc=desc, total=total, unit=unit)
