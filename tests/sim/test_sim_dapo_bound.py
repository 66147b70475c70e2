"""The bound on a dynamic-sampling step's launches held to verl's DAPO trainer: verl raises only after its last
allowed generation batch is judged and still short of B passing groups. The reference: one generation batch of
M = ceil(max_launch_factor x B) prompts (max_num_gen_batches 1), which falls short iff fewer than B of the
first M groups pass."""

from __future__ import annotations

import math

import numpy as np

from pdsr_sdk.errors import RunError
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.steps import run_steps
from pdsr_sdk.traces import LengthTrace

B, FACTOR, GROUPS = 4, 3, 60


def test_the_run_ends_at_the_bound_only_when_the_groups_it_allows_cannot_bring_b():
    m = math.ceil(FACTOR * B)
    outcomes = set()
    for seed in range(12):
        rng = np.random.default_rng(seed)
        passes = rng.random(GROUPS) < 0.3
        rewards = np.array([[float(k) if passes[i] else 0.0 for k in range(2)] for i in range(GROUPS)])
        trace = LengthTrace.from_matrix(rng.integers(5, 200, size=(GROUPS, 2)), prompt_lens=np.full(GROUPS, 20),
                                        rewards=rewards, source="t.jsonl")
        cfg = SimulateConfig(policy="baseline", fast=2, heavy=0, steps=1, step_groups=B, max_staleness=0,
                             filter_groups={"kind": "zero-variance", "max_launch_factor": FACTOR})
        short = passes[:m].sum() < B   # verl's reference
        outcomes.add(bool(short))
        try:
            run = run_steps(trace, cfg, "baseline", None, keep_groups=True)
        except RunError as err:
            assert short, (seed, passes[:m].sum(), str(err))
            assert f"launched {m} groups" in str(err) and f"bounds a step at {m}" in str(err)
            continue
        assert not short, seed
        step = run.steps[0]
        assert step.launched <= m and step.groups == B
        assert all(passes[int(g.prompt_id[1:])] for g in run.groups)
    assert outcomes == {True, False}   # both sides of the bound were exercised
