"""`pdsr simulate calibrate` on simulated runs: the fit recovers the cost coefficients it ran with, the verify
price and acceptance of speculative decoding, and leaves out stalled spans and queue waits."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.sim.calibrate import calibrate
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import simulate, trajectories_table
from pdsr_sdk.traces import synth_trace


def test_calibrate_recovers_the_coefficients_of_a_simulated_run(tmp_path):
    truth = dict(c0_s=5e-3, c1_s_per_seq=4e-4, c2_s_per_token=2e-6, prefill_s_per_token=5e-5)
    heavy_truth = dict(c0_s=8e-3, c1_s_per_seq=1e-4, c2_s_per_token=5e-6, prefill_s_per_token=2e-5)
    trace = synth_trace(groups=48, n=8, seed=3, median_length=150, max_length=600)
    cfg = SimulateConfig(policy="baseline", fast=2, heavy=1, batch_size=24, timeline=False,
                         profiles={"fast": {"max_num_seqs": 16, "kv_cache_tokens": 1 << 20, **truth},
                                   "heavy": {"max_num_seqs": 16, "kv_cache_tokens": 1 << 20, **heavy_truth}})
    rep = simulate(trace, cfg, keep_groups=True)
    rows = counts_only(trajectories_table(rep.runs[0].groups).to_pylist())
    fits = calibrate([_write_trajectories(rows, tmp_path / "sim.parquet")])
    for pool, want in (("fast", truth), ("heavy", heavy_truth)):
        got = fits[pool].coefficients
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=0.05), (pool, key, got)
        assert fits[pool].r2 > 0.999


CAL_TRUTH = dict(c0_s=5e-3, c1_s_per_seq=4e-4, c2_s_per_token=2e-6, prefill_s_per_token=5e-5)


def _speculative_run(tmp_path, c2: float = 0.0, uncounted: int = 0):
    """A simulated baseline run whose engines draft while at most 6 of their 16 requests run, a verify step
    costing c0 + c1 R + c2 C + v x (drafted tokens it checks); with c2 = 0 the simulator's relative verify costs
    (given at every R) are exactly that. ``uncounted``: every so many spans lose their counts (as vLLM reports
    none for an aborted request). Returns (trajectories path, v, the speculation section)."""
    c0, c1, p, v = 5e-3, 4e-4, 5e-5, 2e-4
    spec = {"tokens_per_step": 1.6, "draft_load": 0.5, "max_batch": 6, "num_speculative_tokens": 4,
            "verify_cost": [(r, 1 + v * r * 4 / (c0 + c1 * r)) for r in range(1, 17)]}
    prof = dict(max_num_seqs=16, kv_cache_tokens=1 << 20, c0_s=c0, c1_s_per_seq=c1, c2_s_per_token=c2,
                prefill_s_per_token=p, speculation=spec)
    trace = synth_trace(groups=48, n=8, seed=3, median_length=150, max_length=600)
    cfg = SimulateConfig(policy="baseline", fast=2, heavy=1, batch_size=24, timeline=False,
                         profiles={"fast": prof, "heavy": prof})
    rows = counts_only(trajectories_table(simulate(trace, cfg, keep_groups=True).runs[0].groups).to_pylist())
    segs = [seg for row in rows for seg in row["segments"]]
    assert sum(seg["drafted_tokens"] > 0 for seg in segs) > 20 and any(seg["drafted_tokens"] == 0 for seg in segs)
    for seg in segs[::uncounted] if uncounted else ():
        seg["drafted_tokens"] = seg["accepted_tokens"] = None
    return _write_trajectories(rows, tmp_path / "spec.parquet"), v, spec


@pytest.mark.parametrize("uncounted, tol", [(0, 0.05), (10, 0.15)])   # (a tenth estimated from the run's mean)
def test_calibrate_fits_the_verify_cost_and_acceptance_of_a_run_with_speculation(tmp_path, uncounted, tol):
    """Each span's drafted and accepted tokens (the simulator reports them as vLLM does): a span took tokens -
    accepted steps, and a step pays for the drafted tokens it checks. The fit recovers that price, the plain
    coefficients, and the acceptance of the steps that drafted, also with some spans' counts missing."""
    path, v, spec = _speculative_run(tmp_path, uncounted=uncounted)
    fit = calibrate([path], per_pool=False, speculation_max_batch=6)["fast"]
    assert fit.verify_s_per_token == pytest.approx(v, rel=tol)
    for key in ("c0_s", "c1_s_per_seq", "prefill_s_per_token"):
        assert fit.coefficients[key] == pytest.approx(CAL_TRUTH[key], rel=0.1), (key, fit.coefficients)
    assert fit.coefficients["c2_s_per_token"] < 1e-8
    section = fit.speculation
    assert section["tokens_per_step"] == pytest.approx(1.6, rel=0.02)
    assert section["draft_load"] == pytest.approx(0.5, rel=0.02)
    assert section["max_batch"] == 6 and fit.outliers == 0
    truth = dict(spec["verify_cost"])
    for r, factor in section["verify_cost"]:   # at the run's mean context, which c2 = 0 leaves out
        if r in truth:
            assert factor - 1 == pytest.approx(truth[r] - 1, rel=tol + 0.02), (r, section["verify_cost"])
    # the section is a valid profile's, and a plain run's fit has none
    SimulateConfig(profiles={"fast": fit.profile()})
    assert calibrate([_write_trajectories(_simulated_trajectories(CAL_TRUTH), tmp_path / "plain.parquet")])[
        "fast"].speculation is None


