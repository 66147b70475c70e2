"""`pdsr simulate --steps`: partial rollout across training steps on simulated engines: no sample lost or
duplicated, the staleness bound, carry-over and starvation on hand-made traces, config checks and the CLI curve."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.errors import DataError
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import run_policy, trace_batches
from pdsr_sdk.dispatch.types import kept_segments
from pdsr_sdk.sim.steps import run_steps, simulate_steps
from pdsr_sdk.traces import write_trace_jsonl
from sim_cases import hand_trace, recorded, small_cfg, small_trace, unit_cfg


def test_f0_is_the_on_policy_run_step_for_step():
    trace = small_trace()
    cfg = small_cfg(over_provision=0.0)
    run = run_steps(trace, cfg, "baseline", 0.0, keep_groups=True)
    on = run_policy(trace_batches(trace, cfg.model_copy(update={"num_batches": 6})), cfg, "baseline", record=False,
                    keep_groups=True)
    assert run.step_times == pytest.approx([b.makespan_s for b in on.batches], rel=1e-12, abs=1e-12)
    # each step consumes exactly its batch (in completion order)
    assert sorted(g.prompt_id for g in run.groups) == [g.prompt_id for g in on.groups]
    assert all(run.consumed_at[g.prompt_id] == g.batch_index for g in on.groups)
    assert run.off_policy_share == 0 and run.max_age == 0 and run.stats["restarts"] == 0
    assert run.dropped_groups == 0 and all(s.groups == 6 for s in run.steps)
    # ... and its work bound is the batch's (the batch report's own computation)
    assert run.work_bounds_s == pytest.approx([b.work_bound_s for b in on.batches], rel=1e-12)


@pytest.mark.parametrize("policy,staleness", [("baseline", None), ("baseline", 1), ("baseline", 0), ("v2", 1),
                                              ("v3", None), ("v3", 1),
                                              ("v1", 1), ("v2.5", None), ("v2.5", 1), ("lpt", 1)])
def test_no_sample_lost_or_duplicated_and_staleness_holds(policy, staleness):
    trace = small_trace()
    want = recorded(trace)
    # replayed restarts, so that every sample's length is known (fresh draws: tests/sim/test_sim_redraw.py)
    cfg = small_cfg(policy=policy, max_staleness=staleness, restart_lengths="replay")
    run = run_steps(trace, cfg, policy, 0.5, keep_groups=True)
    ids = [g.prompt_id for g in run.groups]
    assert len(ids) == len(set(ids)) == sum(s.groups for s in run.steps) >= 6 * 6
    # the stream is the trace in order: consumed + still in flight = launched
    assert len(run.launched_at) == len(ids) + run.dropped_groups == 9 + 5 * 6
    assert list(run.launched_at) == list(trace.prompt_ids[:len(run.launched_at)])
    for g in run.groups:
        t = run.consumed_at[g.prompt_id]
        assert t >= run.launched_at[g.prompt_id]
        for s in g.samples:
            # exactly its recorded length, once; restarts regenerate it fully
            assert s.finished and s.num_generated == want[g.prompt_id][s.index], s.key
            kept = kept_segments(s)
            assert sum(seg.num_tokens for seg in kept) == s.num_generated
            assert sum(seg.num_tokens for seg in s.segments) - s.wasted_tokens == s.num_generated
            ages = [t - seg.policy_version for seg in kept if seg.num_tokens]
            assert min(ages) >= 0
            if staleness is not None:
                assert max(ages) <= staleness, s.key
            if policy == "baseline":   # no policy restarts: each sample restarted for staleness at most once
                assert s.restarts <= 1
    assert sum(s.tokens for s in run.steps) == sum(x.num_generated for g in run.groups for x in g.samples)
    # every consumed token was generated after the start: the steps up to any step take at least their work
    assert len(run.work_bounds_s) == len(run.steps)
    assert (np.cumsum(run.step_times) >= np.cumsum(run.work_bounds_s) * (1 - 1e-9)).all()
    if staleness == 0:
        assert run.off_policy_share == 0 and run.stats["restarts"] > 0 and run.stats["wasted_tokens"] > 0
        # finished samples of groups still waiting were restarted too
        assert any(s.restarts and s.segments[0].end_reason == "length"
                   for g in run.groups for s in g.samples)
    elif staleness is None:
        assert run.stats["restarts"] == 0 and run.off_policy_share > 0


def test_carry_over_gain_on_a_hand_made_trace():
    # one token per second. On-policy with B=1: 25, 10, 10, ... With 2 groups in flight the 25-token
    # group runs beside the 10-token ones: steps end at 10, 20, 25, 30, 35, 40 and the long group is
    # consumed at step 3 (index 2): 10 tokens two versions old, 10 one, 5 current (each step's end
    # aborts it and it goes on under the new version). The groups launched at t = 20, 25, 30 carry 5
    # tokens across one update each.
    trace = hand_trace([25] + [10] * 8)
    cfg = unit_cfg(over_provision=1.0)
    run = run_steps(trace, cfg, "baseline", 1.0)
    assert [(s.start_s, s.end_s) for s in run.steps] == [(0, 10), (10, 20), (20, 25), (25, 30), (30, 35), (35, 40)]
    assert run.consumed_at == {"g1": 0, "g2": 1, "g0": 2, "g3": 3, "g4": 4, "g5": 5}
    assert run.steps[2].ages == {2: 10, 1: 10, 0: 5} and run.off_policy_share == pytest.approx(35 / 75)
    assert [s.ages for s in run.steps[3:]] == [{1: 5, 0: 5}] * 3 and run.partial_share == run.off_policy_share
    # the responses carried across an update: g0 (25 tokens, 20 of them made before its last update), then one
    # 10-token group a step with 5 made before
    assert [(s.carried, s.carried_tokens) for s in run.steps] == [(0, 0), (0, 0), (1, 25), (1, 10), (1, 10), (1, 10)]
    assert run.carried_responses == 4 and run.carried_made_before == pytest.approx(35 / 55)
    # work bound: c0 = 1 s shared by up to 64 sequences, nothing else costs: L / 64 a step
    assert run.work_bounds_s == pytest.approx([10 / 64, 10 / 64, 25 / 64, 10 / 64, 10 / 64, 10 / 64])
    assert run.work_bound_s == pytest.approx(np.mean([25, 10, 10]) / 64)   # steps 3 to 5
    rep = simulate_steps(trace, cfg)
    assert rep.baseline_steps_s == [25, 10, 10, 10, 10, 10]
    assert rep.baseline_step_s == 10 and rep.runs[0].steady_step_s == pytest.approx(5.0)

    # max staleness 1: at the end of step 2 (t=20) the long group's tokens are 2 versions old: it restarts
    # (20 tokens wasted) and regenerates from t=20 to 45; step 4 waits for it (it would be too stale
    # again), consumes it, and step 5 ends at once with the group that finished meanwhile
    run = run_steps(trace, unit_cfg(over_provision=1.0, max_staleness=1), "baseline", 1.0)
    assert [(s.start_s, s.end_s) for s in run.steps] == [(0, 10), (10, 20), (20, 30), (30, 45), (45, 45), (45, 55)]
    assert run.consumed_at["g0"] == 3 and run.steps[3].ages == {1: 10, 0: 15} and run.steps[3].held_s == 5
    assert run.stats["restarts"] == 1 and run.stats["wasted_tokens"] == 20 and run.max_age == 1


@pytest.mark.parametrize("staleness,deadline", [(0, None), (1, None), (None, 2), (1, 1)])
def test_no_starvation_of_the_longest_group(staleness, deadline):
    # one 300-token group among 20-token ones: 15 steps would pass while it runs
    trace = hand_trace([20, 300] + [20] * 40)
    cfg = unit_cfg(steps=12, batch_size=2, max_staleness=staleness, group_deadline=deadline)
    run = run_steps(trace, cfg, "baseline", 0.5, keep_groups=True)
    assert "g1" in run.consumed_at
    lags = [run.consumed_at[p] - run.launched_at[p] for p in run.consumed_at]
    if deadline is not None:
        assert max(lags) <= deadline
    if staleness is not None:
        (long,) = [s for g in run.groups if g.prompt_id == "g1" for s in g.samples]
        assert long.restarts == (1 if deadline is None else 0) and long.num_generated == 300
        # it waits at most `staleness` steps after it started again
        assert run.consumed_at["g1"] - long.segments[-1].policy_version <= staleness
    assert sum(s.held_s for s in run.steps) > 0


def test_config_checks():
    with pytest.raises(ValueError, match="over_provision applies to multi-step runs only"):
        SimulateConfig(over_provision=0.5)
    with pytest.raises(DataError, match="need 39 groups; the trace has 20"):
        run_steps(small_trace(groups=20), small_cfg(), "baseline", 0.5)


def test_cli_curve_writes_json_and_png(tmp_path):
    trace_path = tmp_path / "t.jsonl"
    write_trace_jsonl(small_trace(groups=60), trace_path)
    out = tmp_path / "out"
    profile = tmp_path / "p.yaml"
    profile.write_text("fast: {max_num_seqs: 8, kv_cache_tokens: 4096}\nheavy: {max_num_seqs: 8, kv_cache_tokens: "
                       "4096}\n")
    res = CliRunner().invoke(cli, ["simulate", "--trace", str(trace_path), "--steps", "5", "--batch-size", "6",
                                   "--fast", "2", "--heavy", "1", "--profile", str(profile), "--max-staleness", "1",
                                   "--policy", "baseline",
                                   "--out-dir", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "on-policy baseline step" in res.output and "off_policy" in res.output
    data = json.loads((out / "steps.json").read_text())
    assert [r["over_provision"] for r in data["runs"]] == [0.0, 0.25, 0.5, 1.0]
    assert data["runs"][0]["ratio"] == pytest.approx(1.0) and data["runs"][0]["off_policy_share"] == 0
    # F = 0 restarts nothing: the steps consume the trace's lengths, and the ratio per token is the ratio
    assert data["runs"][0]["token_ratio"] == 1.0 and data["runs"][0]["ratio_per_token"] == data["runs"][0]["ratio"]
    assert "token_ratio" in data["definitions"] and "per_token" in res.output
    assert all(r["max_age"] <= 1 for r in data["runs"])
    assert (out / "steps.png").read_bytes()[:4] == b"\x89PNG"


def test_a_step_takes_every_due_group_even_past_b():
    """docs/partial-rollout.md: a step consumes B groups, more only when more than B are due. Six long groups
    launched at step 0 with group_deadline 1 are all due at step 1, which waits for them and takes the six (B = 2)."""
    trace = hand_trace([20, 20] + [300] * 6 + [20] * 20)
    cfg = unit_cfg(steps=4, batch_size=2, group_deadline=1)
    run = run_steps(trace, cfg, "baseline", 3.0, keep_groups=True)   # 8 groups in flight
    longs = {f"g{i}" for i in range(2, 8)}
    assert [s.groups for s in run.steps][:2] == [2, 6]
    assert {p for p, k in run.consumed_at.items() if k == 1} == longs


def test_a_trace_that_due_groups_run_dry_is_an_error_not_a_short_step():
    """The trace has the in-flight count plus (K - 1) x B groups, but the six due groups step 1 takes (B = 2) leave it
    short: from step 3 on fewer than 8 groups could be in flight, and step 4 took 4 of the 6 groups an unlimited trace
    gives it, without a word. Now that is the error a trace run dry with nothing in flight gives; 4 groups more is
    enough (test_a_step_takes_every_due_group_even_past_b's run, step for step)."""
    cfg = unit_cfg(steps=4, batch_size=2, group_deadline=1)
    short = hand_trace([20, 20] + [300] * 6 + [20] * 6)
    with pytest.raises(DataError, match=r"the trace ran out of groups at step 3 of 4: its 14 groups could not keep 8 "
                                        r"in flight \(steps that take due groups consume more than 2 each\)"):
        run_steps(short, cfg, "baseline", 3.0)
    run = run_steps(hand_trace([20, 20] + [300] * 6 + [20] * 10), cfg, "baseline", 3.0)
    assert [s.groups for s in run.steps] == [2, 6, 2, 6] and [s.launched for s in run.steps] == [8, 2, 6, 2]
