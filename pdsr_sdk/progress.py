"""Progress reporting that the caller controls.

The SDK never prints. Long-running SDK functions take ``progress``, a
factory ``progress(desc, total, unit) -> bar`` whose bars have ``update(n)``,
``set_postfix_str(text)`` and ``close()``. The default makes silent bars; the
CLI passes :func:`tqdm_progress`; a trainer can pass its own (e.g. to log).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol


class ProgressBar(Protocol):
    def update(self, n: int = 1) -> Any: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> Any: ...

    def close(self) -> Any: ...


ProgressFactory = Callable[..., ProgressBar]


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
    """A progress factory that draws tqdm bars on stderr."""
    from tqdm.auto import tqdm

    return tqdm(desc=desc, total=total, unit=unit, dynamic_ncols=True, leave=True)
