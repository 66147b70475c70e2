"""``pdsr rollout`` bad input: clear errors that name the file, column or key, before any engine starts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli


def invoke(*args):
    return CliRunner().invoke(cli, ["rollout", "--quiet", *args], catch_exceptions=False)


@pytest.fixture()
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(3)))
    return path


def test_missing_prompt_column_lists_the_columns(tmp_path, tiny_model_dir):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"text": "hi", "answer": "1"}) + "\n")
    r = invoke("--data", str(data), "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2
    assert "bad.jsonl" in r.output and "no prompt column" in r.output and "text" in r.output
    assert "Traceback" not in r.output


def test_named_prompt_column_that_does_not_exist(prompts, tmp_path, tiny_model_dir):
    r = invoke("--data", str(prompts), "--prompt-column", "question_text", "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2 and "data.prompt_column" in r.output and "question_text" in r.output


def test_empty_file(tmp_path, tiny_model_dir):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    r = invoke("--data", str(data), "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2 and "empty.jsonl" in r.output and "empty" in r.output


def test_unknown_policy_lists_valid_names(prompts, tmp_path, tiny_model_dir):
    r = invoke("--data", str(prompts), "--policy", "v9", "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2
    for name in ("baseline", "v1", "v2", "v2.5", "v3"):
        assert name in r.output


def test_unknown_config_key_is_named_with_its_dotted_path(prompts, tmp_path, tiny_model_dir):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"data:\n  path: {prompts}\nsampling:\n  temprature: 0.7\n")
    r = invoke("--config", str(cfg), "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2
    assert "run.yaml" in r.output and "sampling.temprature" in r.output and "temperature" in r.output


def test_bad_policy_setting_is_named(prompts, tmp_path, tiny_model_dir):
    r = invoke("--data", str(prompts), "--policy", "v2.5", "--set", "cap_multipler=2",
               "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2 and "policy_settings.v2.5.cap_multipler" in r.output and "cap_multiplier" in r.output
    r = invoke("--data", str(prompts), "--policy", "v2.5", "--set", "offload_fraction=1.5",
               "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2 and "policy_settings.v2.5.offload_fraction" in r.output


def test_existing_output_needs_resume_or_overwrite(prompts, tmp_path, tiny_model_dir):
    out = tmp_path / "o.parquet"
    out.write_bytes(b"not empty")
    r = invoke("--data", str(prompts), "--out", str(out))
    assert r.exit_code == 2 and "--resume" in r.output and "--overwrite" in r.output


def test_model_dir_without_config(prompts, tmp_path):
    r = invoke("--data", str(prompts), "--model", str(tmp_path), "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2 and "config.json" in r.output


def test_forced_lengths_need_ignore_eos(tmp_path, tiny_model_dir):
    data = tmp_path / "replay.jsonl"
    data.write_text(json.dumps({"prompt": "x", "lengths": [3, 4]}) + "\n")
    r = invoke("--data", str(data), "--target-lengths-column", "lengths", "--n", "2",
               "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2 and "ignore_eos" in r.output


def test_help_lists_the_policies_and_defaults():
    r = CliRunner().invoke(cli, ["rollout", "--help"])
    assert r.exit_code == 0 and "v2.5" in r.output and "--resume" in r.output


def test_help_names_every_column_looked_for_and_every_data_format():
    """The column flags' defaults are the columns load_prompts looks for (verl's reward_model.ground_truth and
    OpenRLHF's input / label too), and --data names every format read_table reads."""
    from pdsr_sdk.io.tables import FORMATS
    from pdsr_sdk.rollout.data import ID_COLUMNS, PROMPT_COLUMNS, TRUTH_COLUMNS

    r = CliRunner(env={"COLUMNS": "2000"}).invoke(cli, ["rollout", "--help"], terminal_width=2000)
    lines = {line.split()[0]: line for line in r.output.splitlines() if line.strip().startswith("--")}
    for flag, columns in (("--prompt-column", PROMPT_COLUMNS), ("--ground-truth-column", TRUTH_COLUMNS),
                          ("--id-column", ID_COLUMNS)):
        default = lines[flag].split("[default:")[1]
        assert all(c in default for c in columns), (flag, columns, default)
    for kind in set(FORMATS.values()):
        assert {"jsonl": "JSONL", "arrow": "Arrow", "csv": "CSV", "parquet": "Parquet"}[kind] in lines["--data"]


