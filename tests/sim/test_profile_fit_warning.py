"""`pdsr simulate calibrate` says when a fit explains too little of the run's timings to simulate with: a smoke
run of bench/fidelity.py on a busy machine fitted R^2 -24 (177% median span error) and wrote the profile without
a word, and the simulation it then drove was off by 192%."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.dispatch.trajectory import trajectory_schema
from pdsr_sdk.sim.calibrate import MAX_MEDIAN_ERROR, MIN_R2, PoolFit, fit_warnings
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import simulate, trajectories_table
from pdsr_sdk.traces import synth_trace


def simulated_run(path, *, scramble: bool):
    """A baseline run's trajectories on three simulated engines; ``scramble``: every span's duration multiplied by
    a factor drawn from 0.2-5 (log-uniform), as timings disturbed by other work on the machine would be."""
    prof = {"max_num_seqs": 16, "kv_cache_tokens": 1 << 20, "c0_s": 5e-3, "c1_s_per_seq": 4e-4,
            "c2_s_per_token": 2e-6, "prefill_s_per_token": 5e-5}
    cfg = SimulateConfig(policy="baseline", fast=2, heavy=1, batch_size=24, timeline=False,
                         profiles={"fast": prof, "heavy": prof})
    trace = synth_trace(groups=48, n=4, seed=3, median_length=150, max_length=600)
    rows = trajectories_table(simulate(trace, cfg, keep_groups=True).runs[0].groups).to_pylist()
    rng = np.random.default_rng(0)
    for row in rows:
        for seg in row["segments"]:
            seg["first_token_time_s"] = None
            if scramble:
                seg["end_time_s"] = seg["submit_time_s"] + (seg["end_time_s"] - seg["submit_time_s"]) * float(
                    np.exp(rng.uniform(np.log(0.2), np.log(5.0))))
    pq.write_table(pa.Table.from_pylist(rows, schema=trajectory_schema()), path)
    return path


def calibrate_cli(tmp_path, trajectories):
    return CliRunner().invoke(cli, ["simulate", "calibrate", "--trajectories", str(trajectories),
                                    "--out", str(tmp_path / "profile.yaml")], catch_exceptions=False)


def test_a_clean_fit_is_written_without_a_warning(tmp_path):
    result = calibrate_cli(tmp_path, simulated_run(tmp_path / "clean.parquet", scramble=False))
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output and (tmp_path / "profile.yaml").exists()


def test_a_fit_of_disturbed_timings_is_written_with_a_warning_per_pool(tmp_path):
    result = calibrate_cli(tmp_path, simulated_run(tmp_path / "noisy.parquet", scramble=True))
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if line.startswith("warning: ")]
    assert [line.split(":")[1].strip() for line in warned] == ["fast", "heavy"]
    assert all("not a prediction" in line for line in warned) and (tmp_path / "profile.yaml").exists()


def test_the_thresholds_are_the_documented_ones():
    def fit(r2, err):
        return PoolFit(pool="fast", coefficients={}, spans=10, engines=1, r2=r2, median_rel_error=err)

    assert fit_warnings({"a": fit(MIN_R2, MAX_MEDIAN_ERROR)}) == []
    assert fit_warnings({"a": fit(float("nan"), 0.05)}) == []          # one span length only: R^2 undefined
    assert len(fit_warnings({"a": fit(MIN_R2 - 0.01, 0.05)})) == 1
    assert len(fit_warnings({"a": fit(0.95, MAX_MEDIAN_ERROR + 0.01)})) == 1
    assert (MIN_R2, MAX_MEDIAN_ERROR) == (0.5, 0.25)
