"""examples/grpo_train.py --multi-turn: GRPO on two-turn samples, the loss masked to the sampled tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import ROOT, requires_torch, requires_vllm

#: the tests' settings: the built-in tiny model, B=2 prompts x N=8 samples, two turns of 8 tokens each, lr 1e-2.
#: Measured 2026-11-27 (seed 0): reward mean 0.01 at step 0, 0.45 at step 4, 1.0 from step 7 (75 s on 2 loaded cores)
ARGS = ["--multi-turn", "--steps", "10", "--batch-size", "2", "--n", "8", "--max-tokens", "16", "--lr", "1e-2"]
#: sampling is not reproducible run to run (see GRPO_COMPARE_SEEDS in test_examples.py): a run that gains too
#: little is tried once more with another engine seed
SEEDS = ("0", "1")


def _run(seed: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "grpo_train.py"), *ARGS, "--seed", seed],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@requires_vllm
@requires_torch
@pytest.mark.vllm
@pytest.mark.slow
def test_grpo_learns_on_two_turn_samples_with_the_environments_tokens_masked():
    runs = {}
    for seed in SEEDS:
        rows = runs[seed] = _run(seed)
        assert [r["step"] for r in rows] == list(range(10))
        for r in rows:
            assert r["turns_mean"] == 2 and r["env_tokens"] > 0          # every sample took both turns
            assert 0 < r["response_len"] <= 16                           # sampled tokens only, two turns of 8
            # measured on sampled tokens only: the environment's have engine log-prob 0, and counting them
            # would put the gap near the trainer's mean log-prob (about 7 nats for the random model)
            assert r["engine_trainer_logp_gap"] < 0.1
        reward = [r["reward_mean"] for r in rows]
        if sum(reward[-3:]) / 3 - sum(reward[:3]) / 3 > 0.1:
            return
    pytest.fail(f"the reward did not rise by more than 0.1 with either seed: "
                f"{ {s: [r['reward_mean'] for r in rows] for s, rows in runs.items()} }")
