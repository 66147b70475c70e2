"""Neither ``mbs`` nor a token quota: a quota of DEFAULT_TOKEN_QUOTA, raised to the longest padded row.

One forward over a whole block of rows, padded to its longest, was the default before and was killed for memory
(24 GB) on a file of 2,000 rows of 1.2M tokens."""

from __future__ import annotations

import numpy as np
import pytest

from pdsr_sdk.scoring.buckets import round_up
from pdsr_sdk.scoring.config import DEFAULT_LENGTH_BUCKET, DEFAULT_TOKEN_QUOTA, ScoreOptions
from pdsr_sdk.scoring.torch_backend import plan_for


def _covers_once(plan, n):
    seen = sorted(i for mb in plan for i in mb.indices)
    return seen == list(range(n))


@pytest.mark.parametrize("packed", [False, True])
def test_default_plan_stays_within_the_quota(packed):
    lengths = np.random.default_rng(3).integers(50, 1500, 400)
    plan, mode = plan_for(lengths, ScoreOptions(), packed=packed)
    assert _covers_once(plan, len(lengths))
    assert len(plan) > 1 and all(mb.computed_tokens <= DEFAULT_TOKEN_QUOTA for mb in plan)
    assert mode.endswith(f"token quota {DEFAULT_TOKEN_QUOTA} (default)")
    # a quota given is used as given
    plan, mode = plan_for(lengths, ScoreOptions(max_tokens_per_micro_batch=4096), packed=packed)
    assert all(mb.computed_tokens <= 4096 for mb in plan) and "(default)" not in mode


@pytest.mark.parametrize("packed", [False, True])
def test_a_row_over_the_default_quota_gets_it_raised(packed):
    long_row = DEFAULT_TOKEN_QUOTA + 1000
    lengths = np.array([300, long_row, 200, 900])
    plan, mode = plan_for(lengths, ScoreOptions(), packed=packed)
    raised = long_row if packed else round_up(long_row, DEFAULT_LENGTH_BUCKET)
    assert _covers_once(plan, len(lengths))
    assert mode.endswith(f"token quota {raised} (default)")
    assert max(mb.computed_tokens for mb in plan) <= raised
    # the same row against a quota the user gave is an error naming the quota, as before
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch=16384"):
        plan_for(lengths, ScoreOptions(max_tokens_per_micro_batch=DEFAULT_TOKEN_QUOTA), packed=packed)


def test_default_quota_on_the_model_matches_naive(model):
    pytest.importorskip("torch")
    from tiny_scoring import naive_logps, random_samples

    from pdsr_sdk.scoring import per_token_logps

    prompts, completions = random_samples(5, 96, max_prompt=200, max_completion=400)
    res = per_token_logps(model, prompts, completions)
    assert res.stats.micro_batches > 1 and res.stats.mode == f"token quota {DEFAULT_TOKEN_QUOTA} (default)"
    naive = naive_logps(model, prompts, completions)
    # fp32, rows of up to 600
    assert max(float(np.abs(a - b).max()) for a, b in zip(res.logps, naive) if len(a)) <= 5e-5
