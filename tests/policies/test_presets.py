"""The built-in presets: one per registered policy restating its defaults, each valid, shipped as package data."""

from __future__ import annotations

import fnmatch
import tomllib

import pytest

from pdsr_sdk.policies import POLICIES
from pdsr_sdk.policies.presets import BUILTIN_DIR, list_presets, load_preset
from pdsr_sdk.policies.resolve import resolve_policy
from support import ROOT


def test_every_preset_validates_against_its_policy():
    presets = list_presets()
    assert set(POLICIES.names()) <= set(presets)
    for name in presets:
        cls, settings = resolve_policy(name, simulation=True)
        assert isinstance(settings, cls.config_model), name


@pytest.mark.parametrize("name", POLICIES.names())
def test_the_preset_named_after_a_policy_restates_its_defaults(name):
    # the preset named after a policy is its default configuration, written out for users to read: a changed
    # default (or a renamed setting) must change the preset too
    preset = load_preset(name)
    assert preset is not None, f"no built-in preset {name}.yaml"
    assert preset["policy"] == name
    cls = POLICIES.get(name)
    given = preset.get("settings") or {}
    assert given, f"{name}.yaml restates no setting"
    assert cls.config_model.model_validate(given) == cls.config_model(), name
    assert not unstated(cls.config_model, given), f"{name}.yaml leaves out {unstated(cls.config_model, given)}"


def unstated(model, given: dict, prefix: str = "") -> list[str]:
    """The settings of ``model`` (nested ones by dotted key) that ``given`` does not write out: a preset that
    leaves one out hides it from the user reading it (v2.5.yaml left out probe_timeout_s)."""
    from pydantic import BaseModel

    out = []
    for key, field in model.model_fields.items():
        if key not in given:
            out.append(prefix + key)
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out += unstated(field.annotation, given[key] or {}, f"{prefix}{key}.")
    return out


def test_a_changed_default_would_fail_the_restatement():
    # the check above can fail: the v2.5-restart variant differs from v2.5's defaults
    preset = load_preset("v2.5-restart")
    cls = POLICIES.get(preset["policy"])
    assert cls.config_model.model_validate(preset["settings"]) != cls.config_model()


def test_the_presets_ship_as_package_data():
    # an install outside a checkout finds them only if the wheel carries them: pyproject's package-data glob
    # must match every preset file, and they must live inside the package
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = ROOT / "pdsr_sdk" / "policies"
    assert BUILTIN_DIR.parent == package.resolve()
    files = sorted(p.relative_to(package).as_posix() for p in BUILTIN_DIR.glob("*.yaml"))
    assert files
    assert all(any(fnmatch.fnmatch(f, g) for g in data["pdsr_sdk.policies"]) for f in files)
    assert not (ROOT / "policies").exists(), "the presets moved into the package; a second copy would drift"


def test_policy_dir_presets_come_first(tmp_path, monkeypatch):
    (tmp_path / "v3.yaml").write_text("policy: baseline\nsettings: {}\n")
    monkeypatch.setenv("PDSR_POLICY_DIR", str(tmp_path))
    assert load_preset("v3")["policy"] == "baseline"
    assert load_preset("v2.5")["policy"] == "v2.5"


def test_a_preset_is_read_once_and_again_when_it_changes(tmp_path, monkeypatch):
    import pdsr_sdk.policies.presets as presets
    from pdsr_sdk.policies.resolve import with_policy_sets
    from pdsr_sdk.sim.config import SimulateConfig

    reads = []
    real = presets.read_config_file
    monkeypatch.setattr(presets, "read_config_file", lambda path: reads.append(path) or real(path))
    (tmp_path / "mine.yaml").write_text("policy: v2.5\nsettings: {cap_multiplier: 2.0}\n")
    monkeypatch.setenv("PDSR_POLICY_DIR", str(tmp_path))
    # the config types the settings, --set types them again, the run finds the class: one read
    cfg = with_policy_sets(SimulateConfig(policy="mine"), [(None, "offload_fraction", 0.3)])
    cls, settings = resolve_policy("mine", cfg.policy_settings["mine"], simulation=True)
    assert (settings.cap_multiplier, settings.offload_fraction) == (2.0, 0.3)
    assert len(reads) == 1
    load_preset("mine")["settings"]["cap_multiplier"] = 9.0     # a caller's copy: the next one is unchanged
    assert load_preset("mine")["settings"]["cap_multiplier"] == 2.0 and len(reads) == 1
    (tmp_path / "mine.yaml").write_text("policy: v2.5\nsettings: {cap_multiplier: 3.0, on_break: restart}\n")
    assert resolve_policy("mine")[1].cap_multiplier == 3.0 and len(reads) == 2


def test_a_bad_setting_given_in_code_names_the_setting_not_the_preset():
    """Settings passed in code over a built-in preset: the error names the key, not the preset file they were
    merged with (it named .../builtin_presets/v3.yaml, which holds nothing wrong)."""
    from pdsr_sdk.errors import ConfigError
    from pdsr_sdk.sim.config import SimulateConfig

    with pytest.raises(ConfigError, match=r"policy_settings\.v3\.placement\.mode") as info:
        SimulateConfig(policy_settings={"v3": {"placement": {"mode": "bogus"}}})
    assert "builtin_presets" not in str(info.value) and ".yaml" not in str(info.value)


def test_a_bad_setting_in_a_preset_names_the_preset(tmp_path, monkeypatch):
    from pdsr_sdk.errors import ConfigError
    from pdsr_sdk.sim.config import SimulateConfig

    (tmp_path / "broken.yaml").write_text("policy: v3\nsettings:\n  placement:\n    mode: bogus\n")
    monkeypatch.setenv("PDSR_POLICY_DIR", str(tmp_path))
    for given in ({}, {"broken": {"ranking": {"min_correlation": 0.2}}}):   # a valid override beside it
        # the key as the preset file spells it (settings.<key>), not as a config's policy_settings would
        with pytest.raises(ConfigError, match=r"broken\.yaml: settings\.placement\.mode: Input should be"):
            SimulateConfig(policy="broken", policy_settings=given)
