"""A ``--profile`` file (``pdsr simulate calibrate``'s output) read into the pools' profiles."""

from __future__ import annotations

import pytest

from pdsr_sdk.sim.config import SimulateConfig, load_profile_file


def test_a_file_of_one_pool_gives_it_to_both_pools(tmp_path):
    """Calibrated on a run of one engine, the file has only 'fast': the heavy engines took the illustrative GPU-like
    defaults beside the CPU's measured seconds (a run's bound 1.6 s against a 35 s makespan). Both pools get it."""
    path = tmp_path / "p.yaml"
    path.write_text("fast: {c0_s: 0.02, c1_s_per_seq: 0.001, max_num_seqs: 64}\n")
    pools = load_profile_file(path)
    assert pools == {"fast": {"c0_s": 0.02, "c1_s_per_seq": 0.001, "max_num_seqs": 64},
                     "heavy": {"c0_s": 0.02, "c1_s_per_seq": 0.001, "max_num_seqs": 64}}
    cfg = SimulateConfig(profiles=pools)
    assert cfg.profiles.heavy == cfg.profiles.fast and cfg.profiles.heavy.c0_s == pytest.approx(0.02)


def test_a_file_of_both_pools_keeps_each(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("fast: {c0_s: 0.02}\nheavy: {c0_s: 0.5}\n")
    cfg = SimulateConfig(profiles=load_profile_file(path))
    assert (cfg.profiles.fast.c0_s, cfg.profiles.heavy.c0_s) == (0.02, 0.5)
