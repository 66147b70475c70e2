"""Another tool's name for a pdsr setting as a key of a --config file (nested or dotted) or of --set, and Hydra-style
``key=value`` arguments, are answered with pdsr's flag and key (pdsr_cli/foreign_flags.py; a config key through the
SDK's unknown-key hint); a key no row names keeps the plain message. tests/cli/test_foreign_flags.py has the flags."""

from __future__ import annotations

import pytest
import yaml

from cli_checks import failed, invoke
from pdsr_cli import foreign_flags
from pdsr_cli.foreign_flags import FOREIGN_NAMES, ForeignName, key_hint
from pdsr_sdk.config import load_config
from pdsr_sdk.config.base import unknown_key_hints
from pdsr_sdk.errors import ConfigError
from test_foreign_flags import CONFIGS

#: rows whose name, as a config key, is pdsr's own key of that name: nothing to answer
OWN = {("vLLM", "--tokenizer"), ("vLLM", "--seed"), ("pdsr", "engines")}
#: rows whose name's first word is a pdsr key that is not a section: nested, pdsr's key has the wrong type
NOT_SECTIONS = {"--reward.remote_url", "--reward.overlong_buffer_len", "--reward.overlong_penalty_factor",
                "overlong_buffer.len"}
CASES = [(row, command) for row in FOREIGN_NAMES for command in row.commands if (row.tool, row.name) not in OWN]


def _key(row: ForeignName) -> str:
    return row.name.lstrip("-").replace("-", "_")


def _nested(key: str, value):
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def _load_error(tmp_path, command: str, data: dict) -> tuple[str, str]:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    with unknown_key_hints(key_hint(command)), pytest.raises(ConfigError) as info:
        load_config(CONFIGS[command], path)
    return str(path), str(info.value)


@pytest.mark.parametrize("row, command", CASES, ids=lambda c: c if isinstance(c, str) else f"{c.tool}:{c.name}")
def test_every_rows_name_as_a_config_key_is_answered(tmp_path, row, command):
    key = _key(row)
    forms = [{key: 8}] + ([_nested(key, 8)] if "." in key and row.name not in NOT_SECTIONS else [])
    for data in forms:
        path, message = _load_error(tmp_path, command, data)
        line = next(x for x in message.splitlines() if f"{path}: {key}: unknown config key" in x)
        assert line.endswith(f"unknown config key; {key_hint(command)(key)}"), (data, message)
        assert row.answer() in line and "valid keys here" not in message, (data, message)


@pytest.mark.parametrize("row", [r for r in FOREIGN_NAMES if (r.tool, r.name) in OWN], ids=lambda r: r.name)
def test_a_name_that_is_pdsrs_own_key_is_that_key(row):
    assert row.key == _key(row)


def test_a_nested_verl_config_names_each_key_it_knows_and_the_rest_plainly(tmp_path):
    path, message = _load_error(tmp_path, "rollout", {
        "actor_rollout_ref": {"rollout": {"n": 8, "temperature": 0.7, "val_kwargs": {"n": 1}},
                              "model": {"path": "Qwen/Qwen3-8B"}},
        "sampling": {"num_generations": 4}, "data": {"train_batch_size": 64}})
    lines = message.splitlines()[1:]
    assert f"  {path}: actor_rollout_ref.rollout.n: unknown config key; verl's actor_rollout_ref.rollout.n is " \
           "pdsr's --n (sampling.n)" in lines
    assert f"  {path}: actor_rollout_ref.model.path: unknown config key; verl's actor_rollout_ref.model.path is " \
           "pdsr's --model (model)" in lines
    assert f"  {path}: sampling.num_generations: unknown config key; TRL's num_generations is pdsr's --n " \
           "(sampling.n)" in lines   # in a section of pdsr's: by its last word
    assert f"  {path}: data.train_batch_size: unknown config key; verl's data.train_batch_size is pdsr's " \
           "--batch-size (batch_size)" in lines
    # val_kwargs.n is no row's (the validation's n, not the rollout's): the key it is under, plainly
    plain = [x for x in lines if x.startswith(f"  {path}: actor_rollout_ref: unknown config key; valid keys here: ")]
    assert len(plain) == 1 and "val_kwargs" not in message
    assert len(lines) == 6, message   # n, temperature, model.path, num_generations, train_batch_size, the rest