def test_step_flags_need_steps_and_name_their_key(prompts, tmp_path, tiny_model_dir):
    r = invoke("--data", str(prompts), "--max-staleness", "1", "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2 and ("max_staleness (--max-staleness) applies to multi-step runs only; set steps (--steps) "
                                 "too, or over_provision (--over-provision)") in r.output
    assert "RolloutConfig" not in r.output   # the model's name means nothing on the command line
    r = invoke("--data", str(prompts), "--update", "staggered", "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2 and "update (--update) applies to multi-step runs only" in r.output
    r = invoke("--data", str(prompts), "--steps", "2", "--over-provision", "-1", "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2 and "over_provision" in r.output and "greater than or equal to 0" in r.output


def test_agent_flags_without_an_agent_are_an_error(prompts, tmp_path):
    """--max-turns / --turn-max-tokens / --agent-timeout on a single-turn run were ignored without a word."""
    r = invoke("--data", str(prompts), "--max-turns", "3", "--turn-max-tokens", "64", "--out",
               str(tmp_path / "o.parquet"))
    assert r.exit_code == 2, r.output
    assert "agent.max_turns (--max-turns), agent.turn_max_tokens (--turn-max-tokens): multi-turn settings" in r.output
    assert "pass --agent" in r.output and not (tmp_path / "o.parquet").exists()


def test_agent_keys_of_a_config_file_without_an_agent_are_an_error(prompts, tmp_path):
    """The agent keys of a config file (max_env_turns, max_tool_response_chars, ...) with no agent.function ran a
    single-turn rollout that ignored them without a word, as the flags once did."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text("agent: {max_env_turns: 2, max_tool_response_chars: 512, tool_response_truncate_side: left}\n")
    r = invoke("--config", str(cfg), "--data", str(prompts), "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2, r.output
    assert ("agent.max_env_turns, agent.max_tool_response_chars, agent.tool_response_truncate_side: multi-turn "
            "settings, and this run is single-turn (agent.function is unset)") in r.output
    assert not (tmp_path / "o.parquet").exists()


def test_num_speculative_tokens_without_speculation_is_an_error(prompts, tmp_path):
    """--num-speculative-tokens on a run with speculation off ran without drafting and without a word."""
    r = invoke("--data", str(prompts), "--num-speculative-tokens", "3", "--out", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2 and "--num-speculative-tokens" in r.output and "speculative decoding is off" in r.output
    assert "pass --speculative" in r.output and not (tmp_path / "o.parquet").exists()


# -- a second run on an output a run is writing ------------------------------------------------------------

HELD = {"entered": None, "release": None, "calls": 0}


def held_reward(text, ground_truth, **info):
    """The first call (the first run's first sample) waits until the test lets it go; the others return at once."""
    import threading

    HELD["calls"] += 1
    if HELD["calls"] == 1:
        assert isinstance(HELD["entered"], threading.Event) and isinstance(HELD["release"], threading.Event)
        HELD["entered"].set()
        HELD["release"].wait()
    return 1.0


def test_a_second_run_on_an_output_being_written_is_refused(prompts, tmp_path, tiny_model_dir):
    """A --resume started while the run is still going (a background job ignores Ctrl-C) used to run the same groups
    again beside it, both writing part files under the same numbers; it is refused, naming the running process, and
    the run it met finishes with every group once and leaves no lock behind."""
    import os
    import threading

    import pyarrow.parquet as pq

    from support import WAIT_S
    from pdsr_sdk.config import load_config
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.run import run_rollout

    cfg = tmp_path / "run.yaml"
    out = tmp_path / "o.parquet"
    cfg.write_text(json.dumps({
        "model": str(tiny_model_dir), "policy": "baseline", "sampling": {"n": 2, "max_tokens": 8},
        "batch_size": 1, "data": {"path": str(prompts)}, "reward": "test_rollout_cli:held_reward",
        "output": {"path": str(out)},
        "engines": [{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine", "max_model_len": 256}]}))
    HELD.update(entered=threading.Event(), release=threading.Event(), calls=0)
    first: dict = {}

    def run() -> None:
        try:
            first["summary"] = run_rollout(load_config(RolloutConfig, cfg))
        except BaseException as exc:  # noqa: BLE001 - reported below
            first["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert HELD["entered"].wait(WAIT_S), first
        second = CliRunner().invoke(cli, ["rollout", "--quiet", "--config", str(cfg), "--resume"])
    finally:
        HELD["release"].set()
        thread.join(WAIT_S)
    assert second.exit_code == 2, second.output
    assert f"{out}: another pdsr rollout is writing this output (process {os.getpid()}" in second.output
    assert "error" not in first and first["summary"].groups == 3
    rows = pq.read_table(out).to_pylist()
    assert (sorted((r["prompt_id"], r["sample_index"]) for r in rows)
            == [(f"q{i}", k) for i in range(3) for k in range(2)])
    assert not (tmp_path / "o.parquet.lock").exists() and not (tmp_path / "o.parquet.parts").exists()
