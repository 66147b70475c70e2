"""A rollout run's summary records the settings its policy ran with (fake engines, no vLLM)."""

from __future__ import annotations

import json

from pdsr_sdk.policies.resolve import resolve_policy
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.run import run_rollout


def test_the_summary_holds_the_policys_resolved_settings(tmp_path, tiny_model_dir):
    """Its defaults under the built-in preset's and the config's values: what an A/B comparison needs."""
    given = {"disable": ["migration"], "ranking": {"min_correlation": 0.25}}
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", policy_settings={"v3": given}, batch_size=2,
                        sampling={"n": 2, "max_tokens": 4}, data={"limit": 2},
                        engines=[{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine", "max_model_len": 256}],
                        output={"path": tmp_path / "o.parquet"})
    summary = run_rollout(cfg)
    expected = resolve_policy("v3", given)[1].model_dump(mode="json")
    assert summary.policy_settings == expected
    assert "migration" in expected["disable"] and expected["ranking"]["min_correlation"] == 0.25
    assert json.loads((tmp_path / "o.summary.json").read_text())["policy_settings"] == expected


def test_a_step_that_ended_at_once_has_no_tokens_per_second_before_a_resume_or_after():
    """A --steps run's step whose groups were complete when it began (they finished while the step before stopped
    the engines) spans microseconds: its summary row said makespan_s 0 and tokens_per_s 209,119,210 (720 tokens
    over 3.4 us), and after a --resume, which recomputes the rate from the rounded makespan, 0.0. Both are 0.0 now;
    a step of a second keeps its rate."""
    from pdsr_sdk.dispatch.run import BatchReport
    from pdsr_sdk.rollout.resume import merged_batches

    def report(span):
        return BatchReport(batch_index=1, groups=[], start_s=10.0, end_s=10.0 + span, makespan_s=span, tokens=720,
                           engine_busy_s={}, stats={})

    assert report(3.4e-6).tokens_per_s == 0.0 and report(2.0).tokens_per_s == 360.0
    for span in (3.4e-6, 2.0):
        row = {"batch_index": 1, "groups": 2, "tokens": 720, "makespan_s": round(span, 4),
               "tokens_per_s": round(report(span).tokens_per_s, 2)}
        resumed = merged_batches([row], [{**row, "groups": 0, "tokens": 0, "makespan_s": 0.0}])
        assert resumed[0]["tokens_per_s"] == row["tokens_per_s"]
