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
