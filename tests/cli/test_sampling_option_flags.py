"""`pdsr rollout`'s flags for the sampling options verl and vLLM users set (--stop-token-id, ...): each becomes the
run's setting, and a resumed run is held to it, naming the flag (fake engines, no vLLM)."""

from __future__ import annotations

from cli_checks import failed, invoke


def test_stop_token_id_flags_are_the_runs_settings(prompts, tmp_path, fake_run):
    out = tmp_path / "o.parquet"
    run = [*fake_run, "--data", prompts, "--out", out, "--batch-size", 2]
    first = invoke(*run, "--num-batches", 1, "--stop-token-id", 7, "--stop-token-id", 11)
    assert first.exit_code == 0, first.output
    failed(invoke(*run, "--resume", "--stop-token-id", 7),
           "sampling.stop_token_ids (--stop-token-id) is [7] now but was [7, 11]")
    resumed = invoke(*run, "--resume", "--stop-token-id", 7, "--stop-token-id", 11)
    assert resumed.exit_code == 0, resumed.output
    failed(invoke(*fake_run, "--data", prompts, "--out", tmp_path / "p.parquet", "--stop-token-id", -1),
           "sampling.stop_token_ids", "a token id is 0 or more")


def test_min_p_and_penalty_flags_are_the_runs_settings(prompts, tmp_path, fake_run):
    out = tmp_path / "o.parquet"
    run = [*fake_run, "--data", prompts, "--out", out, "--batch-size", 2, "--no-segments"]
    flags = ["--min-p", 0.05, "--repetition-penalty", 1.1, "--presence-penalty", 0.5, "--frequency-penalty", 0.25]
    assert invoke(*run, "--num-batches", 1, *flags).exit_code == 0
    for i, (flag, key) in enumerate([("--min-p", "min_p"), ("--repetition-penalty", "repetition_penalty"),
                                     ("--presence-penalty", "presence_penalty"),
                                     ("--frequency-penalty", "frequency_penalty")]):
        other = [*flags[:2 * i], flags[2 * i], 0.0 if key != "repetition_penalty" else 1.0, *flags[2 * i + 2:]]
        failed(invoke(*run, "--resume", *other), f"sampling.{key} ({flag}) is")
    resumed = invoke(*run, "--resume", *flags)
    assert resumed.exit_code == 0, resumed.output
    # vLLM counts these over a request's own output only: segments would restart them
    failed(invoke(*fake_run, "--data", prompts, "--out", tmp_path / "p.parquet", "--presence-penalty", 0.5),
           "sampling.presence_penalty", "segments.enabled")
    failed(invoke(*fake_run, "--data", prompts, "--out", tmp_path / "q.parquet", "--frequency-penalty", 3),
           "sampling.frequency_penalty")


def test_output_penalties_are_refused_with_steps_and_agents_naming_why():
    import pytest

    from pdsr_sdk.rollout.config import RolloutConfig

    one_request = {"segments": {"enabled": False}, "sampling": {"frequency_penalty": 0.5}}
    RolloutConfig(**one_request)
    with pytest.raises(ValueError, match=r"sampling\.frequency_penalty need each sample in one vLLM request.*steps"):
        RolloutConfig(**one_request, steps=2)
    with pytest.raises(ValueError, match=r"agent \(each model turn is a new request\)"):
        RolloutConfig(**one_request, agent={"function": "examples.agent_tools:run"})
