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
import importlib.util
from typing import Any, Generic, Iterator, TypeVar

from pdsr_sdk.errors import ConfigError, ConfigValueError

T = TypeVar("T")


def import_object(path: str, *, kind: str = "object", register_hint: str | None = None) -> Any:
    """Import ``"pkg.module:attr"`` (or ``"pkg.module.attr"``) and return the attribute.

    Errors are :class:`~pdsr_sdk.errors.ConfigValueError` naming the path. A missing attribute says that the
    ``kind`` (e.g. "policy") must be defined at module level of an importable module, and ``register_hint`` (how
    to register one under a name instead), when given."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigValueError(f"{path!r} is not an import path of the form 'package.module:name'")
    try:
        module = _import_module(module_name, path)
    except ModuleNotFoundError as exc:
        # a user's own module beside them (`--agent examples.agent_tools:run`): the `pdsr` script, unlike
        # `python -m`, does not put the working directory on the path; uvicorn's app strings look there too
        import os
        import sys

        here = os.getcwd()
        if exc.name != module_name.split(".")[0] or here in sys.path or "" in sys.path:
            raise ConfigValueError(f"cannot import module {module_name!r} (from {path!r}): {exc}") from exc
        sys.path.append(here)
        try:
            module = _import_module(module_name, path)
        except ImportError as again:
            raise ConfigValueError(f"cannot import module {module_name!r} (from {path!r}): {again}") from again
    except ImportError as exc:
        raise ConfigValueError(f"cannot import module {module_name!r} (from {path!r}): {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            if not sep and _is_module(path):   # 'examples.agent_tools': a module, the object in it not named
                raise ConfigValueError(f"{path!r} is a module, not {_article(kind)} {kind}: name the {kind} in it "
                                       f"after a colon, '{path}:NAME'") from None
            article = _article(kind)
            hint = (f"; {article} {kind} named by import path must be defined at module level of an importable module "
                    f"(not inside a function, and not in a script run as __main__ unless this process runs it)")
            if register_hint:
                hint += f"; or register it under a name: {register_hint}"
            raise ConfigValueError(f"module {module_name!r} has no attribute {attr!r} (from {path!r}){hint}") from None
    return obj


def _import_module(module_name: str, path: str) -> Any:
    """``importlib.import_module``; the module's own code failing (a syntax error, an exception at its top level) is
    a ConfigValueError naming the import path and the file and line, where it was a traceback through importlib."""
    try:
        return importlib.import_module(module_name)
    except ImportError:
        raise
    except SyntaxError as exc:
        raise ConfigValueError(f"cannot import module {module_name!r} (from {path!r}): {exc.msg} "
                               f"({exc.filename}, line {exc.lineno})") from exc
    except Exception as exc:
        import traceback

        frames = traceback.extract_tb(exc.__traceback__)
        try:
            origin = importlib.util.find_spec(module_name).origin   # None: AttributeError, caught
        except Exception:   # a package above it fails the same way
            origin = None
        frame = ([f for f in frames if f.filename == origin] or frames)[-1]   # its line, not the stdlib's it called
        raise ConfigValueError(f"cannot import module {module_name!r} (from {path!r}): its code raised "
                               f"{type(exc).__name__}: {exc} ({frame.filename}, line {frame.lineno})") from exc


def _article(kind: str) -> str:
    return "an" if kind[:1] in "aeiou" else "a"


def _is_module(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except (ImportError, ValueError):
        return False


class Registry(Generic[T]):
    """A registry of plug-ins of one kind, keyed by name."""

    def __init__(self, kind: str, *, register_hint: str | None = None):
        self.kind = kind
        #: how a user registers an entry (e.g. "pdsr_sdk.policies.POLICIES.register('name', MyPolicy)"), for errors
        self.register_hint = register_hint
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
            raise ConfigError(
                f"{self.kind} {name!r} is already registered ({self._describe(self._entries[name])}); "
                f"pick another name"
            )
        self._entries[name] = obj
        return obj

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a plug-in registered for a while, e.g. by a test). Raises if it is unknown."""
        if name not in self._entries:
            raise ConfigValueError(f"unknown {self.kind} {name!r}; valid names: "
                                   f"{', '.join(self.names()) or '(none)'}")
        del self._entries[name]

    def get(self, name: str) -> T:
        """Return the entry for ``name``, importing it if it was registered lazily.

        An unregistered ``name`` containing ``:`` is treated as an import path. An unknown name is a
        :class:`~pdsr_sdk.errors.ConfigValueError` (a ConfigError and a ValueError) listing the valid names.
        """
        if name not in self._entries:
            if ":" in name:
                return import_object(name, kind=self.kind, register_hint=self.register_hint)
            raise ConfigValueError(
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

    def name_of(self, obj: Any) -> str | None:
        """The name ``obj`` is registered under, or None. An entry registered lazily matches when its import
        path is ``obj``'s or its module is already imported and holds ``obj`` (nothing new is imported)."""
        import sys

        path = self._describe(obj)
        for name, entry in self._entries.items():
            if entry is obj or entry == path:
                return name
            if isinstance(entry, str) and entry.partition(":")[0] in sys.modules:
                try:
                    if import_object(entry) is obj:
                        return name
                except ConfigError:
                    continue
        return None

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

