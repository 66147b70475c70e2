"""The packages' layers: no import runs up them.

Bottom to top (see CONTRIBUTING.md):

0. ``pdsr_sdk`` itself and ``errors``, ``config``, ``registry``, ``lazy``, ``progress``, ``io``, ``parent_watch``,
   ``environ``
1. ``dispatch``: types, protocols, clocks, segments, the scheduler, the policy base, run assembly
2. ``engines``, ``policies``, ``models``, ``traces``, ``batching``, ``gae``, ``scoring``, ``analysis``, ``offpolicy``,
   ``agent``
3. ``sim``, ``rollout``
4. ``pdsr_cli``

A module's module-level imports (what runs when it is imported; ``if TYPE_CHECKING:`` blocks
excepted) name only its own layer or lower ones. Packages of one layer may import each other as
long as no cycle forms among them (imports inside functions count for cycles). ``dispatch``
imports nothing above layer 0 anywhere, function bodies and type-checking blocks included.
Registries name plug-ins of higher layers as import-path strings (``"pdsr_sdk.sim.engine:SimEngine"``):
those are not imports and are not checked here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from support import ROOT


LAYERS = {
    "pdsr_sdk": 0, "errors": 0, "config": 0, "registry": 0, "lazy": 0, "progress": 0, "io": 0, "parent_watch": 0,
    "environ": 0,
    "dispatch": 1,
    "engines": 2, "policies": 2, "models": 2, "traces": 2, "batching": 2, "gae": 2, "scoring": 2, "analysis": 2,
    "offpolicy": 2, "agent": 2,
    "sim": 3, "rollout": 3,
    "pdsr_cli": 4,
}


@dataclass(frozen=True)
class Import:
    file: str           # path relative to the repository
    line: int
    text: str           # the import statement
    source: str         # package (LAYERS key) of the importing module
    target: str         # package (LAYERS key) imported
    module_level: bool  # runs when the module is imported
    type_checking: bool


def package_of(module: str) -> str | None:
    """The LAYERS key of a pdsr module name (None for other modules)."""
    parts = module.split(".")
    if parts[0] == "pdsr_cli":
        return "pdsr_cli"
    if parts[0] != "pdsr_sdk":
        return None
    return parts[1] if len(parts) > 1 else "pdsr_sdk"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Modules an import statement loads (``from pkg import name`` counts as ``pkg.name`` when that is a
    module or a lazy attribute of ``pkg``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        path = ROOT.joinpath(*sub.split("."))
        if path.is_dir() or path.with_suffix(".py").exists():
            out.append(sub)
        else:
            out.append(_lazy_map(base).get(alias.name, base))
    return out


def _lazy_map(package: str) -> dict[str, str]:
    """A package's ``_LAZY = {name: module}`` (names it loads on first use), if it has one."""
    init = ROOT.joinpath(*package.split("."), "__init__.py")
    if not init.exists():
        return {}
    for node in ast.parse(init.read_text()).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets)
                and isinstance(node.value, ast.Dict)):
            return ast.literal_eval(node.value)
    return {}


def walk_imports() -> list[Import]:
    found = []
    files = sorted((ROOT / "pdsr_sdk").rglob("*.py")) + sorted((ROOT / "pdsr_cli").rglob("*.py"))
    for path in files:
        module = module_name(path)
        source = package_of(module)
        rel = str(path.relative_to(ROOT))

        def visit(node: ast.AST, module_level: bool, type_checking: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _targets(child, module, path.name == "__init__.py"):
                        pkg = package_of(target)
                        if pkg is not None:
                            found.append(Import(rel, child.lineno, ast.unparse(child), source, pkg,
                                                module_level, type_checking))
                    continue
                in_function = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                tc = type_checking or (isinstance(child, ast.If) and _is_type_checking(child.test))
                visit(child, module_level and not in_function, tc)

        visit(ast.parse(path.read_text(), filename=rel), True, False)
    return found


IMPORTS = walk_imports()


def test_every_package_has_a_layer():
    names = {p.stem if p.is_file() else p.name for p in (ROOT / "pdsr_sdk").iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    missing = sorted(names - set(LAYERS))
    assert not missing, (f"give these pdsr_sdk packages/modules a layer in tests/test_layers.py (and CONTRIBUTING.md): "
                         f"{missing}")
    assert {i.source for i in IMPORTS} <= set(LAYERS)


def test_no_module_level_import_runs_up_the_layers():
    bad = [f"{i.file}:{i.line}: {i.text}  ({i.source}, layer {LAYERS[i.source]}, imports {i.target}, "
           f"layer {LAYERS[i.target]})"
           for i in IMPORTS if i.module_level and not i.type_checking and LAYERS[i.target] > LAYERS[i.source]]
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def test_dispatch_imports_only_layer_0_even_inside_functions():
    bad = [f"{i.file}:{i.line}: {i.text}  (imports {i.target}, layer {LAYERS[i.target]})"
           for i in IMPORTS if i.source == "dispatch" and LAYERS[i.target] > 1]
    assert not bad, "pdsr_sdk.dispatch must not depend on the layers built on it:\n" + "\n".join(bad)


def test_packages_of_one_layer_import_each_other_without_cycles():
    edges: dict[str, dict[str, Import]] = {}
    for i in IMPORTS:
        if i.source != i.target and LAYERS[i.source] == LAYERS[i.target] and not i.type_checking:
            edges.setdefault(i.source, {}).setdefault(i.target, i)

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges.get(node, {})):
                if nxt == start:
                    return path + [start]
                if nxt not in path:
                    stack.append((nxt, path + [nxt]))
        return None

    for pkg in sorted(edges):
        cycle = cycle_from(pkg)
        assert cycle is None, "packages of one layer import each other in a cycle:\n" + "\n".join(
            f"{edges[a][b].file}:{edges[a][b].line}: {edges[a][b].text}" for a, b in zip(cycle, cycle[1:]))


def test_the_walker_sees_imports_inside_functions_and_resolves_lazy_names():
    # the checks above are only as good as the walk: a known function-level import and a known lazy name
    assert any(i.file == "pdsr_sdk/rollout/session_start.py" and i.target == "engines" and not i.module_level
               for i in IMPORTS)
    assert _targets(ast.parse("from pdsr_sdk import simulate").body[0], "pdsr_sdk.x", False) == ["pdsr_sdk.sim"]
    assert _targets(ast.parse("from pdsr_sdk import sim").body[0], "pdsr_sdk.x", False) == ["pdsr_sdk.sim"]
    assert _targets(ast.parse("from ..policies import base").body[0], "pdsr_sdk.sim.driver",
                    False) == ["pdsr_sdk.policies.base"]
