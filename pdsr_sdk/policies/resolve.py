"""A policy name (registered, preset or import path) and settings -> the class and its validated settings;
which registered policies run on real engines (``--policy all``) and which are simulator-only references."""

from __future__ import annotations

from typing import Any, Mapping

from pdsr_sdk.config import validate_config
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.policies.presets import load_preset


def resolve_policy(name: str, settings: Mapping[str, Any] | None = None, *,
                   simulation: bool = False) -> tuple[type, Any]:
    """(policy class, validated settings). A preset in ``policies/`` supplies the policy and base settings
    that ``settings`` override; errors name the preset file and ``policy.settings.<key>``.

    A simulation-only reference schedule (``oracle``) is refused unless ``simulation`` is true (the
    simulator's own calls); real engines cannot know the lengths it reads.
    """
    settings = dict(settings or {})
    given = name
    preset = load_preset(name)
    source = None
    if preset is not None:
        name, base = preset["policy"], dict(preset.get("settings") or {})
        settings = {**base, **settings}
        source = preset["_path"]
    cls = POLICIES.get(name)
    if is_simulation_only(cls) and not simulation:
        raise ConfigError(f"policy {given!r} is a simulator-only reference schedule: it reads a length trace's "
                          f"true lengths, which real engines cannot know; run it with `pdsr simulate`. Policies "
                          f"for real engines: {', '.join(runnable_policies())}")
    model = getattr(cls, "config_model", None)
    if model is None:
        raise ConfigError(f"policy {name!r}: class {cls.__name__} has no config_model")
    return cls, validate_config(model, settings, source=source, prefix="policy.settings")


def is_simulation_only(cls: type) -> bool:
    """Whether a policy class is a reference schedule that only the simulator can run (``simulation_only``)."""
    return bool(getattr(cls, "simulation_only", False))


def runnable_policies() -> list[str]:
    """Registered policies that run on real engines (what ``--policy all`` means): baseline first, then by name."""
    names = [n for n in POLICIES.names() if not is_simulation_only(POLICIES.get(n))]
    return sorted(names, key=lambda n: (n != "baseline", n))


def reference_policies() -> list[str]:
    """Registered simulation-only reference schedules (``oracle``, ``oracle-probe``), by name."""
    return [n for n in POLICIES.names() if is_simulation_only(POLICIES.get(n))]
