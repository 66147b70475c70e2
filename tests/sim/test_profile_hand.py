"""A profile's numbers mean what docs/simulate.md says: a profile file, as `pdsr simulate calibrate` writes it, read
back and simulated, against the documented step formula summed by hand (float64 loops here, not the simulator's
closed forms), and a KV-bound case against a hand count of its blocks."""

from __future__ import annotations

import json
import math

import pytest

from pdsr_sdk.sim.calibrate import PoolFit, profile_yaml
from pdsr_sdk.sim.config import SimulateConfig, load_profile_file
from pdsr_sdk.sim.driver import simulate
from pdsr_sdk.traces import read_trace

COSTS = {"c0_s": 0.01, "c1_s_per_seq": 0.001, "c2_s_per_token": 1.0e-5, "prefill_s_per_token": 1.0e-4}


def run_one_engine(tmp_path, groups, profile_text):
    """simulate()'s row: ``groups`` as one batch, on one fast engine of the profile file, baseline, no segments."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(g) + "\n" for g in groups))
    path = tmp_path / "profile.yaml"
    path.write_text(profile_text)
    cfg = SimulateConfig(trace=trace, policy="baseline", fast=1, heavy=0, batch_size=len(groups),
                         segments={"enabled": False}, profiles=load_profile_file(path))
    report = simulate(read_trace(trace), cfg)
    return report.policy_summary(report.runs[0])


def test_a_calibrated_profile_reads_back_as_written(tmp_path):
    fit = PoolFit(pool="fast", coefficients=dict(COSTS), spans=40, engines=1, r2=0.9, median_rel_error=0.05,
                  max_num_seqs=64)
    path = tmp_path / "profile.yaml"
    path.write_text(profile_yaml({"fast": fit}, ["run.parquet"]))
    pools = load_profile_file(path)
    assert pools["fast"] == {**COSTS, "max_num_seqs": 64} and pools["heavy"] == pools["fast"]
    cfg = SimulateConfig(profiles=pools)
    assert all(getattr(cfg.profiles.heavy, k) == v for k, v in COSTS.items())


def test_one_request_takes_the_documented_step_sum(tmp_path):
    """One request, prompt P, L tokens, alone: its admitting step prefills P tokens, and step j (0-based) reads a
    context of P + j tokens with one running, so the makespan is p P + sum_j (c0 + c1 + c2 (P + j))."""
    prompt, length = 100, 50
    s = run_one_engine(tmp_path, [{"prompt_id": "p0", "prompt_len": prompt, "lengths": [length]}],
                       f"fast: {json.dumps(COSTS)}\n")
    c0, c1, c2, p = COSTS.values()
    expected = p * prompt
    for j in range(length):
        expected += c0 + c1 + c2 * (prompt + j)
    assert s["makespan_s"] == pytest.approx(expected, rel=1e-12)
    assert s["prefill_tokens"] == prompt and s["preemptions"] == 0


def test_a_full_kv_cache_preempts_the_newest_request_as_counted_by_hand(tmp_path):
    """Two samples of one 16-token prompt, 40 tokens each, on a cache of 4 blocks of 16 (no prompt sharing).

    Hand count: a request whose step reads a context of c tokens holds ceil(c / 16) blocks. Both are admitted
    at once (1 block each) and run together while 2 x ceil((16 + j) / 16) <= 4, i.e. steps j = 0..16; at j = 17
    each would need 3 blocks (6 > 4), so the newest is preempted with 17 tokens made. The other runs alone to
    its end (context 55: 4 blocks, so the preempted one, needing ceil(33 / 16) = 3, cannot rejoin before), then
    the preempted one re-prefills its 33-token context and makes its other 23 tokens."""
    profile = {**COSTS, "kv_cache_tokens": 64, "block_size": 16, "max_num_seqs": 2, "prompt_cache": False}
    s = run_one_engine(tmp_path, [{"prompt_id": "p0", "prompt_len": 16, "lengths": [40, 40]}],
                       f"fast: {json.dumps(profile)}\n")
    c0, c1, c2, p = COSTS.values()
    blocks = lambda c: math.ceil(c / 16)   # noqa: E731
    together = next(j for j in range(40) if 2 * blocks(16 + j) > 4)
    assert together == 17
    t = p * 32
    for j in range(together):
        t += c0 + 2 * c1 + c2 * 2 * (16 + j)
    for j in range(together, 40):
        t += c0 + c1 + c2 * (16 + j)
    t += p * (16 + together)
    for j in range(together, 40):
        t += c0 + c1 + c2 * (16 + j)
    assert s["preemptions"] == 1 and s["prefill_tokens"] == 16 + 16 + (16 + together)
    assert s["makespan_s"] == pytest.approx(t, rel=1e-12) and s["tokens"] == 80


def test_calibrate_writes_the_kv_capacity_the_run_recorded(tmp_path):
    """A run's summary records each engine's KV capacity (vLLM sizes it at start-up); calibrate writes it into the
    profile, where before a profile fitted on any machine simulated 262,144 KV tokens (the GPU-like default)."""
    from types import SimpleNamespace

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pdsr_sdk.dispatch.clock import VirtualClock
    from pdsr_sdk.dispatch.trajectory import trajectory_schema
    from pdsr_sdk.rollout.summary import kv_capacity
    from pdsr_sdk.sim.calibrate import calibrate
    from pdsr_sdk.sim.config import EngineProfile
    from pdsr_sdk.sim.driver import trajectories_table
    from pdsr_sdk.sim.engine import SimEngine
    from pdsr_sdk.traces import synth_trace

    # an engine of 3,000 KV tokens in blocks of 16 holds 187 whole blocks: 2,992 tokens
    engine = SimEngine("fast-0", "fast", EngineProfile(kv_cache_tokens=3000), VirtualClock())
    session = SimpleNamespace(engines=[engine])
    assert kv_capacity(session, "fast-0") == {"kv_cache_tokens": 187 * 16}
    assert kv_capacity(session, "gone") == {} and kv_capacity(SimpleNamespace(engines=[SimpleNamespace(
        name="ray-0", kv_cache_tokens=None)]), "ray-0") == {}

    prof = {"max_num_seqs": 16, "kv_cache_tokens": 1 << 20, **COSTS}
    cfg = SimulateConfig(policy="baseline", fast=2, heavy=1, batch_size=8, timeline=False,
                         profiles={"fast": prof, "heavy": prof})
    rows = trajectories_table(simulate(synth_trace(groups=16, n=4, seed=1, median_length=80, max_length=300), cfg,
                                       keep_groups=True).runs[0].groups)
    path = tmp_path / "run.parquet"
    pq.write_table(pa.Table.from_pylist(rows.to_pylist(), schema=trajectory_schema()), path)
    engines = [{"name": "fast-0", "pool": "fast", "max_num_seqs": 16, "kv_cache_tokens": 2992},
               {"name": "fast-1", "pool": "fast", "max_num_seqs": 16, "kv_cache_tokens": 2992},
               {"name": "heavy-0", "pool": "heavy", "max_num_seqs": 16, "kv_cache_tokens": 2992},
               {"name": "heavy-1", "pool": "heavy", "max_num_seqs": 16, "kv_cache_tokens": 4000}]
    (tmp_path / "run.summary.json").write_text(json.dumps({"engines": engines}))
    fits = calibrate([path], min_spans=4)
    # the heavy engines disagree: no capacity is written for them (the simulator's default stays)
    assert fits["fast"].profile()["kv_cache_tokens"] == 2992 and "kv_cache_tokens" not in fits["heavy"].profile()
    out = tmp_path / "profile.yaml"
    out.write_text(profile_yaml(fits, [path]))
    pools = load_profile_file(out)
    assert SimulateConfig(profiles=pools).profiles.fast.kv_cache_tokens == 2992
