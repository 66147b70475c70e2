"""The public surface: every package of pdsr_sdk says what it exports in ``__all__`` (httpx's rule: a
public name is exported, a helper is imported under a ``_`` name), the names resolve, and listing them
imports nothing heavy.

A package's public names are read without loading its lazy ones: the names bound in the module, less
its submodules, plus the names its ``__dir__`` announces (``pdsr_sdk.lazy``)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
import types

import pytest

import pdsr_sdk
from support import ROOT

PACKAGES = ["pdsr_sdk", *sorted(f"pdsr_sdk.{m.name}" for m in pkgutil.iter_modules(pdsr_sdk.__path__) if m.ispkg)]
#: bound by ``from __future__ import annotations``, not an export
NOT_PUBLIC = {"annotations"}
HEAVY = ("torch", "vllm", "numba", "ray", "matplotlib", "transformers", "pyarrow.parquet")


def public_names(module: types.ModuleType) -> set[str]:
    bound = {name for name, value in vars(module).items()
             if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    announced = set(dir(module)) - set(vars(module))      # lazy names: listed, not loaded
    return (bound | announced) - NOT_PUBLIC


def test_every_package_is_listed():
    assert {"pdsr_sdk.dispatch", "pdsr_sdk.engines", "pdsr_sdk.io", "pdsr_sdk.models",
            "pdsr_sdk.rollout"} <= set(PACKAGES)


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_is_exactly_the_public_names(name):
    module = importlib.import_module(name)
    assert hasattr(module, "__all__"), f"{name} has no __all__"
    exported = list(module.__all__)
    assert exported == sorted(exported), f"{name}.__all__ is not sorted"
    assert len(set(exported)) == len(exported)
    assert set(exported) == public_names(module), (
        f"{name}: exported but not public: {sorted(set(exported) - public_names(module))}; "
        f"public but not exported (export it, or import it as _name): {sorted(public_names(module) - set(exported))}")


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_resolves(name):
    module = importlib.import_module(name)
    missing = [n for n in module.__all__ if getattr(module, n, None) is None]
    assert not missing


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_class_and_function_has_a_docstring(name):
    import inspect

    module = importlib.import_module(name)
    bare = [n for n in module.__all__ if (inspect.isclass(getattr(module, n)) or inspect.isfunction(getattr(module, n)))
            and not (getattr(module, n).__doc__ or "").strip()]
    assert not bare, f"{name}: exported without a docstring: {bare}"


def test_listing_every_surface_imports_nothing_heavy():
    code = ("import importlib, json, sys\n"
            f"for name in {PACKAGES!r}:\n"
            "    m = importlib.import_module(name); dir(m); m.__all__\n"
            f"print(json.dumps([h for h in {HEAVY!r} if h in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
