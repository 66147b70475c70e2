"""Scheduler + dispatch policies on fake engines in virtual time (no vLLM).

The fake engine emits a fixed token id per (prompt, sample, position) and
checks every resubmitted context, so any move or continuation that loses or
duplicates a token fails here.
"""

from __future__ import annotations

import pytest

from fakes import assert_complete, by_key, run_fakes
from pdsr_sdk.errors import PdsrError
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.rollout.config import SegmentConfig
from workloads import LENGTHS




@pytest.mark.parametrize("policy", ["baseline", "v1", "v2", "v2.5", "lpt"])
def test_every_policy_finishes_every_sample_with_its_own_tokens(policy):
    groups, sched, engines, done, fatal = run_fakes(policy, conc=3)
    assert not fatal and done
    assert_complete(groups)   # (v1's fast cap, 2048, is above every length here)
    for e in engines:
        assert e.max_running_seen <= e.max_concurrency
    assert sched.idle


def test_v25_routes_top_fraction_heavy_and_breaks_over_the_cap():
    # probes 100, 40, 10, 60, 20 -> top 40% (2 prompts) = p0 and p3; L_cut = 60; cap = 90
    groups, sched, engines, done, fatal = run_fakes("v2.5", {"offload_fraction": 0.4, "cap_multiplier": 1.5})
    assert not fatal
    pol = sched.policy
    assert pol.l_cut == 60 and pol.cap == 90
    s = by_key(groups)
    heavy_prompts = {g.prompt_id for g in groups if g.samples[1].routed_to == "heavy"}
    assert heavy_prompts == {"p0", "p3"}
    broke = {k for k, smp in s.items() if smp.moves}
    assert broke == {("p1", 2), ("p2", 3)}          # 130 > 90 and 91 > 90; ("p4", 1) = 90 fits exactly
    assert sched.stats["breaks"] == 2 and sched.stats["offloaded_prompts"] == 2
    for key in broke:
        smp = s[key]
        assert [seg.pool for seg in smp.segments if seg.num_tokens][-1] == "heavy"
        assert sum(seg.num_tokens for seg in smp.segments if seg.pool == "fast") == 90   # exactly the cap
    for smp in s.values():
        if smp.routed_to == "fast":
            assert sum(seg.num_tokens for seg in smp.segments if seg.pool == "fast") <= 90
    assert_complete(groups)


def test_v25_restart_wastes_the_fast_tokens():
    groups, sched, *_ , fatal = run_fakes("v2.5", {"offload_fraction": 0.4, "on_break": "restart"})
    assert not fatal
    s = by_key(groups)
    for key in [("p1", 2), ("p2", 3)]:
        assert s[key].restarts == 1 and s[key].wasted_tokens == 90
    assert sched.stats["wasted_tokens"] == 180 and sched.stats["restarts"] == 2
    assert_complete(groups)


def test_v25_probes_run_on_both_pools_split_by_slots():
    groups, *_ = run_fakes("v2.5", fast=1, heavy=1, conc=4)
    probe_pools = [g.samples[0].segments[0].pool for g in groups]
    # 5 probes over 4 + 4 slots: 2.5 each; the tie goes to the first pool (fast)
    assert sorted(probe_pools) == ["fast"] * 3 + ["heavy"] * 2


def test_v1_truncates_fast_samples_at_the_static_cap_and_offloads_the_slowest():
    groups, sched, *_ , fatal = run_fakes("v1", {"top_fraction": 0.2, "fast_max_tokens": 50, "probe_timeout_s": None})
    assert not fatal
    s = by_key(groups)
    # probe times are proportional to length: p0 (100) is the slowest -> heavy
    assert {g.prompt_id for g in groups if g.samples[1].routed_to == "heavy"} == {"p0"}
    truncated = {k: 50 for k, smp in s.items() if smp.routed_to == "fast" and LENGTHS[k[0]][k[1]] > 50}
    assert set(truncated) == {("p1", 2), ("p3", 2), ("p3", 3), ("p4", 1), ("p2", 3)}
    for k in truncated:
        assert s[k].finish_reason == "truncated"
    assert sched.stats["truncations"] == len(truncated)
    assert_complete(groups, truncated=truncated)


def test_v1_probe_timeout_marks_slow_prompts_heavy_and_keeps_the_probe():
    # 10 ms per token: at 0.5 s the probes of p0 (100 tokens) and p3 (60) are still running
    groups, sched, *_ , fatal = run_fakes("v1", {"top_fraction": 0.2, "probe_timeout_s": 0.5, "fast_max_tokens": None},
                                    conc=8)
    assert not fatal
    assert sched.stats["probe_timeouts"] == 2
    heavy = {g.prompt_id for g in groups if g.samples[1].routed_to == "heavy"}
    assert heavy == {"p0", "p3"}   # timed-out prompts fill the 20% (1 prompt) and more
    s = by_key(groups)
    for pid in ("p0", "p3"):
        probe = s[(pid, 0)]
        assert probe.moves == 1 and probe.segments[-1].pool == "heavy"
        assert sum(seg.num_tokens for seg in probe.segments if seg.pool == "fast") == 50  # 0.5 s of tokens
    assert_complete(groups)


def test_v2_token_breaker_moves_to_heavy_and_marks_the_prompt_hard():
    groups, sched, *_ , fatal = run_fakes("v2", {"breaker_tokens": 50, "breaker_time_s": None, "min_history": 100,
                                           "steal": False})
    assert not fatal
    s = by_key(groups)
    # min_history 100: every prompt is first routed fast; the breaker catches the long ones
    broke = {k for k, smp in s.items() if smp.moves}
    assert ("p0", 0) in broke and ("p3", 0) in broke                # probes over 50 break too
    assert {"p0", "p1", "p2", "p3", "p4"} >= sched.policy.hard >= {"p0", "p3"}
    for k, smp in s.items():
        assert sum(seg.num_tokens for seg in smp.segments if seg.pool == "fast") <= 50
    # a hard prompt's samples that never ran on fast were re-routed to heavy
    assert all(s[("p0", i)].segments[0].pool == "heavy" for i in (1, 2, 3))
    assert sched.stats["breaks"] == sched.stats["breaks_tokens"] > 0
    assert_complete(groups)


