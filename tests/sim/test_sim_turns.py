"""The simulator replays traces of turns: each turn a request through the scheduler, the environment's delay on the
virtual clock, its tokens prefilled; parked samples hold no slot (and the slot-holding reference keeps it)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import HOLD_REFERENCE, run_policy, simulate, trace_batches, trajectories_table
from pdsr_sdk.sim.steps import run_steps, simulate_steps
from pdsr_sdk.traces import LengthTrace, read_trace, synth_trace, write_trace_jsonl
from pdsr_sdk.traces.trace import SampleTurns

#: one token per second whatever runs, no prefill cost
UNIT = dict(max_num_seqs=64, kv_cache_tokens=65536, c0_s=1.0, c1_s_per_seq=0.0, c2_s_per_token=0.0,
            prefill_s_per_token=0.0)


def turn_trace(turns: list[list[tuple[int, int, float]]], prompt_len: int = 4) -> LengthTrace:
    """One group per sample (n = 1), each with the given turns."""
    lengths = [[sum(k + e for k, e, _ in t)] for t in turns]
    return LengthTrace.from_matrix(np.array(lengths), prompt_ids=[f"g{i}" for i in range(len(turns))],
                                   prompt_lens=np.full(len(turns), prompt_len),
                                   turns=SampleTurns.from_lists(turns))


def cfg_for(profile, **kw) -> SimulateConfig:
    base = dict(policy="baseline", fast=1, heavy=0, batch_size=8, timeline=False, profiles={"fast": profile},
                segments={"enabled": False})
    return SimulateConfig(**{**base, **kw})


def one_run(trace, cfg, policy="baseline", **kw):
    return run_policy(trace_batches(trace, cfg), cfg, policy, keep_groups=True, **kw)


def test_turns_replay_exactly_with_their_delays():
    """Unit cost, ample slots, integer delays: each sample ends at the sum of its turns' tokens and delays, and its
    records are the trace's turns, the environment's spans lasting exactly its delays."""
    turns = [[(3, 5, 2.0), (4, 2, 1.0), (2, 0, 0.0)], [(6, 0, 0.0)], [(1, 1, 7.0), (1, 0, 0.0)]]
    trace = turn_trace(turns)
    run = one_run(trace, cfg_for(UNIT))
    samples = [s for g in run.groups for s in g.samples]
    for s, want in zip(samples, turns):
        assert s.finish_time_s == pytest.approx(sum(k + d for k, _, d in want))
        assert s.num_generated == sum(k + e for k, e, _ in want) and s.env_tokens == sum(e for _, e, _ in want)
        got = [(t.role, t.num_tokens) for t in s.turns]
        expect = []
        for k, e, _ in want:
            expect.append(("assistant", k))
            if e:
                expect.append(("environment", e))
        assert got == expect
        env = [t for t in s.turns if t.role == "environment"]
        assert [t.end_s - t.start_s for t in env] == pytest.approx([d for _, e, d in want if e])
        assert all(t.finish_reason == "stop" for t in s.turns if t.role == "assistant")
        assert s.sampled_tokens == sum(k for k, _, _ in want)
    assert run.makespan_s == pytest.approx(12.0)   # the first sample: 3 + 2 + 4 + 1 + 2
    assert run.env_slot_share == 0.0


def test_a_parked_sample_frees_its_slot_and_the_hold_reference_keeps_it():
    """One engine, one slot: A = 2 tokens, 3 s of environment, 2 tokens; B = 3 tokens. Freed: B runs while A's
    environment works (A ends at 7). Held: B waits for A's slot until A's last turn ends (B ends at 10)."""
    trace = turn_trace([[(2, 1, 3.0), (2, 0, 0.0)], [(3, 0, 0.0)]])
    cfg = cfg_for({**UNIT, "max_num_seqs": 1})
    free = one_run(trace, cfg)
    held = one_run(trace, cfg, hold_turn_slots=True)
    a, b = (s for g in free.groups for s in g.samples)
    assert (a.finish_time_s, b.finish_time_s) == (pytest.approx(7.0), pytest.approx(5.0))
    assert free.makespan_s == pytest.approx(7.0) and free.env_slot_share == 0.0
    a, b = (s for g in held.groups for s in g.samples)
    assert (a.finish_time_s, b.finish_time_s) == (pytest.approx(7.0), pytest.approx(10.0))
    # held 3 slot-seconds against 2 + 2 (A's turns) + 3 (B) on the engine
    assert held.env_slot_share == pytest.approx(3.0 / (3.0 + 2.0 + 2.0 + 3.0))


def test_environment_tokens_are_prefill_not_decode():
    """c0 = 1 s per step, 0.5 s per prefilled token, blocks of one token: a turn costs one step per sampled token;
    its environment's tokens (and the last sampled token, whose KV the engine had not computed) are prefilled in
    the next turn's first step."""
    profile = dict(UNIT, prefill_s_per_token=0.5, block_size=1)
    p, s1, e, d, s2 = 4, 3, 10, 2.0, 5
    run = one_run(turn_trace([[(s1, e, d), (s2, 0, 0.0)]], prompt_len=p), cfg_for(profile))
    assert run.makespan_s == pytest.approx(p * 0.5 + s1 + d + (e + 1) * 0.5 + s2)
    assert run.batches[0].prefill_tokens == p + e + 1
    # the lower bound: the same, less the recomputed token (it charges the environment's tokens only)
    assert run.lower_bound_s == pytest.approx(run.makespan_s - 0.5)


