"""v3's settings: a nested model per rule, one ``disable`` list, and the flat keys of earlier versions still read
(each with a warning naming its new key) in Python, config files, presets, ``--set`` and ``--resume``."""

from __future__ import annotations

import json
import warnings

import pytest
from click.testing import CliRunner
from pydantic import Field

from pdsr_cli.main import cli
from pdsr_sdk.config import ConfigModel, load_config, validate_config, validate_saved
from pdsr_sdk.errors import ConfigError, PdsrDeprecationWarning
from pdsr_sdk.policies.resolve import resolve_policy, with_policy_sets
from pdsr_sdk.policies.v3.settings import FLAT_KEYS, FLAT_SWITCHES, RULES, V3Settings
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.traces import synth_trace, write_trace_jsonl
from v3_cases import EQUAL

# old flat settings -> the nested ones they mean, written out by hand (the reference the mapping is held to)
OLD_AND_NEW = [
    ({"migrate": False}, {"disable": ["migration"]}),
    ({"probes_first": False, "locality": False, "balance": False, "chunk_steal": False, "early_restart": False},
     {"disable": ["probes_first", "locality", "balance", "chunk_steal", "early_restart"]}),
    ({"migrate": True}, {}),
    ({"migrate_stall_share": 0.5, "migrate_min_gap": 2, "migrate_min_ratio": 0.3, "migrate_quantile": 0.9,
      "cap_runner_share": 0.7},
     {"migration": {"stall_share": 0.5, "min_gap": 2, "min_ratio": 0.3, "quantile": 0.9, "cap_runner_share": 0.7}}),
    ({"rank": "never", "min_correlation": 0.1, "correlation_window": 64, "min_pairs": 8},
     {"ranking": {"mode": "never", "min_correlation": 0.1, "correlation_window": 64, "min_pairs": 8}}),
    ({"history": 100}, {"lengths": {"history": 100}}),
    ({"placement": "deal", "heavy_max_seqs": 16}, {"placement": {"mode": "deal", "heavy_max_seqs": 16}}),
    ({"stream_placement": "deal"}, {"placement": {"mode": "deal"}}),
    ({"tail_lane": "always", "lane_seqs": 8, "lane_quantile": 0.9, "lane_engines": 2, "lane_recurrence": 0.2,
      "lane_evidence": 9, "stream_segment_tokens": 0},
     {"lane": {"mode": "always", "seqs": 8, "quantile": 0.9, "engines": 2, "recurrence": 0.2, "evidence": 9,
               "segment_tokens": 0}}),
    ({"early_restart_chance": 0.5}, {"step_end": {"restart_chance": 0.5}}),
    ({"refresh": True}, {"step_end": {"refresh_ratio": 1.0}}),
    ({"refresh": True, "refresh_ratio": 0.4}, {"step_end": {"refresh_ratio": 0.4}}),
    ({"refresh": False, "refresh_ratio": 0.4}, {}),
]


@pytest.mark.parametrize("old, new", OLD_AND_NEW)
def test_a_flat_key_means_its_nested_key_and_warns_naming_it(old, new):
    with pytest.warns(PdsrDeprecationWarning) as caught:
        upgraded = V3Settings(**old)
    assert upgraded == V3Settings.model_validate(new)
    said = " ".join(str(w.message) for w in caught)
    for key in old:
        assert f"config key '{key}' is deprecated" in said
    for section, value in new.items():
        for field in (value if isinstance(value, dict) else {}):
            assert f"'{section}.{field}'" in said or field == "refresh_ratio"
    if "disable" in new:
        assert all(f"disable: [{rule}]" in said for rule in new["disable"])


