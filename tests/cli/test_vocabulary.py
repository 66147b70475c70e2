"""One vocabulary for ``pdsr rollout`` and ``pdsr simulate``: the same keys and flags, old spellings
still working with a warning that names the new one, policy lists from the registry."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from support import ROOT
from pdsr_cli.main import cli
from pdsr_sdk.config import load_config
from pdsr_sdk.config.catalog import CONFIG_MODELS, config_models
from pdsr_sdk.errors import ConfigError, PdsrDeprecationWarning
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.policies.resolve import runnable_policies, with_policy_sets
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.traces import synth_trace, write_trace_jsonl


def test_rollout_and_simulate_name_the_shared_keys_alike():
    shared = {"policy", "policy_settings", "fast", "heavy", "batch_size", "num_batches", "segments"}
    assert shared <= set(RolloutConfig.model_fields) and shared <= set(SimulateConfig.model_fields)


def test_old_rollout_keys_still_work_and_name_the_new_ones(tmp_path):
    cfg = tmp_path / "old.yaml"
    cfg.write_text("fast_engines: 3\nheavy_engines: 1\npolicy: {name: v2.5, settings: {cap_multiplier: 2.0}}\n")
    with pytest.warns(PdsrDeprecationWarning) as caught:
        c = load_config(RolloutConfig, cfg)
    assert (c.fast, c.heavy, c.policy) == (3, 1, "v2.5")
    assert c.policy_settings == {"v2.5": POLICIES.get("v2.5").config_model(cap_multiplier=2.0)}
    text = "\n".join(str(w.message) for w in caught)
    assert f"{cfg}: config key 'fast_engines' is deprecated; use 'fast'" in text
    assert f"{cfg}: config key 'heavy_engines' is deprecated; use 'heavy'" in text
    assert f"{cfg}: config key 'policy.settings' is deprecated; use 'policy_settings.v2.5'" in text
    # a flag still overrides the file's old key
    with pytest.warns(PdsrDeprecationWarning):
        assert load_config(RolloutConfig, cfg, {"fast": 5}).fast == 5
    with pytest.warns(PdsrDeprecationWarning):
        assert RolloutConfig(fast_engines=2).fast == 2


def test_a_presets_old_key_is_one_warning_line_with_set_too(tmp_path, monkeypatch):
    """The preset's settings are read again where --set meets them: still one line for each old key."""
    (tmp_path / "mine.yaml").write_text("policy: v3\nsettings:\n  migrate: false\n")
    monkeypatch.setenv("PDSR_POLICY_DIR", str(tmp_path))
    r = CliRunner().invoke(cli, ["simulate", "--policy", "mine", "--set", "mine:balance=false",
                                "--num-batches", "1", "--batch-size", "8", "--no-references"])
    assert r.exit_code == 0, r.output + r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert lines == [f"warning: {tmp_path / 'mine.yaml'}: config key 'migrate' is deprecated; use 'disable: "
                     "[migration]'",
                     "warning: --set: config key 'balance' is deprecated; use 'disable: [balance]'"]


def test_old_and_new_key_together_is_an_error(tmp_path):
    cfg = tmp_path / "both.yaml"
    cfg.write_text("fast_engines: 3\nfast: 2\n")
    with pytest.raises(ConfigError, match="both.yaml: fast_engines and fast are the same setting"):
        load_config(RolloutConfig, cfg)


def test_cli_prints_the_deprecation_on_stderr(tmp_path):
    cfg = tmp_path / "old.yaml"
    cfg.write_text("fast_engines: 1\n")
    r = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--policy", "v2.5", "--set", "cap_multipler=2"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "warning: " in r.output and "config key 'fast_engines' is deprecated; use 'fast'" in r.output
    assert "policy_settings.v2.5.cap_multipler" in r.output


def test_simulate_policy_set_is_an_alias_of_set(tmp_path):
    trace = write_trace_jsonl(synth_trace(groups=4, n=4, seed=1, median_length=120, max_length=700),
                              tmp_path / "t.jsonl")
    args = ["simulate", "--trace", str(trace), "--policy", "v2.5", "--fast", "1", "--heavy", "1", "--quiet",
            "--out-dir", str(tmp_path / "o"), "--no-timeline"]
    r = CliRunner().invoke(cli, [*args, "--policy-set", "cap_multiplier=3"])
    assert r.exit_code == 0, r.output
    assert "warning: --policy-set is deprecated; use --set" in r.output
    assert '"cap_multiplier": 3' in (tmp_path / "o" / "simulate.json").read_text()
    assert "--policy-set" not in CliRunner().invoke(cli, ["simulate", "--help"]).output


