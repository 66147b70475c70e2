"""A policy name (registered, preset or import path) and settings -> the class and its validated settings."""

from __future__ import annotations

from typing import Any, Mapping

from pdsr_sdk.config import validate_config
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.policies.presets import load_preset


def resolve_policy(name: str, settings: Mapping[str, Any] | None = None) -> tuple[type, Any]:
    """(policy class, validated settings). A preset in ``policies/`` supplies the policy and base settings
    that ``settings`` override; errors name the preset file and ``policy.settings.<key>``."""
    settings = dict(settings or {})
    preset = load_preset(name)
    source = None
    if preset is not None:
        name, base = preset["policy"], dict(preset.get("settings") or {})
        settings = {**base, **settings}
        source = preset["_path"]
    cls = POLICIES.get(name)
    model = getattr(cls, "config_model", None)
    if model is None:
        raise ConfigError(f"policy {name!r}: class {cls.__name__} has no config_model")
    return cls, validate_config(model, settings, source=source, prefix="policy.settings")
