"""Policy presets: ``<name>.yaml`` files naming a policy and its settings.

A preset file looks like::

    policy: v2.5          # registered policy name or import path
    settings:             # validated against the policy's config_model
      offload_fraction: 0.2

``--policy NAME`` looks for ``NAME.yaml`` in ``$PDSR_POLICY_DIR`` and then among
the built-in presets (``builtin_presets/`` beside this module, shipped as package
data, so an installed pdsr finds them outside a checkout); ``--policy
path/to/file.yaml`` loads that file. A name with no preset is a registered policy
with default settings.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from pdsr_sdk.config import read_config_file
from pdsr_sdk.errors import ConfigError


#: the presets pdsr ships (package data): each policy's defaults restated, and named variants
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin_presets"


def preset_dirs() -> list[Path]:
    """Where presets are looked for, first match wins: ``$PDSR_POLICY_DIR``, then the built-in ones."""
    dirs = []
    if os.environ.get("PDSR_POLICY_DIR"):
        dirs.append(Path(os.environ["PDSR_POLICY_DIR"]))
    dirs.append(BUILTIN_DIR)
    return dirs


def find_preset(name: str) -> Path | None:
    if name.endswith((".yaml", ".yml", ".json")):
        path = Path(name)
        if not path.exists():
            raise ConfigError(f"{path}: policy preset file does not exist")
        return path
    for d in preset_dirs():
        for suffix in (".yaml", ".yml", ".json"):
            path = d / f"{name}{suffix}"
            if path.exists():
                return path
    return None


#: presets read so far: path -> (modification time and size when read, contents), so that a run that resolves
#: a policy more than once (its config, --set, the run) reads and checks each preset file once
_READ: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}


def load_preset(name: str) -> dict[str, Any] | None:
    """The preset's contents (with ``_path``), or None when ``name`` has no preset file. A file is read and
    checked once (again when it changes); each call gets its own copy."""
    path = find_preset(name)
    if path is None:
        return None
    try:
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        stamp = None
    known = _READ.get(path.resolve())
    if stamp is not None and known is not None and known[0] == stamp:
        return copy.deepcopy(known[1])
    data = _check(path, read_config_file(path))
    if stamp is not None:
        _READ[path.resolve()] = (stamp, data)
    return copy.deepcopy(data)


def _check(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(data) - {"policy", "settings", "description"})
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: unknown preset key; valid keys: description, policy, settings")
    if not isinstance(data.get("policy"), str):
        raise ConfigError(f"{path}: policy: expected the name of a registered policy (e.g. 'v2.5')")
    if data.get("settings") is not None and not isinstance(data["settings"], dict):
        raise ConfigError(f"{path}: settings: expected a mapping of the policy's settings")
    data["_path"] = str(path)
    return data


def list_presets() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for d in reversed(preset_dirs()):
        if d.is_dir():
            for path in sorted(d.glob("*.yaml")):
                out[path.stem] = path
    return out