@pytest.mark.parametrize("command, data, key", [
    ("rollout", {"num_generation": 8}, "num_generation"),
    ("rollout", {"sampling": {"nn": 8}}, "sampling.nn"),
    ("rollout", {"actor_rollout_ref": {"rollout": {"val_kwargs": {"temperature": 0}}}}, "actor_rollout_ref"),
    ("rollout", {"foo.len": 3}, "foo.len"),                          # one word of a longer key: no match on len
    ("gae", {"critic": {"gamma": 1.0}}, "critic"),
    ("score", {"rollout": {"n": 8}}, "rollout"),
    ("simulate", {"actor_rollout_ref.rollout.n": 8}, "actor_rollout_ref.rollout.n"),   # not simulate's setting
])
def test_a_key_no_row_names_keeps_the_plain_message(tmp_path, command, data, key):
    path, message = _load_error(tmp_path, command, data)
    assert f"{path}: {key}: unknown config key; valid keys here: " in message
    assert "pdsr's" not in message and "'s " not in message


def test_an_end_naming_several_settings_is_not_answered(monkeypatch):
    rows = [ForeignName("A", "a.same_end", ("rollout",), "--n", "sampling.n"),
            ForeignName("B", "b.same_end", ("rollout",), "--top-p", "sampling.top_p")]
    monkeypatch.setattr(foreign_flags, "FOREIGN_NAMES", rows)
    hint = key_hint("rollout")
    assert hint("x.same_end") is None and hint("same_end") is None
    assert hint("a.same_end") == "A's a.same_end is pdsr's --n (sampling.n)"
    rows.append(ForeignName("C", "c.same_end", ("rollout",), "--n", "sampling.n"))
    rows.remove(rows[1])
    assert hint("x.same_end").startswith("A's a.same_end")   # every row it ends says --n


def test_the_cli_answers_a_config_files_keys(tmp_path, no_engines, prompts):
    cfg = tmp_path / "verl.yaml"
    cfg.write_text("actor_rollout_ref:\n  rollout:\n    n: 8\n'data.max_response_length': 512\n")
    failed(invoke("rollout", "--config", cfg, "--data", prompts),
           f"{cfg}: actor_rollout_ref.rollout.n: unknown config key; verl's actor_rollout_ref.rollout.n is pdsr's --n",
           f"{cfg}: data.max_response_length: unknown config key; verl's data.max_response_length is pdsr's "
           "--max-tokens (sampling.max_tokens)")
    cfg.write_text("algorithm:\n  adv_estimator: grpo\n")
    failed(invoke("gae", "--config", cfg, "--data", tmp_path / "in.parquet", "--out", tmp_path / "out.parquet"),
           f"{cfg}: algorithm.adv_estimator: unknown config key; verl's algorithm.adv_estimator is pdsr's --estimator")
    cfg.write_text("actor_rollout_ref:\n  rollout:\n    log_prob_max_token_len_per_gpu: 8192\n")
    failed(invoke("score", "--config", cfg, "--model", tmp_path, "--data", tmp_path / "in.parquet", "--out",
                  tmp_path / "out.parquet"),
           "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu: unknown config key; verl's "
           "log_prob_max_token_len_per_gpu is pdsr's --max-tokens-per-mb")


def test_the_cli_answers_a_set_key(no_engines, prompts):
    failed(invoke("rollout", "--data", prompts, "--policy", "v3", "--set", "actor_rollout_ref.rollout.n=8"),
           "--set: policy_settings.v3.actor_rollout_ref.rollout.n: unknown config key; verl's "
           "actor_rollout_ref.rollout.n is pdsr's --n (sampling.n)")


HEAD = "takes flags and --config FILE, not key=value arguments (Hydra's overrides):"


