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