@pytest.mark.parametrize("policy", ["baseline", "lpt", "v1", "v2", "v2.5", "v3", "oracle", "oracle-probe"])
def test_every_policy_replays_a_trace_of_turns(policy):
    trace = synth_trace(groups=12, n=4, seed=3, median_length=60, max_length=300, turns_min=1, turns_max=5,
                        env_delay_min_s=0.05, env_delay_max_s=0.5)
    cfg = SimulateConfig(policy=policy, fast=2, heavy=1, batch_size=6, timeline=False,
                         profiles={"fast": dict(max_num_seqs=6), "heavy": dict(max_num_seqs=6)},
                         segments={"min_tokens": 8, "max_tokens": 32})
    run = one_run(trace, cfg, policy)
    assert run.makespan_s >= run.lower_bound_s
    assert run.env_slot_share == 0.0
    for g in run.groups:
        for s in g.samples:
            want = trace.turns.of(trace.prompt_ids.index(g.prompt_id) * 4 + s.index)
            assert [t.num_tokens for t in s.turns if t.role == "assistant"] == [k for k, _, _ in want]
            assert s.env_tokens == sum(e for _, e, _ in want)


def test_converted_trajectories_give_back_the_trace_of_turns(tmp_path):
    trace = synth_trace(groups=6, n=3, seed=9, median_length=50, max_length=200, turns_max=4)
    cfg = cfg_for(dict(max_num_seqs=4), batch_size=3)
    run = one_run(trace, cfg, "v3")
    path = tmp_path / "traj.parquet"
    pq.write_table(trajectories_table(run.groups), path)
    back = read_trace(path)
    assert back.prompt_ids == trace.prompt_ids
    np.testing.assert_array_equal(back.lengths, trace.lengths)
    np.testing.assert_array_equal(back.turns.offsets, trace.turns.offsets)
    np.testing.assert_array_equal(back.turns.sampled, trace.turns.sampled)
    np.testing.assert_array_equal(back.turns.env_tokens, trace.turns.env_tokens)
    np.testing.assert_allclose(back.turns.env_s, trace.turns.env_s, atol=1e-9)
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(cli, ["trace", "convert", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "turns" in result.output
    np.testing.assert_allclose(np.array(read_trace(out).turns.of(0)), np.array(trace.turns.of(0)), atol=1e-9)


def test_report_has_the_slot_share_and_the_hold_reference(tmp_path):
    trace = synth_trace(groups=8, n=4, seed=4, median_length=60, max_length=300, turns_max=6)
    path = write_trace_jsonl(trace, tmp_path / "t.jsonl")
    cfg = SimulateConfig(trace=path, policy="baseline,v3", fast=2, heavy=0, batch_size=8, timeline=False,
                         profiles={"fast": dict(max_num_seqs=8)})
    report = simulate(trace, cfg)
    rows = {r["policy"]: r for r in report.rows()}
    assert set(rows) == {"baseline", "v3", "oracle", "oracle-probe", HOLD_REFERENCE}
    assert rows["baseline"]["env_slot"] == 0.0 and rows["v3"]["env_slot"] == 0.0
    assert 0.0 < rows[HOLD_REFERENCE]["env_slot"] < 1.0
    # slots bind (8 per engine, 32 samples): holding them through the environment's waits costs
    assert rows[HOLD_REFERENCE]["makespan_s"] > rows["baseline"]["makespan_s"]
    summary = report.to_dict()["policies"][0]
    assert summary["env_slot_share"] == 0.0 and summary["env_wait_s"] > 0
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(path), "--policy", "baseline,v3", "--fast", "2",
                                      "--heavy", "0", "--batch-size", "8", "--no-timeline"])
    assert result.exit_code == 0, result.output
    assert "env_slot" in result.output and HOLD_REFERENCE in result.output
    profile = tmp_path / "profile.yaml"
    profile.write_text("fast: {max_num_seqs: 8}\n")
    held = CliRunner().invoke(cli, ["simulate", "--trace", str(path), "--policy", "baseline", "--fast", "2",
                                    "--heavy", "0", "--batch-size", "8", "--no-timeline", "--hold-turn-slots",
                                    "--profile", str(profile)])
    assert held.exit_code == 0, held.output
    row = next(line.split() for line in held.output.splitlines() if line.startswith("baseline"))
    assert float(row[1]) == pytest.approx(rows[HOLD_REFERENCE]["makespan_s"], rel=1e-3) and float(row[-1]) > 0