@pytest.mark.parametrize("command, given, lines", [
    (["rollout"], ["actor_rollout_ref.rollout.n=8", "data.max_response_length=1024", "n=4", "ignore_eos=true"],
     ["actor_rollout_ref.rollout.n=8: --n 8; verl's actor_rollout_ref.rollout.n is pdsr's --n (sampling.n)",
      "data.max_response_length=1024: --max-tokens 1024; verl's data.max_response_length is pdsr's --max-tokens",
      "n=4: --n 4", "ignore_eos=true: --ignore-eos"]),
    (["rollout"], ["ignore_eos=false"], ["ignore_eos=false: leave out --ignore-eos (off unless given)"]),
    (["rollout"], ["actor_rollout_ref.rollout.top_k=-1"],   # a value pdsr reads otherwise: no --top-k -1
     ["actor_rollout_ref.rollout.top_k=-1: verl's actor_rollout_ref.rollout.top_k is pdsr's --top-k (sampling.top_k); "
      "verl's -1 (off) is 0"]),
    (["score"], ["+log_prob_max_token_len_per_gpu=8192"],
     ["+log_prob_max_token_len_per_gpu=8192: verl's log_prob_max_token_len_per_gpu is pdsr's --max-tokens-per-mb"]),
    (["gae"], ["algorithm.adv_estimator=grpo", "algorithm.gamma=0.99"],
     ["algorithm.adv_estimator=grpo: --estimator grpo; verl's", "algorithm.gamma=0.99: --gamma 0.99; verl's"]),
    (["serve"], ["actor_rollout_ref.rollout.gpu_memory_utilization=0.5"],
     ["verl's actor_rollout_ref.rollout.gpu_memory_utilization is pdsr's config key "
      "engine_defaults.gpu_memory_utilization, set in the --config file (no flag)"]),
    (["simulate"], ["async_training.staleness_threshold=0.5", "--steps", "3"],
     ["async_training.staleness_threshold=0.5: verl's async_training.staleness_threshold is pdsr's --over-provision"]),
    (["rollout"], ["async_training.trigger_parameter_sync_step=2"],   # docs/partial-rollout.md's verl table
     ["verl's async_training.trigger_parameter_sync_step is pdsr's --step-groups (step_groups); the weights change "
      "at every step's end: k trainer steps a sync are one step of k x B groups"]),
    (["simulate", "--steps", "3"], ["trainer.n_gpus_per_node=8"],
     ["trainer.n_gpus_per_node=8: not a name pdsr simulate knows: its flags are in pdsr simulate --help, a "
      "--config file's keys in docs/configuration.md"]),
])
def test_key_value_arguments_get_pdsrs_flags(command, given, lines):
    out = failed(invoke(*command, *given), f"pdsr {command[0]} {HEAD}", *lines)
    assert "unexpected extra argument" not in out and "No such command" not in out


@pytest.mark.parametrize("command", ["rollout", "score", "gae", "serve", "simulate"])
def test_an_unknown_key_value_points_at_the_help(command):
    out = failed(invoke(command, "foo.bar=1", "baz"), f"pdsr {command} {HEAD}",
                 f"  foo.bar=1: not a name pdsr {command} knows: its flags are in pdsr {command} --help, a --config "
                 "file's keys in docs/configuration.md")
    assert ("also unexpected: baz" in out) == (command != "simulate")   # a group reads no further than its first


def test_a_key_value_is_answered_before_a_missing_required_option():
    # was "Missing option '--out'": click checks required options before it sees the extra words
    failed(invoke("trace", "synth", "seed=3"), f"pdsr trace synth {HEAD}", "  seed=3: --seed 3")
    out = failed(invoke("trace", "synth", "--seed", "3"))   # no key=value: click's own message
    assert "Missing option '--out'" in out and "key=value" not in out


def test_an_options_value_with_an_equals_sign_is_not_an_argument():
    out = failed(invoke("rollout", "--stop", "x=y", "a.b=1"), f"pdsr rollout {HEAD}", "  a.b=1: not a name")
    assert "x=y" not in out
    assert "Did you mean '--temperature'" in failed(invoke("rollout", "--stop", "x=y", "--tempreature", "1"))


