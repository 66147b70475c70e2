"""A policy class given in code (``RolloutConfig(policy=MyPolicy)``) is stored by name: its registered name,
else its import path; a class found neither way (defined inside a function) is an error saying to register it.
An import path that finds nothing says the class must be at module level and names the registry."""

from __future__ import annotations

import json
import re

import pytest

from pdsr_sdk import RolloutConfig
from pdsr_sdk.errors import ConfigError, ConfigValueError
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.policies.base import NoSettings, Policy
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


not_a_class = 42


class NoHooks:
    """Only on_batch: the other hooks every policy has are missing (no base class)."""

    name = "no-hooks"
    config_model = NoSettings

    def on_batch(self, groups):
        pass


class DictSettings(Policy):
    name = "dict-settings"
    config_model = dict


class ProtocolOnly:
    """The Dispatcher Protocol implemented in full without pdsr's base class (no required_pools, no helpers)."""

    name = "protocol-only"
    config_model = NoSettings
    streaming = True

    def __init__(self, config, ctx):
        self.ctx = ctx

    def on_batch(self, groups):
        for g in groups:
            for s in g.samples:
                self.ctx.submit(s, "fast")

    def on_launch(self, sample, engine):
        pass

    def on_sample_finished(self, sample):
        pass

    def on_segment_end(self, sample, engine):
        pass

    def on_over_cap(self, sample, engine):
        self.ctx.finish(sample, "truncated")

    def on_worker_idle(self, engine):
        pass

    def on_engine_lost(self, engine, requeued):
        pass


@pytest.mark.parametrize("attr, says", [
    ("not_a_class", "is int 42, not a class; a policy is a class (subclass pdsr_sdk.policies.base.Policy)"),
    ("NoHooks", "class NoHooks lacks the hook(s) on_launch, on_sample_finished, on_segment_end, on_over_cap, "
                "on_worker_idle, on_engine_lost that every policy has; subclass pdsr_sdk.policies.base.Policy"),
    ("DictSettings", "class DictSettings's config_model is <class 'dict'>, not a pydantic model class"),
])
@pytest.mark.parametrize("config", [RolloutConfig, SimulateConfig])
def test_what_is_not_a_policy_class_is_refused_by_name_when_the_config_is_made(config, attr, says):
    """An int was an AttributeError ('int' object has no attribute '__name__'), a class without the hooks
    failed at the run's first event, and a dict config_model at its settings."""
    path = f"{__name__}:{attr}"
    with pytest.raises(ConfigError, match=re.escape(f"policy {path!r}") + "(: | )" + re.escape(says)):
        config(policy=path)


def test_a_protocol_only_policy_runs_in_the_simulator_and_in_a_session(tiny_model_dir):
    """The Dispatcher Protocol's docstring allows a class without the base: `pdsr rollout` read its
    required_pools (not in the Protocol) and failed with an AttributeError before any engine started."""
    from pdsr_sdk import RolloutSession
    from pdsr_sdk.sim.driver import simulate
    from pdsr_sdk.traces import synth_trace

    path = f"{__name__}:ProtocolOnly"
    report = simulate(synth_trace(groups=8, n=4, seed=0), SimulateConfig(policy=path, fast=2, heavy=0, batch_size=4))
    assert [(r.policy, [b.samples for b in r.batches]) for r in report.runs] == [(path, [16, 16])]
    cfg = RolloutConfig(model=str(tiny_model_dir), batch_size=2, policy=path, sampling={"n": 2, "max_tokens": 8},
                        engines=[{"name": "fast-0", "pool": "fast", "backend": "fakes:LoopEngine"}])
    with RolloutSession(cfg) as session:
        out = session.step(["a", "b"])
    assert len(out.samples) == 4 and all(len(s.token_ids) == 8 for s in out.samples)
