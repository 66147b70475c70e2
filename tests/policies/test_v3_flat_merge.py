"""v3's old flat switches merged over other settings (a preset under a config's, ``--set`` over a config's) act
on what they are merged onto, as each did when it was a key of its own: ``migrate: false`` switches migration
off and leaves the other rules as they were."""

from __future__ import annotations

import json
import warnings

import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.policies.resolve import resolve_policy, with_policy_sets
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.traces import synth_trace, write_trace_jsonl


@pytest.fixture(autouse=True)
def _quiet_deprecations():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def _preset(tmp_path, monkeypatch, settings: str) -> str:
    (tmp_path / "mine.yaml").write_text(f"policy: v3\nsettings: {settings}\n")
    monkeypatch.setenv("PDSR_POLICY_DIR", str(tmp_path))
    return "mine"


@pytest.mark.parametrize("preset, given, disabled", [
    ("{balance: false}", {"migrate": False}, ["balance", "migration"]),
    ("{disable: [balance]}", {"migrate": False}, ["balance", "migration"]),
    ("{disable: [balance, migration]}", {"migrate": True}, ["balance"]),
    ("{balance: false}", {"disable": ["locality"], "migrate": False}, ["locality", "migration"]),
])
def test_a_flat_switch_over_a_preset_switches_one_rule(tmp_path, monkeypatch, preset, given, disabled):
    name = _preset(tmp_path, monkeypatch, preset)
    assert resolve_policy(name, given)[1].disable == disabled


@pytest.mark.parametrize("preset, given, ratio", [
    ("{step_end: {refresh_ratio: 0.5}}", {"refresh": False}, None),
    ("{step_end: {refresh_ratio: 0.5}}", {"refresh_ratio": 0.3}, 0.3),
    ("{step_end: {refresh_ratio: 0.5}}", {"refresh": True}, 0.5),
    ("{}", {"refresh_ratio": 0.3}, None),
    ("{}", {"refresh": True}, 1.0),
    ("{refresh: true, refresh_ratio: 0.6}", {"refresh_ratio": 0.2}, 0.2),
])
def test_refresh_and_its_ratio_over_a_preset_keep_the_other(tmp_path, monkeypatch, preset, given, ratio):
    name = _preset(tmp_path, monkeypatch, preset)
    assert resolve_policy(name, given)[1].step_end.refresh_ratio == ratio


def test_set_a_flat_switch_over_a_config_switches_one_rule():
    cfg = SimulateConfig(policy="v3", policy_settings={"v3": {"disable": ["balance", "migration"]}})
    assert with_policy_sets(cfg, [("v3", "migrate", True)]).policy_settings["v3"].disable == ["balance"]
    cfg = SimulateConfig(policy="v3", policy_settings={"v3": {"disable": ["balance"]}})
    out = with_policy_sets(cfg, [(None, "migrate", False), (None, "locality", False)])
    assert out.policy_settings["v3"].disable == ["locality", "balance", "migration"]
    cfg = SimulateConfig(policy="v3", policy_settings={"v3": {"step_end": {"refresh_ratio": 0.4}}})
    assert with_policy_sets(cfg, [(None, "refresh", False)]).policy_settings["v3"].step_end.refresh_ratio is None


def test_cli_set_migrate_true_over_the_config_turns_migration_back_on(tmp_path):
    trace = write_trace_jsonl(synth_trace(groups=8, n=4, seed=3, median_length=200, max_length=1000),
                              tmp_path / "t.jsonl")
    config = tmp_path / "sim.yaml"
    config.write_text("policy: v3\npolicy_settings:\n  v3: {disable: [balance, migration]}\n")
    r = CliRunner().invoke(cli, ["simulate", "--config", str(config), "--trace", str(trace), "--no-references",
                                 "--fast", "2", "--heavy", "1", "--batch-size", "8", "--quiet", "--no-timeline",
                                 "--out-dir", str(tmp_path / "o"), "--set", "v3:migrate=true"])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "o" / "simulate.json").read_text())["policies"][0]
    assert report["settings"]["disable"] == ["balance"]


@pytest.mark.parametrize("off", [False, 0, "no", "off", "false", "0"])
def test_a_flat_switch_reads_its_value_as_its_bool_field_did(off):
    # the flat model's bool fields took pydantic's false spellings; each of them still turns the rule off
    settings = resolve_policy("v3", {"migrate": off, "refresh": off, "balance": True})[1]
    assert settings.disable == ["migration"] and settings.step_end.refresh_ratio is None
    assert resolve_policy("v3", {"migrate": 1, "refresh": "yes"})[1].disable == []
    assert resolve_policy("v3", {"refresh": "yes"})[1].step_end.refresh_ratio == 1.0


def test_a_flat_switch_that_is_not_a_bool_is_an_error_naming_it():
    from pdsr_sdk.errors import ConfigError

    with pytest.raises(ConfigError,
                       match=r"mine\.yaml: policy_settings\.v3\.migrate: expected true or false, got 'maybe'"):
        resolve_policy("v3", {"migrate": "maybe"}, origin="mine.yaml")


def test_a_resumed_runs_old_settings_warn_naming_the_run(tmp_path):
    from workloads import trajectory_rows

    from pdsr_sdk.dispatch.trajectory import trajectory_schema
    from pdsr_sdk.errors import PdsrDeprecationWarning
    from pdsr_sdk.rollout.resume import METADATA_KEY, read_resume_state
    from pdsr_sdk.rollout.writer import TrajectoryWriter

    out = tmp_path / "o.parquet"
    then = {"policy": "v3", "policy_settings": {"migrate": False, "migrate_lead_guard": True}}
    w = TrajectoryWriter(out, trajectory_schema(), flush_groups=1, metadata={METADATA_KEY: json.dumps(then)})
    w.add_group(trajectory_rows("q0", 2))
    now = {"policy": "v3", "policy_settings": {"disable": ["migration"]}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_resume_state(out, now, tmp_path / "s.json").samples == 2
    said = [str(w.message) for w in caught if issubclass(w.category, PdsrDeprecationWarning)]
    assert f"{out}: config key 'migrate' is deprecated; use 'disable: [migration]'" in said
    assert any(m.startswith(f"{out}: config key 'migrate_lead_guard' of a saved run is ignored") for m in said)


@pytest.mark.parametrize("old, new_setting, says", [
    ({"refresh_ratio": 0.5}, None, "use 'step_end.refresh_ratio: null (refreshes off"),
    ({"refresh": True, "refresh_ratio": 0.5}, 0.5, "use 'step_end.refresh_ratio: 0.5'"),
    ({"refresh": True}, 1.0, "use 'step_end.refresh_ratio: 1.0'"),
])
def test_the_refresh_warning_gives_the_value_that_keeps_the_old_behaviour(old, new_setting, says):
    """An old 'refresh_ratio: 0.5' alone did nothing (refreshes were off) and maps to off, but its warning said "use
    'step_end.refresh_ratio'", and writing 'step_end.refresh_ratio: 0.5' turns refreshes on."""
    from pdsr_sdk.errors import PdsrDeprecationWarning
    from pdsr_sdk.policies.v3.settings import V3Settings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert V3Settings.model_validate(old).step_end.refresh_ratio == new_setting
    texts = [str(w.message) for w in caught if issubclass(w.category, PdsrDeprecationWarning)]
    assert texts and all(says in t for t in texts), texts
    if new_setting is not None:   # what the warning says to write gives the same settings
        assert V3Settings.model_validate({"step_end": {"refresh_ratio": new_setting}}) == V3Settings.model_validate(old)