def test_every_flat_key_of_the_old_model_is_mapped():
    # the 31 fields of the flat model (before issue 48): none may be silently unknown now
    old_fields = {"probes_first", "rank", "min_correlation", "correlation_window", "min_pairs", "kv_admission",
                  "kv_budget", "history", "migrate", "migrate_min_gap", "migrate_min_ratio", "migrate_stall_share",
                  "migrate_lead_guard", "migrate_quantile", "cap_runner_share", "balance", "tail_lane", "lane_seqs",
                  "lane_quantile", "lane_engines", "lane_recurrence", "lane_evidence", "locality", "placement",
                  "chunk_steal", "stream_segment_tokens", "early_restart", "early_restart_chance", "refresh",
                  "refresh_ratio", "heavy_max_seqs"}
    assert len(old_fields) == 31
    covered = set(FLAT_KEYS) | set(FLAT_SWITCHES) | set(V3Settings.removed_keys) | {"placement", "refresh",
                                                                                      "refresh_ratio"}
    assert old_fields <= covered
    assert set(FLAT_SWITCHES.values()) == set(RULES)
    # each is pinned in the table above, or in the removed rules' test below
    assert {k for old, _ in OLD_AND_NEW for k in old} >= old_fields - set(V3Settings.removed_keys)


def test_a_switch_turned_back_on_leaves_disable():
    with pytest.warns(PdsrDeprecationWarning, match="without migration"):
        s = V3Settings(disable=["migration", "balance"], migrate=True)
    assert s.disable == ["balance"] and s.on("migration") and not s.on("balance")


def test_an_old_key_and_its_new_key_together_are_an_error():
    with pytest.raises(ConfigError, match="migrate_stall_share and migration.stall_share are the same setting"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PdsrDeprecationWarning)
            V3Settings.model_validate({"migrate_stall_share": 0.3, "migration": {"stall_share": 0.5}})


def test_a_flat_key_beside_a_typed_section_joins_it():
    from pdsr_sdk.policies.v3.settings import MigrationSettings

    with pytest.warns(PdsrDeprecationWarning):
        s = V3Settings(migration=MigrationSettings(min_gap=2), migrate_stall_share=0.3)
    assert (s.migration.min_gap, s.migration.stall_share) == (2, 0.3)


def test_disable_names_only_rules_and_is_kept_in_one_order():
    assert V3Settings(disable=["migration", "balance", "migration"]).disable == ["balance", "migration"]
    with pytest.raises(ConfigError, match=r"disable\.0.*'probes_first'.*'early_restart'"):
        validate_config(V3Settings, {"disable": ["migrate"]})
    with pytest.raises(ConfigError, match=r"migration\.stal_share: unknown config key; valid keys here: "
                                          r"cap_runner_share, kv_headroom, min_gap, min_ratio, quantile, stall_share"):
        validate_config(V3Settings, {"migration": {"stal_share": 0.3}})


def test_the_descriptions_are_short():
    # what a setting does and why its default, in at most two sentences; the history is in docs/notes/
    models = [V3Settings, *(f.annotation for f in V3Settings.model_fields.values()
                            if isinstance(f.annotation, type) and issubclass(f.annotation, ConfigModel))]
    assert len(models) == 7
    for model in models:
        for name, field in model.model_fields.items():
            text = field.description   # each read alone (a schema shows one), not continuing the one before
            assert text and "..." not in text and text.count(". ") <= 1 and len(text.split()) <= 70, (name, text)


# ----------------------------------------------------------------------------------------- where they are read
def test_a_config_file_with_flat_keys_runs_and_warns_naming_the_new_keys(tmp_path):
    cfg = tmp_path / "sim.yaml"
    cfg.write_text("policy: v3\npolicy_settings:\n  v3:\n    migrate: false\n    lane_seqs: 16\n")
    with pytest.warns(PdsrDeprecationWarning) as caught:
        loaded = load_config(SimulateConfig, cfg)
    said = [str(w.message) for w in caught]
    assert f"{cfg}: config key 'migrate' is deprecated; use 'disable: [migration]'" in said
    assert f"{cfg}: config key 'lane_seqs' is deprecated; use 'lane.seqs'" in said
    # typed once, when the config was read: carried as v3's settings, not validated again
    settings = loaded.policy_settings["v3"]
    assert isinstance(settings, V3Settings) and settings.disable == ["migration"] and settings.lane.seqs == 16
    assert resolve_policy("v3", settings)[1] is settings
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: v3\npolicy_settings:\n  v3:\n    migration: {stal_share: 1}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: policy_settings\.v3\.migration\.stal_share: unknown config key"):
        load_config(SimulateConfig, bad)