def test_v2_time_breaker_uses_the_clock():
    groups, sched, *_ , fatal = run_fakes("v2", {"breaker_tokens": None, "breaker_time_s": 0.3, "min_history": 100,
                                           "steal": False}, seg=SegmentConfig(min_tokens=1000, max_tokens=1000))
    assert not fatal
    s = by_key(groups)
    assert sched.stats["breaks_time"] > 0
    for smp in s.values():
        # a fast run is cut at 0.3 s = 30 tokens (no segment boundary helps it: segments are long)
        assert sum(seg.num_tokens for seg in smp.segments if seg.pool == "fast") <= 30
    assert_complete(groups)


def test_v2_heavy_engine_steals_fast_work_when_idle():
    groups, sched, *_ , fatal = run_fakes("v2", {"min_history": 100, "breaker_tokens": None, "breaker_time_s": None},
                                    fast=1, heavy=1, conc=2)
    assert not fatal
    assert sched.stats["steals"] > 0
    stolen = [smp for smp in by_key(groups).values() if smp.steals]
    assert any(seg.pool == "heavy<-fast" for smp in stolen for seg in smp.segments)
    assert_complete(groups)


def test_v3_chunks_stay_work_conserving_by_taking_whole_unstarted_groups():
    """v3 in baseline's chunks on two 2-slot engines: an engine that drains its chunk takes whole unstarted groups
    from the other's (``chunk_steal``), rerouted before any token (a steal, never a move); every token is still
    checked by the fake engine, and a sample that ran or finished cannot be rerouted."""
    lengths = {"g0": [100, 100, 100, 100], "g1": [100, 90, 80, 70], "g2": [10, 10, 10, 10], "g3": [12, 8, 10, 9]}
    groups, sched, engines, done, fatal = run_fakes("v3", {"placement": {"mode": "chunk"}, "disable": ["migration"]},
                                                    fast=1, heavy=1,
                                              conc=2, lengths=lengths)
    assert not fatal and done
    assert sched.stats["steals"] == 4 and sched.stats["moves"] == 0
    on = {g.prompt_id: {s.segments[0].engine for s in g.samples} for g in groups}
    assert on == {"g0": {"fast-0"}, "g1": {"heavy-0"}, "g2": {"heavy-0"}, "g3": {"heavy-0"}}   # g1 taken whole
    for g in groups:
        for s in g.samples:
            assert len({seg.engine for seg in s.segments}) == 1    # taken before it ran anywhere
    assert_complete(groups, lengths)
    *_, kept, _ = run_fakes("v3", {"placement": {"mode": "chunk"}, "disable": ["migration", "chunk_steal"]}, fast=1,
                            heavy=1, conc=2,
                      lengths=lengths)
    assert done[0] < 0.7 * kept[0]      # without steals fast-0 runs g0 and then g1 while heavy-0 idles
    finished = next(iter(by_key(groups).values()))
    assert sched.reroute(finished, engines[0]) is False and sched.reroute(finished, engines[1]) is False


def test_unknown_policy_lists_the_valid_names():
    with pytest.raises(PdsrError) as exc:
        POLICIES.get("v9")
    for name in ("baseline", "v1", "v2", "v2.5", "v3"):
        assert name in str(exc.value)


def test_policy_registry_rejects_duplicates():
    with pytest.raises(PdsrError, match="already registered"):
        POLICIES.register("v2.5", object)


def test_lpt_queues_longest_predicted_first_and_balances_engines():
    groups, sched, engines, done, fatal = run_fakes("lpt", fast=1, heavy=1, conc=2)
    assert not fatal
    # after the probes, each engine ran its samples longest predicted (probe length) first
    probe_len = {g.prompt_id: LENGTHS[g.prompt_id][0] for g in groups}
    for e in engines:
        starts = [r.sample for r in e.submitted if not r.sample.is_probe and r.context_len == r.sample.prompt_len]
        predicted = [probe_len[s.group.prompt_id] for s in starts]
        assert predicted == sorted(predicted, reverse=True) and predicted[0] == 100
    per_engine = {e.name: sum(s.num_generated for g in groups for s in g.samples[1:]
                              if s.segments[0].engine == e.name) for e in engines}
    total = sum(per_engine.values())
    assert max(per_engine.values()) <= 0.65 * total   # balanced by predicted work
    assert_complete(groups)


def test_v25_probe_timeout_routes_unfinished_probes_heavy():
    # 10 ms/token: at 0.5 s the probes of p0 (100 tokens, on fast) and p3 (60, on heavy) are unfinished
    groups, sched, *_ , fatal = run_fakes("v2.5", {"offload_fraction": 0.2, "probe_timeout_s": 0.5}, conc=4)
    assert not fatal
    s = by_key(groups)
    assert sched.stats["probe_timeouts"] == 2
    assert {g.prompt_id for g in groups if g.samples[1].routed_to == "heavy"} == {"p0", "p3"}
    assert s[("p0", 0)].moves == 1 and s[("p0", 0)].segments[-1].pool == "heavy"   # left fast at the timeout
    assert s[("p3", 0)].moves == 0 and {seg.pool for seg in s[("p3", 0)].segments} == {"heavy"}
    assert_complete(groups)
