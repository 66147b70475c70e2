"""`pdsr rollout --top-k` and `--stop` (repeatable) reach the run's sampling settings: a resumed run is held to
them, naming the flag, as to the other sampling flags (fake engines, no vLLM)."""

from __future__ import annotations

from cli_checks import failed, invoke


def test_top_k_and_stop_flags_are_the_runs_settings(prompts, tmp_path, fake_run):
    out = tmp_path / "o.parquet"
    run = [*fake_run, "--data", prompts, "--out", out, "--batch-size", 2]
    first = invoke(*run, "--num-batches", 1, "--top-k", 5, "--stop", "</answer>", "--stop", "END")
    assert first.exit_code == 0, first.output
    failed(invoke(*run, "--resume", "--top-k", 5, "--stop", "</answer>"),
           "sampling.stop (--stop) is ['</answer>'] now but was ['</answer>', 'END']")
    failed(invoke(*run, "--resume", "--top-k", 7, "--stop", "</answer>", "--stop", "END"),
           "sampling.top_k (--top-k) is 7 now but was 5")
    resumed = invoke(*run, "--resume", "--top-k", 5, "--stop", "</answer>", "--stop", "END")
    assert resumed.exit_code == 0, resumed.output
    # no --stop: the config's (none here) is kept, not replaced by an empty list
    assert invoke(*fake_run, "--data", prompts, "--out", tmp_path / "p.parquet", "--batch-size", 2,
                  "--num-batches", 1).exit_code == 0