def test_rollout_set_takes_the_policy_prefix_like_simulate():
    cfg = with_policy_sets(RolloutConfig(policy="v2,v2.5"),
                           [(None, "cap_multiplier", 2.0), ("v2", "steal", False)])
    assert cfg.policy_settings == {"v2.5": POLICIES.get("v2.5").config_model(cap_multiplier=2.0),
                                   "v2": POLICIES.get("v2").config_model(steal=False)}
    with pytest.raises(ConfigError, match="'bogus' belongs to none of the selected policies"):
        with_policy_sets(cfg, [(None, "bogus", 1)])


def test_rollout_policy_all_is_every_policy_for_real_engines(tmp_path):
    from pdsr_sdk.rollout.run import policy_configs, run_rollout

    cfg = RolloutConfig(policy="all", output={"path": tmp_path / "ab.parquet"})
    runs = policy_configs(cfg)
    assert [c.policy for c in runs] == runnable_policies()
    assert runs[0].output.path == tmp_path / "ab.baseline.parquet"
    assert [c.policy for c in policy_configs(RolloutConfig(policy="v2.5"))] == ["v2.5"]
    with pytest.raises(ConfigError, match="selects"):
        run_rollout(cfg)


def test_policy_schemas_come_from_the_policy_registry():
    assert not [n for n in CONFIG_MODELS.names() if n.startswith("policy-")]
    models = config_models()
    for name in POLICIES.names():
        assert models[f"policy-{name}"] is POLICIES.get(name).config_model
    assert all((ROOT / "schemas" / f"policy-{n}.schema.json").exists() for n in POLICIES.names())


@pytest.mark.parametrize("name", ["rollout", "simulate"])
def test_the_config_schemas_check_each_policys_settings_as_pdsr_does(name):
    """An editor checking a config against schemas/<name>.schema.json finds what pdsr would reject in
    policy_settings, under the key pdsr names."""
    import jsonschema

    check = jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text()))
    model = RolloutConfig if name == "rollout" else SimulateConfig
    good = {"policy_settings": {"v3": {"migration": {"stall_share": 0.3}, "disable": ["balance"]},
                                "v2.5": {"cap_multiplier": 2.0}, "v2.5-restart": {"cap_multiplier": 2.0}}}
    assert not list(check.iter_errors(good))
    model.model_validate(good)
    for bad, where in [({"v3": {"migration": {"stal_share": 0.3}}}, ["policy_settings", "v3", "migration"]),
                       ({"v3": {"disable": ["lead_guard"]}}, ["policy_settings", "v3", "disable", 0]),
                       ({"v2.5": {"cap_multiplier": "x"}}, ["policy_settings", "v2.5", "cap_multiplier"])]:
        assert [list(e.absolute_path) for e in check.iter_errors({"policy_settings": bad})] == [where]
        with pytest.raises(ConfigError, match=".".join(map(str, where[:3]))):
            model.model_validate({"policy_settings": bad})


def test_analyze_names_the_v25_replay_keys_as_v25_does(tmp_path):
    from pdsr_sdk.analysis.config import AnalyzeConfig

    v25 = set(POLICIES.get("v2.5").config_model.model_fields)
    assert {"offload_fraction", "cap_multiplier"} <= v25 & set(AnalyzeConfig.model_fields)
    cfg = tmp_path / "old.yaml"
    cfg.write_text("offload_frac: 0.3\ncap_mult: 2.0\n")
    with pytest.warns(PdsrDeprecationWarning) as caught:
        c = load_config(AnalyzeConfig, cfg)
    assert (c.offload_fraction, c.cap_multiplier) == (0.3, 2.0)
    assert "config key 'cap_mult' is deprecated; use 'cap_multiplier'" in "\n".join(str(w.message) for w in caught)
    trace = write_trace_jsonl(synth_trace(groups=8, n=4, seed=1), tmp_path / "t.jsonl")
    r = CliRunner().invoke(cli, ["analyze", str(trace), "--no-plots", "--out-dir", str(tmp_path / "o"),
                                 "--offload-frac", "0.5", "--cap-mult", "3"])
    assert r.exit_code == 0, r.output
    assert "warning: --offload-frac is deprecated; use --offload-fraction" in r.output
    assert "warning: --cap-mult is deprecated; use --cap-multiplier" in r.output
    replay = json.loads((tmp_path / "o" / "analysis.json").read_text())["dispatch_v25"]
    assert (replay["offload_fraction"], replay["cap_multiplier"]) == (0.5, 3.0)
    help_text = CliRunner().invoke(cli, ["analyze", "--help"]).output
    assert "--cap-mult " not in help_text and "--offload-frac " not in help_text