@pytest.mark.parametrize("command", [["trace", "convert", "log.jsonl", "--out", "t.jsonl"], ["model", "tiny"]])
def test_a_command_without_a_config_file_is_not_said_to_take_one(command):
    out = failed(invoke(*command, "foo.bar=1"), f"pdsr {' '.join(command[:2])} takes flags, not key=value arguments",
                 f"  foo.bar=1: not a name pdsr {' '.join(command[:2])} knows: its flags are in pdsr "
                 f"{' '.join(command[:2])} --help")
    assert "--config" not in out and "configuration.md" not in out


@pytest.mark.parametrize("command, metavar", [(["analyze"], "TRACE"),
                                              (["trace", "convert", "--out", "t.jsonl"], "SOURCE")])
def test_a_key_value_where_a_file_goes_is_answered_as_one(tmp_path, monkeypatch, command, metavar):
    # was "TRACE a.b=1: trace file does not exist": the argument took the override
    monkeypatch.chdir(tmp_path)
    name = " ".join(c for c in command if not c.startswith("-") and "." not in c)
    out = failed(invoke(*command, "actor_rollout_ref.rollout.n=8", "foo=1"), f"pdsr {name} takes flags",
                 f"  actor_rollout_ref.rollout.n=8: not a name pdsr {name} knows: its flags are in pdsr {name} --help",
                 f"  foo=1: not a name pdsr {name} knows", f"  ({metavar}: no file is named "
                                                           "actor_rollout_ref.rollout.n=8)")
    assert "does not exist" not in out and "also unexpected" not in out
    (tmp_path / "n=8").write_text("not a trace\n")   # a file of that name is the file
    out = failed(invoke(*command, "n=8"))
    assert "key=value" not in out and "n=8" in out
    out = failed(invoke(*command, "step=*.parquet"))   # a pattern (of Hive's partition folders): the command's
    assert "key=value" not in out and "step=*.parquet" in out


TOP = ("pdsr takes a command (rollout, score, gae, simulate, analyze, trace, serve, model, schema) and its flags, "
       "not key=value arguments (Hydra's overrides):")


def test_key_values_without_a_command_name_the_commands_that_take_them():
    # was "No such command 'actor_rollout_ref.rollout.n=8'."
    out = failed(invoke("actor_rollout_ref.rollout.n=8", "gamma=1", "seed=3", "foo.bar=1", "--n", "8"), TOP,
                 "  actor_rollout_ref.rollout.n=8: pdsr rollout: --n 8; verl's actor_rollout_ref.rollout.n is pdsr's "
                 "--n (sampling.n)\n",
                 "  gamma=1: pdsr gae: --gamma 1\n",
                 "  seed=3: pdsr rollout, pdsr simulate, pdsr trace synth: --seed 3; pdsr serve: vLLM's --seed is "
                 "pdsr's config key seed, set in the --config file (no flag); the engines' seed\n",
                 "  foo.bar=1: not a name any pdsr command knows: pdsr COMMAND --help lists its flags\n")
    assert "No such command" not in out and out.count("\n  ") == 4   # --n 8: not a key=value


@pytest.mark.parametrize("group, commands", [("trace", "convert, synth"), ("model", "smollm2, tiny")])
def test_a_key_value_for_a_groups_command_names_the_groups_commands(group, commands):
    out = failed(invoke(group, "seed=3", "x=1"), f"pdsr {group} takes a command ({commands}) and its flags, not "
                 "key=value arguments", f"  x=1: not a name any pdsr {group} command knows: pdsr {group} COMMAND "
                 "--help lists its flags")
    assert ("  seed=3: pdsr trace synth: --seed 3" in out) == (group == "trace")
    assert "No such command" not in out


def test_a_group_given_another_word_keeps_clicks_answer():
    assert "No such command 'synt'." in failed(invoke("trace", "synt", "a=b"))
    assert "No such command 'rollot'." in failed(invoke("rollot", "a=b"))
