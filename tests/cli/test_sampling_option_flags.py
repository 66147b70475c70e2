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
