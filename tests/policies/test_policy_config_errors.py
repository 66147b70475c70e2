"""Errors about policy settings name where they are: the file (a config, a preset, or the flag) and the key."""

from __future__ import annotations

import pytest

from pdsr_sdk.config import load_config
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.sim.config import SimulateConfig


def test_a_removed_key_in_a_section_names_the_file_and_the_section(tmp_path):
    path = tmp_path / "sim.yaml"
    path.write_text("policy: v3\npolicy_settings:\n  v3:\n    placement: {kv_budget: 1.2}\n")
    with pytest.raises(ConfigError, match=rf"{path}: policy_settings\.v3\.placement: kv_budget: v3's KV-aware "
                                          rf"admission .* was removed"):
        load_config(SimulateConfig, path)


def test_an_unknown_policy_is_named_at_its_key_or_flag(tmp_path):
    from click.testing import CliRunner

    from pdsr_cli.main import cli

    path = tmp_path / "sim.yaml"
    path.write_text("policy: v3\n")
    r = CliRunner().invoke(cli, ["simulate", "--config", str(path), "--policy", "v9", "--quiet"])
    assert r.exit_code == 2
    assert "--policy: policy: unknown policy 'v9'" in r.output and str(path) not in r.output
    path.write_text("policy: v2.5-restrat\n")   # a mistyped preset: the presets are listed beside the policies
    with pytest.raises(ConfigError, match=rf"{path}: policy: unknown policy 'v2\.5-restrat'; valid names: .*; "
                                          rf"presets: v2\.5-restart"):
        load_config(SimulateConfig, path)
    path.write_text("policy: v3\npolicy_settings:\n  v3: {}\n  v9: {a: 1}\n")
    with pytest.raises(ConfigError, match=rf"{path}: policy_settings: unknown policy 'v9'"):
        load_config(SimulateConfig, path)


def test_a_preset_naming_a_preset_names_the_preset_file(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text("policy: v2.5-restart\nsettings: {cap_multiplier: 3}\n")
    monkeypatch.setenv("PDSR_POLICY_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match=rf"^{tmp_path / 'mine.yaml'}: policy: unknown policy 'v2\.5-restart'.*"
                                          rf"'v2\.5-restart' is a preset itself"):
        SimulateConfig(policy="mine")


def test_settings_that_are_not_a_mapping_are_an_error_naming_the_policy(tmp_path):
    from pdsr_sdk.policies.resolve import resolve_policy

    path = tmp_path / "sim.yaml"
    path.write_text("policy: v3\npolicy_settings:\n  v3: [migration]\n")
    with pytest.raises(ConfigError, match=rf"{path}: policy_settings: v3: expected a mapping of the policy's "
                                          rf"settings .*got list \['migration'\]"):
        load_config(SimulateConfig, path)
    with pytest.raises(ConfigError, match=r"expected a mapping of KEY: VALUE, got list"):
        resolve_policy("v3", ["migration"])


@pytest.mark.parametrize("given, key", [("{disable: [lead_guard]}", "disable"),
                                        ("{migrate_lead_guard: true}", "migrate_lead_guard")])
def test_a_removed_rule_names_its_full_key(tmp_path, given, key):
    path = tmp_path / "sim.yaml"
    path.write_text(f"policy: v3\npolicy_settings:\n  v3: {given}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: policy_settings\.v3\.{key}: .*lead_guard.* was removed"):
        load_config(SimulateConfig, path)