def test_a_preset_with_flat_keys_warns_naming_its_file(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text("policy: v3\nsettings:\n  migrate: false\n  heavy_max_seqs: 12\n")
    monkeypatch.setenv("PDSR_POLICY_DIR", str(tmp_path))
    with pytest.warns(PdsrDeprecationWarning) as caught:
        cls, settings = resolve_policy("mine", {"placement": {"mode": "deal"}})
    said = [str(w.message) for w in caught]
    assert any(m.endswith("mine.yaml: config key 'heavy_max_seqs' is deprecated; use 'placement.heavy_max_seqs'")
               for m in said)
    assert any(m.endswith("mine.yaml: config key 'migrate' is deprecated; use 'disable: [migration]'") for m in said)
    # the preset's section and the user's meet key by key, not section by section
    assert settings.placement.heavy_max_seqs == 12 and settings.placement.mode == "deal"
    assert settings.disable == ["migration"]


def test_set_takes_dotted_keys_with_or_without_the_policy():
    cfg = SimulateConfig(policy="v3,v2.5")
    out = with_policy_sets(cfg, [("v3", "migration.stall_share", 0.5), (None, "lane.seqs", 8),
                                 (None, "disable", ["balance"])])
    assert out.policy_settings["v3"] == V3Settings.model_validate(
        {"migration": {"stall_share": 0.5}, "lane": {"seqs": 8}, "disable": ["balance"]})
    assert out.policy_settings["v2.5"] == cfg.policy_settings["v2.5"]
    with pytest.warns(PdsrDeprecationWarning, match="^--set: config key 'migrate_quantile' is deprecated; "
                                                    "use 'migration.quantile'"):
        old = with_policy_sets(out, [(None, "migrate_quantile", 0.8)])   # an old key still finds v3
    assert old.policy_settings["v3"] == out.policy_settings["v3"].model_copy(
        update={"migration": out.policy_settings["v3"].migration.model_copy(update={"quantile": 0.8})})
    # the old key overrides what it means, also where the new key was set before
    with pytest.warns(PdsrDeprecationWarning, match="use 'migration.stall_share'"):
        again = with_policy_sets(out, [(None, "migrate_stall_share", 0.1)])
    assert again.policy_settings["v3"].migration.stall_share == 0.1
    # the error names --set, where the key came from, not v3's preset (whose own settings are valid)
    with pytest.raises(ConfigError, match=r"--set: policy_settings\.v3\.migration\.stal_share: unknown config key"):
        with_policy_sets(cfg, [("v3", "migration.stal_share", 0.5)])


def test_cli_set_with_a_dotted_key_changes_what_v3_does(tmp_path):
    """``--set v3:placement.mode=chunk`` against ``deal``: a different schedule (the moves and steals counted
    differ), and the summary records the nested setting."""
    trace = write_trace_jsonl(synth_trace(groups=32, n=4, seed=3, median_length=200, max_length=1000),
                              tmp_path / "t.jsonl")
    args = ["simulate", "--trace", str(trace), "--policy", "v3", "--no-references", "--fast", "2", "--heavy", "1",
            "--batch-size", "16", "--quiet", "--no-timeline"]
    reports = {}
    for mode in ("chunk", "deal"):
        r = CliRunner().invoke(cli, [*args, "--out-dir", str(tmp_path / mode), "--set", f"v3:placement.mode={mode}"])
        assert r.exit_code == 0, r.output
        reports[mode] = json.loads((tmp_path / mode / "simulate.json").read_text())["policies"][0]
        assert reports[mode]["settings"]["placement"]["mode"] == mode
    assert ([b["makespan_s"] for b in reports["chunk"]["batches"]]
            != [b["makespan_s"] for b in reports["deal"]["batches"]])
    r = CliRunner().invoke(cli, [*args, "--out-dir", str(tmp_path / "old"), "--set", "v3:migrate=false"])
    assert r.exit_code == 0, r.output
    assert "warning: --set: config key 'migrate' is deprecated; use 'disable: [migration]'" in r.output
    assert json.loads((tmp_path / "old" / "simulate.json").read_text())["policies"][0]["settings"]["disable"] == \
        ["migration"]


# ----------------------------------------------------------------------------------------- removed settings
class _Rule(ConfigModel):
    kept: int = Field(1, description="A setting that stays.")
    removed_keys = {"gone": "the gone rule was removed (it did not gain on the workload family)"}


class _Settings(ConfigModel):
    rule: _Rule = Field(default_factory=_Rule, description="A rule's section.")
    removed_keys = {"old_switch": "the old_switch rule was removed"}


def test_a_removed_setting_written_by_hand_is_an_error_naming_the_removal(tmp_path):
    with pytest.raises(ConfigError, match="old_switch: the old_switch rule was removed; remove the key"):
        validate_config(_Settings, {"old_switch": True}, source="mine.yaml")
    with pytest.raises(ConfigError, match=r"gone: the gone rule was removed \(it did not gain"):
        validate_config(_Settings, {"rule": {"gone": 3}})


def test_a_removed_setting_read_from_a_saved_run_is_ignored_with_a_warning():
    with pytest.warns(PdsrDeprecationWarning, match="'old_switch' of a saved run is ignored: the old_switch rule"):
        assert validate_saved(_Settings, {"old_switch": True}) == _Settings()
    with pytest.warns(PdsrDeprecationWarning, match="'gone' of a saved run is ignored"):   # also in a section
        assert validate_saved(_Settings, {"rule": {"gone": 3, "kept": 2}}) == _Settings(rule=_Rule(kept=2))


# ----------------------------------------------------------------------------------------- --resume
def _run_on_disk(tmp_path, then):
    from workloads import trajectory_rows

    from pdsr_sdk.dispatch.trajectory import trajectory_schema
    from pdsr_sdk.rollout.resume import METADATA_KEY
    from pdsr_sdk.rollout.writer import TrajectoryWriter

    out = tmp_path / "o.parquet"
    w = TrajectoryWriter(out, trajectory_schema(), flush_groups=1, metadata={METADATA_KEY: json.dumps(then)})
    w.add_group(trajectory_rows("q0", 2))
    return out


def test_resume_compares_settings_however_they_are_spelt(tmp_path):
    from pdsr_sdk.rollout.resume import read_resume_state

    out = _run_on_disk(tmp_path, {"policy": "v3", "policy_settings": {"migrate": False, "lane_seqs": 16}})
    same = {"policy": "v3", "policy_settings": {"disable": ["migration"], "lane": {"seqs": 16}}}
    with pytest.warns(PdsrDeprecationWarning):
        assert read_resume_state(out, same, tmp_path / "s.json").samples == 2
    other = {"policy": "v3", "policy_settings": {"lane": {"seqs": 16}}}
    with pytest.warns(PdsrDeprecationWarning):
        with pytest.raises(ConfigError, match=r"policy_settings \(--set\) is .* now but was"):
            read_resume_state(out, other, tmp_path / "s.json")


# ----------------------------------------------------------------------------------------- each setting acts


def _batches(trace, settings, **kw):
    from pdsr_sdk.sim.driver import run_policy, trace_batches

    prof = dict(max_num_seqs=32, kv_cache_tokens=65536)
    base = dict(policy="v3", fast=3, heavy=1, batch_size=32, timeline=False, references=False, num_batches=3,
                profiles={"fast": prof, "heavy": prof}) | kw
    cfg = SimulateConfig(**base, policy_settings={"v3": settings})
    run = run_policy(trace_batches(trace, cfg), cfg, "v3", keep_groups=True)
    # the schedule: each batch's end, and where every segment of every sample ran
    return ([round(b.makespan_s, 6) for b in run.batches],
            [[seg.engine for seg in s.segments] for g in run.groups for s in g.samples])


def _steps(trace, settings, *, restart="replay", heavy=1, slots=None, **kw):
    from pdsr_sdk.sim.steps import run_steps

    prof = EQUAL if slots is None else dict(max_num_seqs=slots, kv_cache_tokens=65536, block_size=16)
    base = dict(policy="v3", batch_size=32, steps=8, over_provision=0.25, timeline=False, references=False, fast=3,
                heavy=heavy, max_staleness=1, profiles={"fast": prof, "heavy": prof}, restart_lengths=restart) | kw
    cfg = SimulateConfig(**base, policy_settings={"v3": settings})
    run = run_steps(trace, cfg, "v3", cfg.over_provision, keep_groups=True)
    return [(round(r.end_s, 6), r.stale_restarts, r.restarts, r.refreshed) for r in run.steps]


def _informative():
    return synth_trace(groups=200, n=8, seed=5, runaway_frac=0.02, max_length=2048)


def _uninformative():
    return synth_trace(groups=200, n=8, seed=5, prompt_sigma=0.05, noise_sigma=0.7, runaway_frac=0.2, max_length=1024)


def _runaways():
    return synth_trace(groups=400, n=8, seed=7, runaway_frac=0.01)


def _short():
    return synth_trace(groups=400, n=8, seed=2, median_length=120, max_length=1500, runaway_frac=0.004,
                       prompt_len_min=5, prompt_len_max=100)


# a stream that fills every slot (8 a engine), fresh draws: early restarts happen here
FULL = dict(slots=8, restart="redraw", fast=2, batch_size=16, steps=20, over_provision=0.5,
            segments={"min_tokens": 16, "max_tokens": 96})
LANE = {"mode": "always"}
# (the setting changed, its new value, base settings, the workload): the run with the new value must schedule
# differently from the run without it. Workloads: batches (informative, uninformative) or streams
# under a staleness bound (the lane's; one that fills every slot)
ACTS = [
    ("disable", ["probes_first"], {}, "batches", _informative, {}),
    ("disable", ["locality"], {}, "batches", _uninformative, {}),
    ("disable", ["balance"], {}, "batches", _uninformative, {}),
    ("disable", ["chunk_steal"], {}, "batches", _informative, {}),
    ("disable", ["migration"], {}, "batches", _informative, {}),
    ("disable", ["early_restart"], {"lane": {"evidence": 2}}, "steps", _short, FULL),
    ("ranking.mode", "never", {}, "batches", _uninformative, {}),
    ("ranking.min_correlation", 0.9, {}, "batches", _informative, {}),
    ("ranking.correlation_window", 16, {"ranking": {"min_pairs": 16}}, "batches", _informative, {}),
    ("ranking.min_pairs", 1000, {}, "batches", _uninformative, {}),
    ("lengths.history", 16, {}, "batches", _informative, {}),
    ("placement.mode", "deal", {}, "batches", _informative, {}),
    ("placement.heavy_max_seqs", 2, {}, "batches", _informative, {}),
    ("migration.quantile", 0.8, {}, "batches", _informative, {}),
    ("migration.stream_quantile", 0.8, {"lane": {"mode": "never"}}, "steps", _runaways, {}),
    ("migration.cap_runner_share", 0.05, {}, "batches", _informative, {}),
    ("migration.min_gap", 1, {}, "batches", _informative, {}),
    ("migration.min_ratio", 1.0, {}, "batches", _uninformative, {}),
    ("migration.stall_share", 0.0, {}, "batches", _informative, {}),
    ("migration.kv_headroom", 0.9, {}, "batches", _informative, {}),
    ("lane.mode", "never", {}, "steps", _runaways, {}),
    ("lane.seqs", 1, {"lane": LANE}, "steps", _runaways, {}),
    ("lane.quantile", 0.9, {"lane": LANE}, "steps", _runaways, {}),
    ("lane.engines", 1, {"lane": LANE}, "steps", _runaways, {"heavy": 2}),
    ("lane.recurrence", 0.0, {"lane": {"evidence": 1}}, "steps", _runaways, {"restart": "redraw"}),
    ("lane.evidence", 100, {}, "steps", _runaways, {}),
    ("lane.segment_tokens", 0, {"lane": {"mode": "never"}}, "steps", _runaways, {}),
    ("step_end.restart_chance", 0.0, {"lane": {"evidence": 2}}, "steps", _short, FULL),
    ("step_end.refresh_ratio", 1.0, {}, "steps", _runaways, {}),
]


def test_every_setting_has_a_case_in_which_it_acts():
    named = {key for key, *_ in ACTS}
    sections = {name: f.annotation for name, f in V3Settings.model_fields.items() if name != "disable"}
    every = {f"{s}.{k}" for s, model in sections.items() for k in model.model_fields} | {"disable"}
    assert named == every
    assert {r for key, value, *_ in ACTS if key == "disable" for r in value} == set(RULES)


@pytest.mark.parametrize("key, value, base, kind, trace, kw", ACTS,
                         ids=[f"{k}={v}" for k, v, *_ in ACTS])
def test_changing_a_setting_changes_what_v3_does(key, value, base, kind, trace, kw):
    changed = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    if "." in key:
        section, field = key.split(".")
        changed[section] = {**changed.get(section, {}), field: value}
    else:
        changed[key] = value
    run = _batches if kind == "batches" else _steps
    assert run(trace(), changed, **kw) != _unchanged(run, trace, base, kw)


def test_balance_holds_back_only_while_the_pool_is_in_queue_order():
    """Under the rank (here always on) the share limit does not act: the same schedule with it off; in queue order
    (the rank never on) it does (the limit cost on the members whose rank turns on: docs/notes/v3-rules.md)."""
    ranked = {"ranking": {"mode": "always"}}
    assert _batches(_informative(), {**ranked, "disable": ["balance"]}) == _batches(_informative(), ranked)
    queued = {"ranking": {"mode": "never"}}
    assert _batches(_uninformative(), {**queued, "disable": ["balance"]}) != _batches(_uninformative(), queued)


def test_the_tail_quantile_of_a_batch_and_of_a_stream_are_apart():
    """migration.quantile sets a batch's tail and only a batch's, stream_quantile a stream's (the batch value was
    mixed in streams: docs/notes/v3-rules.md)."""
    never = {"lane": {"mode": "never"}}
    assert _batches(_informative(), {"migration": {"stream_quantile": 0.8}}) == _batches(_informative(), {})
    assert _batches(_informative(), {"migration": {"quantile": 0.8}}) != _batches(_informative(), {})
    assert _steps(_runaways(), {**never, "migration": {"quantile": 0.8}}) == _steps(_runaways(), never)
    assert _steps(_runaways(), {**never, "migration": {"stream_quantile": 0.8}}) != _steps(_runaways(), never)


#: the runs with the base settings, which many cases share: the simulator is deterministic, so each is run once
_UNCHANGED: dict[str, object] = {}


def _unchanged(run, trace, base, kw):
    key = json.dumps([run.__name__, trace.__name__, base, kw], sort_keys=True)
    if key not in _UNCHANGED:
        _UNCHANGED[key] = run(trace(), base, **kw)
    return _UNCHANGED[key]


@pytest.mark.parametrize("rule, flat", [("lead_guard", "migrate_lead_guard"), ("kv_admission", "kv_admission")])
def test_a_removed_rule_is_an_error_by_hand_and_ignored_with_a_warning_from_a_saved_run(rule, flat):
    """Rules removed by issue 48's rule table: naming one, as a rule or by its old flat key, is an error in a
    config written by hand and dropped with a warning in settings read back from a saved run."""
    for given in ({"disable": ["migration", rule]}, {flat: False}):
        with pytest.raises(ConfigError, match=rf"\({rule}\b.*was removed"):
            validate_config(V3Settings, given)
        with pytest.warns(PdsrDeprecationWarning, match=rf"{rule}.*ignored|ignored.*{rule}"):
            saved = validate_config(V3Settings, given, saved=True)
        assert saved.disable == (["migration"] if "disable" in given else [])


def test_kv_budget_went_with_kv_admission():
    """placement.kv_budget (and its flat key) names the removal by hand, and is dropped from a saved run."""
    for given in ({"placement": {"kv_budget": 1.2}}, {"kv_budget": 1.2}):
        with pytest.raises(ConfigError, match=r"kv_budget: v3's KV-aware admission \(kv_admission"):
            validate_config(V3Settings, given)
        with pytest.warns(PdsrDeprecationWarning, match="kv_budget' of a saved run is ignored"):
            assert validate_config(V3Settings, given, saved=True) == V3Settings()
