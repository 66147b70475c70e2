"""`pdsr simulate` end to end: every policy on simulated engines, the report's numbers, calibration, CLI."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdsr_cli.main import cli
from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.engines import ENGINE_BACKENDS, build_engine
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import EngineSpec
from pdsr_sdk.sim.calibrate import calibrate
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import simulate, trajectories_table
from pdsr_sdk.traces import LengthTrace, read_trace, synth_trace, write_trace_jsonl

SMALL = dict(max_num_seqs=6, kv_cache_tokens=2048, block_size=16)


def small_trace(groups=24, n=4, seed=1, max_length=700):
    return synth_trace(groups=groups, n=n, seed=seed, median_length=120, max_length=max_length,
                       runaway_frac=0.02, prompt_len_min=5, prompt_len_max=200)


def check_run(run, trace, cfg, *, truncate_at=None):
    lengths = {(pid, k): int(x) for g, pid in enumerate(trace.prompt_ids)
               for k, x in enumerate(trace.lengths[trace.offsets[g]:trace.offsets[g + 1]])}
    seen = set()
    for g in run.groups:
        for s in g.samples:
            seen.add((g.prompt_id, s.index))
            want = max(1, lengths[(g.prompt_id, s.index)])
            if s.finish_reason == "truncated":
                assert truncate_at is not None and s.num_generated == truncate_at < want
            else:
                assert s.num_generated == want, s.key
            assert sum(seg.num_tokens for seg in s.segments) - s.wasted_tokens == s.num_generated
            # a sample runs in one place at a time
            spans = sorted((seg.submit_time_s, seg.end_time_s) for seg in s.segments)
            assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:])), s.key
    assert seen == set(lengths)
    for b in run.batches:
        assert b.lower_bound_s <= b.makespan_s * (1 + 1e-9)
    for e in run.engines:
        assert max(e.occupancy_n) <= e.max_concurrency


@pytest.mark.parametrize("policy", ["baseline", "v1", "v2", "v2.5", "v2.5-restart", "lpt", "oracle", "oracle-probe"])
def test_every_policy_finishes_every_sample_with_exact_lengths(policy):
    trace = small_trace()
    cfg = SimulateConfig(policy=policy, fast=2, heavy=1, batch_size=8, timeline=False,
                         profiles={"fast": SMALL, "heavy": {**SMALL, "kv_cache_tokens": 4096}},
                         segments={"min_tokens": 16, "max_tokens": 128})
    rep = simulate(trace, cfg, keep_groups=True)
    (run,) = rep.runs
    check_run(run, trace, cfg, truncate_at=run.settings.get("fast_max_tokens"))
    assert len(run.batches) == 3
    s = rep.policy_summary(run)
    assert s["makespan_s"] == pytest.approx(sum(b.makespan_s for b in run.batches))
    assert 1.0 <= s["ratio"] < 10
    assert 0 < s["utilisation"]["fast"] <= 1 + 1e-9 and 0 <= s["utilisation"]["heavy"] <= 1 + 1e-9
    assert s["tokens"] == sum(smp.num_generated for g in run.groups for smp in g.samples)
    if policy not in ("baseline", "oracle", "oracle-probe"):
        assert s["probes"] == 24
    if policy == "v2.5-restart":
        assert s["restarts"] == s["breaks"] > 0 and s["wasted_tokens"] > 0


def test_small_kv_budget_preempts_and_still_finishes_exactly():
    trace = small_trace(groups=16, seed=4)
    cfg = SimulateConfig(policy="baseline", fast=1, heavy=1, batch_size=16, timeline=False,
                         profiles={"fast": {**SMALL, "kv_cache_tokens": 1024},
                                   "heavy": {**SMALL, "kv_cache_tokens": 1024}})
    rep = simulate(trace, cfg, keep_groups=True)
    check_run(rep.runs[0], trace, cfg)
    assert rep.policy_summary(rep.runs[0])["preemptions"] > 0


def test_report_numbers_on_a_hand_made_case():
    # one engine, one group of two samples (prompt 10; lengths 3 and 5), both admitted at t = 0
    c0, c1, c2, p = 0.01, 0.001, 1e-4, 2e-4
    trace = LengthTrace.from_matrix(np.array([[3, 5]]), prompt_lens=[10])
    prof = dict(max_num_seqs=4, c0_s=c0, c1_s_per_seq=c1, c2_s_per_token=c2, prefill_s_per_token=p)
    cfg = SimulateConfig(policy="baseline", fast=1, heavy=0, batch_size=1, timeline=False, tail_fraction=0.5,
                         profiles={"fast": prof})
    rep = simulate(trace, cfg)
    s = rep.to_dict()["policies"][0]
    # 3 steps with both (contexts 10 + j each; the first step also prefills 20 prompt tokens), then 2 alone
    t_a = 20 * p + sum(c0 + 2 * c1 + c2 * 2 * (10 + j) for j in range(3))
    makespan = t_a + sum(c0 + c1 + c2 * (13 + j) for j in range(2))
    assert s["makespan_s"] == pytest.approx(makespan, rel=1e-12)
    assert s["tokens"] == 8 and s["tokens_per_s"] == pytest.approx(8 / makespan)
    assert s["utilisation"] == {"fast": pytest.approx(1.0)}
    assert s["tail_share"] == pytest.approx((makespan - t_a) / makespan)   # 1 of 2 samples = the last 50%
    work = sum(p * 10 + n * (c0 / 4 + c1) + c2 * (n * 10 + n * (n - 1) / 2) for n in (3, 5))
    alone = p * 10 + 5 * (c0 + c1) + c2 * (5 * 10 + 10)
    assert s["lower_bound_s"] == pytest.approx(max(work, alone), rel=1e-12)
    assert s["ratio"] == pytest.approx(makespan / max(work, alone))
    assert s["prefill_tokens"] == 20 and s["preemptions"] == 0


def test_lower_bound_counts_a_prompt_its_group_shares_once():
    """With the prompt cache, four samples of one 1,600-token prompt on one engine prefill it once (and
    the last block each: vLLM computes at least one token); the bound charges the same, never more
    than the run took. Without the cache each pays the whole prompt."""
    c0, c1, c2, p = 5e-3, 5e-5, 1e-7, 1e-3
    trace = LengthTrace.from_matrix(np.array([[1, 1, 1, 1]]), prompt_lens=[1600])
    for cache, prefilled in ((True, 1600 + 3 * 16), (False, 4 * 1600)):
        prof = dict(prefill_s_per_token=p, prompt_cache=cache)
        cfg = SimulateConfig(policy="baseline", fast=1, heavy=0, batch_size=1, timeline=False,
                             profiles={"fast": prof})
        s = simulate(trace, cfg).to_dict()["policies"][0]
        assert s["prefill_tokens"] == prefilled
        work = p * prefilled + 4 * (c0 / 256 + c1 + c2 * 1600)
        assert s["lower_bound_s"] == pytest.approx(work, rel=1e-12)
        assert s["lower_bound_s"] <= s["makespan_s"]


def test_least_prefill_counts_a_shared_prompt_once_together_and_at_its_cached_tail_alone():
    from pdsr_sdk.sim.bounds import least_prefill_tokens

    plen, pids = [40, 40, 40, 7], ["a", "a", "a", "b"]
    cached = SimulateConfig(fast=1, heavy=0)                                      # block 16
    assert least_prefill_tokens(plen, pids, cached).tolist() == [40, 8, 8, 7]     # 40 - 16 x 2
    # alone, any sample of "a" may be the one that came first: each may pay only the tail; "b" pays whole
    assert least_prefill_tokens(plen, pids, cached, each=True).tolist() == [8, 8, 8, 7]
    plain = SimulateConfig(fast=1, heavy=0, profiles={"fast": {"prompt_cache": False}})
    assert least_prefill_tokens(plen, pids, plain).tolist() == plen
    assert least_prefill_tokens(plen, pids, plain, each=True).tolist() == plen


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(["baseline", "v1", "v2", "v2.5", "v3", "oracle",
                                                            "oracle-probe"]),
       fast=st.integers(1, 3), heavy=st.integers(1, 2), kv=st.sampled_from([1024, 2048, 1 << 20]),
       seqs=st.integers(1, 8), batch=st.integers(1, 10), c2=st.sampled_from([0.0, 1e-7, 1e-5]),
       prefill=st.sampled_from([2e-5, 2e-3]))
def test_lower_bound_never_exceeds_the_makespan(seed, policy, fast, heavy, kv, seqs, batch, c2, prefill):
    trace = synth_trace(groups=10, n=3, seed=seed, median_length=60, max_length=500, runaway_frac=0.05,
                        prompt_len_min=0, prompt_len_max=300, min_length=0)
    prof = dict(max_num_seqs=seqs, kv_cache_tokens=kv, c2_s_per_token=c2, prefill_s_per_token=prefill)
    cfg = SimulateConfig(policy=policy, fast=fast, heavy=heavy, batch_size=batch, timeline=False,
                         profiles={"fast": prof, "heavy": {**prof, "max_num_seqs": seqs + 2, "c0_s": 0.004}},
                         segments={"min_tokens": 8, "max_tokens": 64})
    rep = simulate(trace, cfg, keep_groups=True)
    (run,) = rep.runs
    assert run.lower_bound_s <= run.makespan_s * (1 + 1e-9)
    check_run(run, trace, cfg, truncate_at=run.settings.get("fast_max_tokens"))


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


def test_sim_backend_builds_from_an_engine_spec():
    assert ENGINE_BACKENDS.get("sim").__name__ == "SimEngine"
    spec = EngineSpec(name="h0", pool="heavy", backend="sim", max_num_seqs=12, segment_capacity_tokens=512,
                      engine_args={"c0_s": 0.02})
    e = build_engine(spec, clock=VirtualClock(), model="unused")
    assert (e.name, e.pool, e.max_concurrency, e.segment_capacity_tokens) == ("h0", "heavy", 12, 512)
    assert e.profile.c0_s == 0.02 and e.profile.kv_cache_tokens == 262144   # the heavy default (= fast's)
    with pytest.raises(ConfigError, match=r"engines\[h0\]\.engine_args.*c9"):
        build_engine(spec.model_copy(update={"engine_args": {"c9": 1}}), clock=VirtualClock())


def test_partial_profiles_keep_their_pools_defaults():
    cfg = SimulateConfig(profiles={"heavy": {"c0_s": 0.02}})
    assert cfg.profiles.heavy.max_num_seqs == 256 and cfg.profiles.heavy.c0_s == 0.02
    assert cfg.profiles.fast.max_num_seqs == 256


def test_default_engines_are_equal_heavy_is_a_role():
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.layout import engine_layout
    from pdsr_sdk.sim.config import default_profile

    assert default_profile("heavy") == default_profile("fast") == SimulateConfig().profiles.heavy
    assert SimulateConfig().profiles.fast == SimulateConfig().profiles.heavy
    assert (default_profile("heavy").max_num_seqs, default_profile("heavy").kv_cache_tokens) == (256, 262144)
    # a profile may still make them differ
    cfg = SimulateConfig(profiles={"heavy": {"max_num_seqs": 64}})
    assert cfg.profiles.heavy.max_num_seqs == 64 and cfg.profiles.heavy.kv_cache_tokens == 262144
    # real engines: the automatic layout starts fast and heavy engines with the same settings
    fast, heavy = engine_layout(RolloutConfig(), required_pools=("fast", "heavy"), cpu=True, max_model_len=512)
    assert (fast.pool, heavy.pool) == ("fast", "heavy")
    same = {k: v for k, v in heavy.model_dump().items() if k not in ("name", "pool", "devices")}
    assert same == {k: v for k, v in fast.model_dump().items() if k not in ("name", "pool", "devices")}
    # an explicit engine_defaults change applies to both
    cfg = RolloutConfig(engine_defaults={"max_num_seqs": 32})
    assert [s.max_num_seqs for s in engine_layout(cfg, required_pools=("fast", "heavy"), cpu=True,
                                                  max_model_len=512)] == [32, 32]


# -- CLI --------------------------------------------------------------------------------

def test_cli_round_trip_writes_json_and_png_and_calibrates(tmp_path):
    trace_path = write_trace_jsonl(small_trace(groups=16), tmp_path / "t.jsonl")
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(trace_path), "--policy", "all", "--fast", "2",
                                 "--heavy", "1", "--batch-size", "8", "--out-dir", str(out), "--quiet",
                                 "--set", "cap_multiplier=2.0"])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "simulate.json").read_text())
    # every registered policy for real engines, then the simulator-only references (on by default)
    assert [p["policy"] for p in report["policies"]] == ["baseline", "lpt", "v1", "v2", "v2.5", "v3", "oracle",
                                                         "oracle-probe"]
    assert report["policies"][4]["settings"]["cap_multiplier"] == 2.0
    assert report["trace"]["samples"] == 64 and report["trace"]["batches"] == 2
    for p in report["policies"]:
        assert p["lower_bound_s"] <= p["makespan_s"]
        assert p["ratio"] == pytest.approx(p["makespan_s"] / p["lower_bound_s"])
        assert f"{p['makespan_s']:.4g}" in r.output
    png = out / "timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and report["timelines"] == [str(png)]

    # calibrate from a simulated "run", then simulate with the fitted profile
    rep = simulate(small_trace(groups=16), SimulateConfig(policy="baseline", fast=1, heavy=1, batch_size=16,
                                                          timeline=False), keep_groups=True)
    traj = tmp_path / "run.parquet"
    pq.write_table(trajectories_table(rep.runs[0].groups), traj)
    r = CliRunner().invoke(cli, ["simulate", "calibrate", "--trajectories", str(traj), "--out",
                                 str(tmp_path / "p.yaml")])
    assert r.exit_code == 0, r.output
    assert "fast" in r.output and "heavy" in r.output
    # an existing --out needs --overwrite (or overwrite: true); an input as --out is always an error
    for args, needle in ((["--out", tmp_path / "p.yaml"], "p.yaml: already exists; pass --overwrite (overwrite: true)"),
                         (["--out", traj, "--overwrite"], f"--out (out) and --trajectories are the same file {traj}")):
        r = CliRunner().invoke(cli, ["simulate", "calibrate", "--trajectories", str(traj), *map(str, args)])
        assert r.exit_code == 2 and needle in r.output, r.output
    assert pq.read_table(traj).num_rows == 64
    r = CliRunner().invoke(cli, ["simulate", "calibrate", "--trajectories", str(traj), "--out",
                                 str(tmp_path / "p.yaml"), "--overwrite"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(traj), "--profile", str(tmp_path / "p.yaml"),
                                 "--policy", "baseline", "--fast", "1", "--heavy", "1", "--batch-size", "16",
                                 "--quiet"])
    assert r.exit_code == 0, r.output
    # the fitted profile reproduces the run it was fitted on
    sim = float(r.output.splitlines()[3].split()[1])
    assert sim == pytest.approx(rep.runs[0].makespan_s, rel=0.02)


def test_cli_without_a_trace_runs_the_built_in_one(tmp_path, monkeypatch):
    """No --trace: the `pdsr trace synth` defaults, written once to pdsr's cache with the groups the run
    needs (at least 1,024, in 512s), then read from there."""
    monkeypatch.setenv("PDSR_CACHE_DIR", str(tmp_path))
    args = ["simulate", "--policy", "baseline,v3", "--no-references", "--batch-size", "64", "--num-batches", "2",
            "--fast", "2", "--heavy", "1", "--quiet"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    path = tmp_path / "data" / "synth_1024x8_seed0.jsonl"
    assert f"{path}: 128 groups, 1024 samples in 2 batch(es) of 64 prompts" in r.output
    built = read_trace(path)
    want = synth_trace(groups=1024)
    assert built.num_groups == 1024 and np.array_equal(built.lengths, want.lengths)
    mtime = path.stat().st_mtime_ns
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0 and path.stat().st_mtime_ns == mtime    # reused, not drawn again
    # a multi-step run gets a trace long enough for every step of the curve (F up to 1)
    r = CliRunner().invoke(cli, ["simulate", "--steps", "12", "--step-groups", "128", "--fast", "2", "--heavy", "1",
                                 "--quiet", "--over-provision", "1"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "data" / "synth_2048x8_seed0.jsonl").exists()   # 256 + 11 x 128 = 1,664 groups
    # what --help says of it holds: the `informative` family member (not `seed002`), median ~420, p99 ~1.4k
    from pdsr_sdk.traces.family import WORKLOADS

    text = " ".join(CliRunner().invoke(cli, ["simulate", "--help"]).output.split())
    assert "the `informative` family member: median ~420 tokens, p99 ~1.4k" in text
    assert WORKLOADS.get("informative").synth == {}   # trace synth's defaults
    lengths = built.lengths
    assert round(float(np.median(lengths)), -1) == 420 and round(float(np.percentile(lengths, 99)), -2) == 1400


def test_cli_errors_are_clean(tmp_path):
    trace_path = write_trace_jsonl(small_trace(groups=4), tmp_path / "t.jsonl")
    run = CliRunner().invoke
    r = run(cli, ["simulate", "--trace", str(trace_path), "--policy", "v2.5", "--heavy", "0", "--quiet"])
    assert r.exit_code == 2 and "needs at least one engine in pool(s) heavy" in r.output
    r = run(cli, ["simulate", "--trace", str(trace_path), "--policy", "all", "--set", "bogus=1"])
    assert r.exit_code == 2 and "'bogus' belongs to none of the selected policies" in r.output
    r = run(cli, ["simulate", "--trace", str(trace_path), "--policy", "v2.5", "--set", "v2.5:cap_multiplier=-1"])
    assert r.exit_code == 2 and "cap_multiplier" in r.output
    r = run(cli, ["simulate", "--trace", str(trace_path), "--n", "9"])
    assert r.exit_code == 2 and "n is 9 but group 0" in r.output and "has only 4 samples" in r.output
    (tmp_path / "bad.yaml").write_text("medium: {c0_s: 1}\n")
    r = run(cli, ["simulate", "--trace", str(trace_path), "--profile", str(tmp_path / "bad.yaml")])
    assert r.exit_code == 2 and "medium: unknown pool" in r.output
    r = run(cli, ["simulate", "calibrate", "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and "--trajectories" in r.output
    r = run(cli, ["simulate", "calibrate", "--trajectories", str(trace_path), "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and f"{trace_path}: is a length trace (JSONL), not a trajectories file" in r.output
    assert "pdsr rollout" in r.output and not (tmp_path / "p.yaml").exists()


def test_v2_threshold_is_numpys_percentile_bit_for_bit():
    from pdsr_sdk.policies.v2 import linear_percentile

    rng = np.random.default_rng(0)
    for _ in range(3000):
        n = int(rng.integers(1, 70))
        values = [float(v) for v in rng.exponential(3.0, n).round(int(rng.integers(0, 4)))]
        q = float(rng.choice([80.0, 50.0, 99.0, rng.uniform(0.01, 99.99)]))
        assert linear_percentile(values, q) == float(np.percentile(np.asarray(values), q))


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


def test_cli_says_what_a_user_of_one_trace_needs_to_read_the_table(tmp_path):
    """One policy runs beside baseline (vs_base); the footnote explains only the columns shown; a short trace and
    fewer batches than asked are said; a response no engine can hold is named before anything runs."""
    trace_path = write_trace_jsonl(small_trace(groups=10), tmp_path / "t.jsonl")
    base = ["simulate", "--trace", str(trace_path), "--fast", "2", "--heavy", "1", "--quiet", "--no-timeline"]
    r = CliRunner().invoke(cli, [*base, "--policy", "v3", "--batch-size", "16", "--num-batches", "3"])
    assert r.exit_code == 0, r.output
    assert "10 groups, 40 samples in 1 batch(es) of 16 prompts (the trace holds only 10 groups" in r.output
    assert "--num-batches asked for 3, the trace holds 1" in r.output
    rows = [line.split()[0] for line in r.output.splitlines() if line.startswith(("baseline ", "v3 "))]
    assert rows == ["baseline", "v3"] and "vs_base = makespan / baseline's" in r.output
    assert "of_oracle" not in r.output
    r = CliRunner().invoke(cli, [*base, "--policy", "v3", "--no-references", "--batch-size", "4"])
    assert r.exit_code == 0, r.output
    assert "in 3 batch(es) of 4 prompts (the last has 2: the trace ran out)" in r.output
    assert "vs_base" not in r.output and "baseline " not in r.output
    lines = [json.dumps({"prompt_id": "a", "prompt_len": 50, "lengths": [10, 40_000]}),
             json.dumps({"prompt_id": "b", "prompt_len": 5, "lengths": [3, 4]})]
    (tmp_path / "long.jsonl").write_text("\n".join(lines) + "\n")
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(tmp_path / "long.jsonl"), "--quiet"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "group 0 ('a'), sample 1: a context of 40,050 tokens (prompt 50 + response 40,000)" in r.output
    assert "at most 32,768" in r.output


def test_cli_marks_a_policy_that_truncated_responses_as_not_comparable(tmp_path):
    trace_path = write_trace_jsonl(synth_trace(groups=16, n=4, seed=3, median_length=300, max_length=3000,
                                               runaway_frac=0.2), tmp_path / "t.jsonl")
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(trace_path), "--policy", "baseline,v1", "--quiet",
                                 "--no-references", "--batch-size", "16", "--no-timeline"])
    assert r.exit_code == 0, r.output
    assert "trunc" in r.output.splitlines()[1] and "trunc = responses a policy's cap cut short" in r.output