def test_simulate_keeps_a_calibrated_verify_cost_beside_an_acceptance_file():
    from pdsr_cli.commands.simulate import with_profile_verify_cost

    accepted = {"tokens_per_step": 1.3, "draft_load": 0.1, "verify_cost": [(1, 1.08)], "max_batch": 32}
    fitted = {"speculation": {"verify_cost": [[1, 1.5], [8, 2.0]], "num_speculative_tokens": 3,
                              "tokens_per_step": 1.9}}
    assert with_profile_verify_cost(accepted, fitted) == {**accepted, "verify_cost": [[1, 1.5], [8, 2.0]],
                                                          "num_speculative_tokens": 3}
    assert with_profile_verify_cost(accepted, {"c0_s": 0.01}) == accepted


def _simulated_trajectories(coefficients: dict) -> list[dict]:
    """Trajectory rows of a baseline run on three simulated engines with these cost coefficients."""
    prof = {"max_num_seqs": 16, "kv_cache_tokens": 1 << 20, **coefficients}
    trace = synth_trace(groups=48, n=8, seed=3, median_length=150, max_length=600)
    cfg = SimulateConfig(policy="baseline", fast=2, heavy=1, batch_size=24, timeline=False,
                         profiles={"fast": prof, "heavy": prof})
    return counts_only(trajectories_table(simulate(trace, cfg, keep_groups=True).runs[0].groups).to_pylist())


def counts_only(rows: list[dict]) -> list[dict]:
    """Trajectory rows without first-token times, as engines that report counts only at a span's end record
    them: a span's duration then includes its prefill step, which lets the fit recover the prefill price."""
    for row in rows:
        for seg in row["segments"]:
            seg["first_token_time_s"] = None
    return rows


def _write_trajectories(rows: list[dict], path):
    import pyarrow as pa

    from pdsr_sdk.dispatch.trajectory import trajectory_schema

    pq.write_table(pa.Table.from_pylist(rows, schema=trajectory_schema()), path)
    return path


def test_calibrate_times_spans_from_their_first_token(tmp_path):
    # A real engine's span starts with a wait in the queue, then the prefill step samples
    # its first token. Add random waits before every simulated span and record its start
    # as the first token: the fit must not count the waits as decode time.
    rows = _simulated_trajectories(CAL_TRUTH)
    rng = np.random.default_rng(0)
    for row in rows:
        for seg in row["segments"]:
            seg["first_token_time_s"] = seg["submit_time_s"]
            seg["submit_time_s"] -= float(rng.uniform(0.0, 2.0))
    fit = calibrate([_write_trajectories(rows, tmp_path / "queued.parquet")])["fast"]
    truth = CAL_TRUTH
    for key in ("c0_s", "c1_s_per_seq", "c2_s_per_token"):   # one step per span is left out: a few % off
        assert fit.coefficients[key] == pytest.approx(truth[key], rel=0.1), (key, fit.coefficients)


def test_calibrate_leaves_out_stalled_segments(tmp_path):
    truth = CAL_TRUTH
    table = _simulated_trajectories(truth)
    # another fast engine stalled: four requests alone, one after another, each 20x slower than the model
    t = 0.0
    for k in range(4):
        row = dict(table[k])
        n, ctx = 50, row["prompt_length"]
        d = 20 * (n * (truth["c0_s"] + truth["c1_s_per_seq"]) + truth["c2_s_per_token"] * (n * ctx + n * (n - 1) / 2)
                  + truth["prefill_s_per_token"] * ctx)
        row["prompt_id"] = f"stall{k}"
        row["segments"] = [{**row["segments"][0], "engine": "fast-stalled", "pool": "fast", "start_token": 0,
                            "num_tokens": n, "submit_time_s": t, "end_time_s": t + d}]
        table.append(row)
        t += d
    fit = calibrate([_write_trajectories(table, tmp_path / "stalled.parquet")])["fast"]
    assert fit.outliers == 4
    for key, value in truth.items():
        assert fit.coefficients[key] == pytest.approx(value, rel=0.05), (key, fit.coefficients)


def test_cli_calibrates_a_run_with_speculation_and_simulates_with_it(tmp_path):
    import yaml

    path, v, _ = _speculative_run(tmp_path)
    out = tmp_path / "spec.yaml"
    r = CliRunner().invoke(cli, ["simulate", "calibrate", "--trajectories", str(path), "--out", str(out), "--shared",
                                 "--speculation-max-batch", "6"])
    assert r.exit_code == 0, r.output
    assert "verify_s_per_token" in r.output and "s per drafted token checked" in out.read_text()
    section = yaml.safe_load(out.read_text())["fast"]["speculation"]
    assert section["max_batch"] == 6 and section["tokens_per_step"] == pytest.approx(1.6, rel=0.02)
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(path), "--profile", str(out), "--policy", "baseline",
                                 "--fast", "2", "--heavy", "1", "--batch-size", "24", "--quiet"])
    assert r.exit_code == 0, r.output


def test_calibrate_leaves_the_verify_price_out_where_too_few_tokens_were_drafted(tmp_path):
    """Under 1% of the steps' worth of drafted tokens (a CPU run of the random tiny model drafted 30 in 110k
    steps) the timings cannot price a verify step: the plain fit, no speculation section."""
    rows = _simulated_trajectories(CAL_TRUTH)
    segs = [seg for row in rows for seg in row["segments"]]
    for seg in segs:
        seg["drafted_tokens"], seg["accepted_tokens"] = 0, 0
    segs[0]["drafted_tokens"] = 5
    fit = calibrate([_write_trajectories(rows, tmp_path / "few.parquet")])["fast"]
    assert fit.speculation is None and fit.verify_s_per_token is None
    for key, value in CAL_TRUTH.items():
        assert fit.coefficients[key] == pytest.approx(value, rel=0.05), (key, fit.coefficients)
