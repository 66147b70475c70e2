"""``pdsr rollout --agent ... --resume`` on the fake turn engine (tests/turn_fakes.py): a resumed multi-turn run keeps
its agent and its limits, so that one file never mixes single-turn rows into a multi-turn run."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import requires_torch

AGENT = "test_agent_session:tool_agent"   # two model turns, a tool's result between them


def rollout(tiny_model_dir, tmp_path: Path, *flags: str, agent: dict | None = None):
    """``pdsr rollout`` of the first 4 sample prompts, 2 a batch, 2 samples each (``agent``: the config's agent
    settings): the CLI's result."""
    import yaml
    from click.testing import CliRunner

    from pdsr_cli.main import cli

    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"model": str(tiny_model_dir), **({"agent": agent} if agent else {}), "engines": [
        {"name": "f0", "pool": "fast", "backend": "turn_fakes:TurnEngine", "max_model_len": 512, "max_num_seqs": 4}]}))
    return CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--batch-size", "2", "--limit", "4", "--n", "2",
                                    "--max-tokens", "200", "--out", str(tmp_path / "mt.parquet"), "--quiet", *flags])


@requires_torch
@pytest.mark.parametrize("flags, key", [((), "agent.function (--agent) is None now but was "
                                             "'test_agent_session:tool_agent'"),
                                        (("--agent", AGENT, "--max-turns", "3"),
                                         "agent.max_turns (--max-turns) is 3 now but was 8"),
                                        (("--agent", AGENT, "--turn-max-tokens", "4"),
                                         "agent.turn_max_tokens (--turn-max-tokens) is 4 now but was None")])
def test_a_resume_with_another_agent_or_its_limits_is_refused(tiny_model_dir, tmp_path, flags, key):
    """A multi-turn run resumed without --agent wrote single-turn rows (no turns, no mask) into the multi-turn
    run's file, and one resumed with other turn limits mixed two sampling setups, without a word: the agent's
    settings were not among those a resume compares."""
    first = rollout(tiny_model_dir, tmp_path, "--agent", AGENT, "--num-batches", "1")
    assert first.exit_code == 0, first.output
    again = rollout(tiny_model_dir, tmp_path, "--resume", *flags)
    assert again.exit_code != 0 and key in again.output, again.output
    assert "Traceback" not in again.output


@requires_torch
@pytest.mark.parametrize("agent, key", [
    ({"max_env_turns": 2}, "agent.max_env_turns (agent.max_env_turns) is 2 now but was None"),
    ({"max_tool_response_chars": 64}, "agent.max_tool_response_chars (agent.max_tool_response_chars) is 64 now but "
                                      "was None"),
    ({"tool_response_truncate_side": "left"}, "agent.tool_response_truncate_side (agent.tool_response_truncate_side) "
                                              "is 'left' now but was 'middle'")])
def test_a_resume_with_other_environment_limits_is_refused(tiny_model_dir, tmp_path, agent, key):
    """What the environment may append (its turns, a tool message's length) shapes a trajectory as the turn limits
    do: a resume with other values would mix two setups in one run."""
    first = rollout(tiny_model_dir, tmp_path, "--agent", AGENT, "--num-batches", "1")
    assert first.exit_code == 0, first.output
    again = rollout(tiny_model_dir, tmp_path, "--resume", "--agent", AGENT, agent=agent)
    assert again.exit_code != 0 and key in again.output, again.output
    assert "Traceback" not in again.output


@requires_torch
def test_a_resumed_agent_run_writes_multi_turn_rows_for_the_batches_left(tiny_model_dir, tmp_path):
    import pyarrow.parquet as pq

    first = rollout(tiny_model_dir, tmp_path, "--agent", AGENT, "--num-batches", "1")
    assert first.exit_code == 0, first.output
    again = rollout(tiny_model_dir, tmp_path, "--resume", "--agent", AGENT)
    assert again.exit_code == 0, again.output
    rows = pq.read_table(tmp_path / "mt.parquet").to_pylist()
    assert sorted((r["prompt_id"], r["sample_index"]) for r in rows) == [
        (f"sample-{i:03d}", k) for i in range(4) for k in range(2)]
    assert {r["prompt_id"]: r["batch_index"] for r in rows} == {
        "sample-000": 0, "sample-001": 0, "sample-002": 1, "sample-003": 1}
    for r in rows:   # tool_agent's rows: two model turns around a tool's result, its reward 0.5 + sample index
        assert [t["role"] for t in r["turns"]] == ["assistant", "environment", "assistant"]
        assert r["turns"][1]["tool_name"] == "calc" and r["reward"] == 0.5 + r["sample_index"]
        assert len(r["response_mask"]) == r["response_length"] and 0 in r["response_mask"]


@requires_torch
def test_a_single_turn_run_that_recorded_agent_limits_resumes_without_them(tiny_model_dir, tmp_path):
    """A single-turn run made while agent limits without an agent were ignored recorded them (agent.max_turns: 3);
    now they are an error, and left out, a resume compares no agent limit of a single-turn run, so it goes on."""
    import json

    import pyarrow.parquet as pq

    from pdsr_sdk.rollout.resume import METADATA_KEY

    first = rollout(tiny_model_dir, tmp_path, "--num-batches", "1")
    assert first.exit_code == 0, first.output
    out = tmp_path / "mt.parquet"
    table = pq.read_table(out)
    meta = dict(table.schema.metadata)
    settings = json.loads(meta[METADATA_KEY.encode()])
    assert "agent.max_turns" not in settings and settings["agent.function"] is None
    meta[METADATA_KEY.encode()] = json.dumps({**settings, "agent.max_turns": 3}).encode()
    pq.write_table(table.replace_schema_metadata(meta), out)
    again = rollout(tiny_model_dir, tmp_path, "--resume", agent={"max_turns": 3})
    assert again.exit_code == 2 and "agent.max_turns (--max-turns): multi-turn settings" in again.output, again.output
    again = rollout(tiny_model_dir, tmp_path, "--resume")
    assert again.exit_code == 0, again.output
    assert pq.read_table(out).num_rows == 8 and set(pq.read_table(out).column("batch_index").to_pylist()) == {0, 1}
