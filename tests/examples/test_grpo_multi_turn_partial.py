"""examples/grpo_train.py --multi-turn --over-provision: two-turn samples carried across steps, their conversations
going on under newer weights, trained with the environment's tokens masked out."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support import ROOT, requires_torch, requires_vllm
from test_examples import _env

ARGS = ["--multi-turn", "--over-provision", "1", "--steps", "3", "--batch-size", "2", "--n", "4", "--max-tokens", "16"]


@requires_vllm
@requires_torch
@pytest.mark.vllm
@pytest.mark.slow
def test_multi_turn_partial_rollout_trains_and_counts_the_age_of_sampled_tokens():
    """--multi-turn with --over-provision was refused ("multi-turn samples do not carry across steps yet") though a
    session carries them; with it on, trained_token_age counted the environment's tokens (version -1), one version
    older than the trainer's weights even at the first step."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "grpo_train.py"), *ARGS], capture_output=True,
                         text=True, cwd=ROOT, env=_env(), timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    assert rows[0]["max_token_age"] == 0 and rows[0]["trained_token_age"] == 0
    for r in rows:
        assert r["turns_mean"] == 2 and r["env_tokens"] > 0 and r["samples"] == 8
        assert r["trained_token_age"] == r["max_token_age"] <= 1
        assert 0 < r["tis_weight"] <= 2
        gap = r["engine_trainer_logp_gap"]
        assert gap != gap or gap < 0.1   # NaN: a step whose every sampled token an older version sampled
