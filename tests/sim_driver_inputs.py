"""Shared by the simulate driver's and CLI tests (tests/sim/test_sim_driver.py, test_sim_cli.py): a short
synthetic trace with a few runaways."""

from __future__ import annotations

from pdsr_sdk.traces import synth_trace


def small_trace(groups=24, n=4, seed=1, max_length=700):
    return synth_trace(groups=groups, n=n, seed=seed, median_length=120, max_length=max_length,
                       runaway_frac=0.02, prompt_len_min=5, prompt_len_max=200)
