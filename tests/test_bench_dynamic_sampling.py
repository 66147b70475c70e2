"""bench/dynamic_sampling.py: the recipe's generation batches a step, over the same steps as the step times (its bad
flags: tests/test_bench_real_args.py)."""

from __future__ import annotations

import sys

import pytest

from support import load_bench


@pytest.mark.parametrize("steps", [3, 5])
def test_generation_batches_are_the_mean_over_the_steady_steps(steps, monkeypatch, capsys):
    """The column averaged steps 3 to K-1 by slicing, so at K < 4 (where the step times average every step) it read
    0.00 batches a step; it is the mean of the recipe's plan over the window the step times use."""
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.steps_baseline import DAPO_GEN_FACTOR, dapo_plan

    ds = load_bench("dynamic_sampling")
    monkeypatch.setattr(sys, "argv", ["dynamic_sampling.py", "--b", "8", "--steps", str(steps), "--solve", "0.1"])
    ds.main()
    lines = capsys.readouterr().out.splitlines()
    row = dict(zip(lines[1].split(" | "), lines[2].split(" | ")))
    cfg = SimulateConfig(policy="v3", steps=steps, step_groups=8, batch_size=8, max_staleness=0, timeline=False,
                         filter_groups={"kind": "zero-variance"})
    plan = dapo_plan(ds.gsm8k_trace(8 * DAPO_GEN_FACTOR * 10 * steps, 0.1, 1), cfg)
    window = plan if steps < 4 else plan[2:steps - 1]
    assert float(row["dapo_gen_batches"]) == pytest.approx(sum(window) / len(window), abs=0.005)
    assert float(row["dapo_gen_batches"]) >= 1   # every step generates at least one batch
