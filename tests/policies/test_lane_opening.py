"""v3's tail lane opens only at the first runaway restarted for staleness (:mod:`pdsr_sdk.policies.v3.lane`).

Before, the lane was on from a bounded stream's start, empty (only restarted runaways go there until the verdict),
and it stopped migration moving the tail: on a KV-bound long-reasoning stream where nothing outlives the bound, a
little over-provision then ran slower than none (issue 48; docs/notes/partial-rollout.md)."""

from __future__ import annotations

import pytest

from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.steps import run_steps
from pdsr_sdk.traces import synth_trace

#: longcot's shape, scaled down: wide spread, a few runaways to the cap, more KV demand than cache
PROFILE = dict(max_num_seqs=32, kv_cache_tokens=4096, block_size=16)


def _longcot(seed: int):
    return synth_trace(groups=200, n=8, seed=seed, median_length=250, max_length=2048, prompt_sigma=0.6,
                       noise_sigma=0.4, runaway_frac=0.044, runaway_concentration=10, prompt_len_min=20,
                       prompt_len_max=100)


def _stream(seed: int, f: float):
    cfg = SimulateConfig(policy="v3", fast=3, heavy=1, steps=6, step_groups=16, max_staleness=2, kv_on_update="keep",
                         timeline=False, profiles={"fast": PROFILE, "heavy": PROFILE})
    return run_steps(_longcot(seed), cfg, "v3", f)


@pytest.mark.parametrize("seed", [2, 3])   # with the lane open from the start: F = 0.1 2% and 9% slower than F = 0
def test_a_little_over_provision_is_no_slower_than_none_on_a_kv_bound_stream(seed):
    none, little = _stream(seed, 0.0), _stream(seed, 0.1)
    assert little.stats["restarts"] == 0                      # nothing outlived the bound: the lane stays shut
    assert not little.policy_facts["tail_lane"] and little.stats["moves"] > 0   # and the tail moves
    assert little.steady_step_s <= none.steady_step_s
