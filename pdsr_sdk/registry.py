"""Name -> plug-in registries (policies, engines, GAE backends, ...).

A registry fails loudly: registering a taken name is an error, and asking for
an unknown name lists the valid ones. Entries may be registered lazily as an
import path ``"package.module:attr"`` so that heavy modules (torch, vllm,
numba) are imported only when their entry is first used. A name that is not
registered but looks like an import path (``my_pkg.policies:MyPolicy``) is
imported on request, which is how users plug in their own classes.
"""

from __future__ import annotations

import importlib
from typing import Any, Generic, Iterator, TypeVar

from pdsr_sdk.errors import ConfigValueError, PdsrError

T = TypeVar("T")


def import_object(path: str) -> Any:
    """Import ``"pkg.module:attr"`` (or ``"pkg.module.attr"``) and return the attribute."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise PdsrError(f"{path!r} is not an import path of the form 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # a user's own module beside them (`--agent examples.agent_tools:run`): the `pdsr` script, unlike
        # `python -m`, does not put the working directory on the path; uvicorn's app strings look there too
        import os
        import sys

        here = os.getcwd()
        if exc.name != module_name.split(".")[0] or here in sys.path or "" in sys.path:
            raise PdsrError(f"cannot import module {module_name!r} (from {path!r}): {exc}") from exc
        sys.path.append(here)
        try:
            module = importlib.import_module(module_name)
        except ImportError as again:
            raise PdsrError(f"cannot import module {module_name!r} (from {path!r}): {again}") from again
    except ImportError as exc:
        raise PdsrError(f"cannot import module {module_name!r} (from {path!r}): {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PdsrError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})") from None
    return obj


class Registry(Generic[T]):
    """A registry of plug-ins of one kind, keyed by name."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T | str] = {}

    def register(self, name: str, obj: T | str | None = None) -> Any:
        """Register ``obj`` (an object or a lazy import path) under ``name``.

        Used as a decorator when ``obj`` is omitted. Raises if ``name`` is taken.
        """
        if obj is None:
            def decorator(target: T) -> T:
                self.register(name, target)
                return target
            return decorator
        if name in self._entries:
            raise PdsrError(
                f"{self.kind} {name!r} is already registered ({self._describe(self._entries[name])}); "
                f"pick another name"
            )
        self._entries[name] = obj
        return obj

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a plug-in registered for a while, e.g. by a test). Raises if it is unknown."""
        if name not in self._entries:
            raise PdsrError(f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names()) or '(none)'}")
        del self._entries[name]

    def get(self, name: str) -> T:
        """Return the entry for ``name``, importing it if it was registered lazily.

        An unregistered ``name`` containing ``:`` is treated as an import path.
        """
        if name not in self._entries:
            if ":" in name:
                return import_object(name)
            raise PdsrError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names()) or '(none)'}"
                f" (or an import path 'package.module:Name')"
            )
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = import_object(entry)
            self._entries[name] = entry
        return entry  # type: ignore[return-value]

    def check_name(self, name: str, *, also: tuple[str, ...] = ()) -> str:
        """``name`` if :meth:`get` can resolve it (or it is one of ``also``, e.g. "auto"), without importing.

        For config validators: an unknown name is a ConfigValueError listing the valid names.
        """
        if name in self._entries or name in also or ":" in name:
            return name
        valid = ", ".join([*also, *self.names()]) or "(none)"
        raise ConfigValueError(f"unknown {self.kind} {name!r}; valid names: {valid} "
                               f"(or an import path 'package.module:Name')")

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    @staticmethod
    def _describe(entry: Any) -> str:
        if isinstance(entry, str):
            return entry
        return f"{getattr(entry, '__module__', '?')}:{getattr(entry, '__qualname__', repr(entry))}"

