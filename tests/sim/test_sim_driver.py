"""`simulate` on simulated engines: every policy finishes every sample with its exact length, the
report's numbers and lower bound against hand computations, the engines' profiles and v2's percentile."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.engines import ENGINE_BACKENDS, build_engine
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import EngineSpec
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import simulate
from pdsr_sdk.traces import LengthTrace, synth_trace
from sim_driver_inputs import small_trace


SMALL = dict(max_num_seqs=6, kv_cache_tokens=2048, block_size=16)


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


def test_v2_threshold_is_numpys_percentile_bit_for_bit():
    from pdsr_sdk.policies.v2 import linear_percentile

    rng = np.random.default_rng(0)
    for _ in range(3000):
        n = int(rng.integers(1, 70))
        values = [float(v) for v in rng.exponential(3.0, n).round(int(rng.integers(0, 4)))]
        q = float(rng.choice([80.0, 50.0, 99.0, rng.uniform(0.01, 99.99)]))
        assert linear_percentile(values, q) == float(np.percentile(np.asarray(values), q))


def test_v25_with_a_cap_past_int64_breaks_nothing():
    """v2.5's fast cap floor(cap_multiplier x L_cut) past int64 wrapped to a negative cap, so every fast sample broke
    (then clamped to min_cap_tokens); held at no cap, it runs as a cap longer than every length does."""
    trace = synth_trace(groups=32, n=4, seed=3)
    runs = {}
    for mult in (1e6, 1e17, 1e300):
        cfg = SimulateConfig(policy="v2.5", policy_settings={"v2.5": {"cap_multiplier": mult}}, fast=2, heavy=1,
                             batch_size=16, timeline=False, references=False)
        runs[mult] = simulate(trace, cfg).to_dict()["policies"][0]
    assert runs[1e6]["breaks"] == 0
    for mult in (1e17, 1e300):
        assert runs[mult]["breaks"] == 0 and runs[mult]["makespan_s"] == runs[1e6]["makespan_s"]