def test_partial_rollout_under_a_staleness_bound_refuses_a_trace_of_turns():
    """As a session with an agent: a multi-turn sample is never restarted, so no bound can hold."""
    trace = synth_trace(groups=8, n=2, seed=1, turns_max=3, max_length=100)
    cfg = SimulateConfig(policy="v3", fast=1, heavy=0, batch_size=2, steps=2, max_staleness=2, timeline=False)
    with pytest.raises(ConfigError, match="max_staleness 2 with a trace of turns: a multi-turn sample is never"):
        simulate_steps(trace, cfg)


@pytest.mark.parametrize("policy", ["baseline", "v3"])
def test_partial_rollout_carries_multi_turn_samples_across_steps_with_every_turn(policy):
    """Without a staleness bound the stream carries multi-turn samples: every consumed sample replayed each of its
    recorded turns (the model's tokens and the environment's), some across a step's end, none restarted."""
    trace = synth_trace(groups=120, n=4, seed=3, turns_max=4, max_length=400, env_delay_max_s=2.0)
    cfg = SimulateConfig(policy=policy, fast=2, heavy=1, step_groups=8, steps=6, timeline=False,
                         profiles={"fast": UNIT, "heavy": UNIT}, segments={"min_tokens": 8, "max_tokens": 64})
    run = run_steps(trace, cfg, policy, 0.5, keep_groups=True)
    assert len(run.steps) == 6 and run.stats["restarts"] == 0
    consumed = [g for g in run.groups if g.prompt_id in run.consumed_at]
    assert len(consumed) == 6 * 8
    carried = [g for g in consumed if run.consumed_at[g.prompt_id] > run.launched_at[g.prompt_id]]
    assert carried, "some groups run across a step's end"
    by_id = {pid: i for i, pid in enumerate(trace.prompt_ids)}
    for g in consumed:
        for s in g.samples:
            want = trace.turns.of(by_id[g.prompt_id] * 4 + s.index)
            assert [t.num_tokens for t in s.turns if t.role == "assistant"] == [k for k, _, _ in want]
            assert s.env_tokens == sum(e for _, e, _ in want) and s.num_generated == sum(k + e for k, e, _ in want)


def test_token_ratio_of_a_stream_of_turns_counts_the_models_tokens_only():
    """A step's tokens are the ones the model sampled; the trace's lengths also hold the environment's. With no
    restart (a multi-turn sample has none) the steps consume exactly what the trace records: token_ratio 1, not the
    sampled share of the lengths (which made per_token read partial rollout as slower than on-policy)."""
    trace = synth_trace(groups=120, n=4, seed=3, turns_max=4, max_length=400, env_delay_max_s=2.0)
    cfg = SimulateConfig(policy="v3", fast=2, heavy=1, step_groups=8, steps=6, timeline=False,
                         profiles={"fast": UNIT, "heavy": UNIT}, segments={"min_tokens": 8, "max_tokens": 64})
    run = run_steps(trace, cfg, "v3", 0.5, keep_groups=True)
    assert run.stats["restarts"] == 0 and sum(s.env_tokens for g in run.groups for s in g.samples) > 0
    assert run.token_ratio == pytest.approx(1.0)
