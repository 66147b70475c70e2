"""A policy class given in code (``RolloutConfig(policy=MyPolicy)``) is stored by name: its registered name,
else its import path; a class found neither way (defined inside a function) is an error saying to register it.
An import path that finds nothing says the class must be at module level and names the registry."""

from __future__ import annotations

import json

import pytest

from pdsr_sdk import RolloutConfig
from pdsr_sdk.errors import ConfigValueError
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.policies.v3 import V3Policy
from pdsr_sdk.sim import SimulateConfig


class ModuleLevelPolicy(V3Policy):
    """A user's policy at module level: found again by its import path."""


@pytest.mark.parametrize("config", [RolloutConfig, SimulateConfig])
def test_a_registered_or_importable_class_is_stored_by_name(config):
    assert config(policy=V3Policy).policy == "v3"     # a built-in, registered lazily by import path
    path = f"{__name__}:ModuleLevelPolicy"
    cfg = config(policy=ModuleLevelPolicy)
    assert cfg.policy == path
    assert json.loads(cfg.model_dump_json())["policy"] == path      # the saved config stays JSON
    assert config(policy=json.loads(cfg.model_dump_json())["policy"]).policy == path   # and read back


def test_a_class_defined_in_a_function_is_refused_until_registered():
    def main():
        class Batchy(V3Policy):
            pass
        return Batchy

    batchy = main()
    with pytest.raises(ConfigValueError, match=r"policy: policy class \S*main\.<locals>\.Batchy .* is not registered .*"
                                               r"POLICIES\.register\('my-policy', Batchy\)") as exc:
        RolloutConfig(policy=batchy)
    assert isinstance(exc.value, ValueError)
    POLICIES.register("batchy-test", batchy)
    try:
        assert RolloutConfig(policy=batchy).policy == "batchy-test"
        assert RolloutConfig(policy="batchy-test").policy_settings["batchy-test"] is not None
    finally:
        POLICIES.unregister("batchy-test")


def test_an_import_path_that_finds_nothing_says_module_level_or_register():
    with pytest.raises(ConfigValueError, match=r"has no attribute 'Batchy' .*must be defined at module level.*"
                                               r"register it under a name: pdsr_sdk\.policies\.POLICIES\.register"):
        RolloutConfig(policy=f"{__name__}:Batchy")
