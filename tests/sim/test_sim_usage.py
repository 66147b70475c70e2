"""`pdsr simulate --steps`: where the engines' time went (per-engine counters, ``pdsr_sdk.sim.usage``) and the
steps timeline."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.sim.steps import run_steps, simulate_steps
from pdsr_sdk.traces import write_trace_jsonl
from sim_cases import hand_trace, small_cfg, small_trace, unit_cfg


@pytest.mark.parametrize("policy, over_provision, staleness, trainer", [
    ("baseline", 0.0, None, {}),
    ("v3", 0.5, 2, {}),
    ("v3", 0.5, None, {}),
    ("v3", 0.5, 1, {"trainer_s": 40.0, "weight_update_s": 1.0, "pipeline": True}),
])
def test_every_token_an_engine_generated_is_consumed_carried_or_wasted(policy, over_provision, staleness, trainer):
    """The engines' own token counts add up to the stream's books: the consumed groups' kept tokens, the
    thrown-away ones (restarts) and those of groups still in flight after the last step."""
    trace = small_trace()
    cfg = small_cfg(policy=policy, max_staleness=staleness, **trainer)
    run = run_steps(trace, cfg, policy, over_provision, keep_groups=True)
    assert sum(e.tokens for e in run.engines) == run.tokens + run.stats["wasted_tokens"] + run.dropped_tokens
    assert [e.name for e in run.engines] == ["fast-0", "fast-1", "heavy-0"]
    for e in run.engines:
        assert 0 < e.busy_s <= run.horizon_s * (1 + 1e-12)
        assert 0 < e.tokens_per_step <= e.max_seqs
        assert e.prefill_s == pytest.approx(e.prefill_tokens * cfg.profiles.fast.prefill_s_per_token, rel=1e-12)
    # each consumed group's prompt was prefilled at least once
    assert sum(e.prefill_tokens for e in run.engines) >= sum(g.prompt_len for g in run.groups)


def test_an_engine_that_runs_b_equal_samples_at_once_runs_b_per_step_and_is_never_idle():
    """One engine, one token per second whatever runs, no prefill cost, F = 0: each step runs its 4 samples
    of 10 tokens together for 10 s. So 6 steps take 60 s, the engine is busy all of it, and it generated
    240 tokens in 60 decode steps: 4 sequences a step."""
    run = run_steps(hand_trace([10] * 24), unit_cfg(batch_size=4), "baseline", 0.0)
    (e,) = run.engines
    assert run.horizon_s == pytest.approx(60.0, rel=1e-12)
    assert (e.tokens, e.decode_steps) == (240, 60)
    assert e.tokens_per_step == 4.0
    assert e.busy_s == pytest.approx(60.0, rel=1e-12)
    assert e.prefill_s == 0.0 and e.preemptions == 0 and not e.lane


def test_the_engines_the_policy_made_a_tail_lane_are_named():
    """v3 in a stream under a staleness bound makes its heavy engine a tail lane (asked for: 'auto' opens it only
    at a restarted runaway, which this small stream has none of); without a bound it has none."""
    trace = small_trace()
    bound = run_steps(trace,
                      small_cfg(policy="v3", max_staleness=2, policy_settings={"v3": {"lane": {"mode": "always"}}}),
                      "v3", 0.5)
    assert bound.policy_facts["lane_engines"] == ["heavy-0"]
    assert [e.name for e in bound.engines if e.lane] == ["heavy-0"]
    free = run_steps(trace, small_cfg(policy="v3"), "v3", 0.5)
    assert free.policy_facts["lane_engines"] == [] and not any(e.lane for e in free.engines)


def test_occupancy_is_recorded_only_where_a_timeline_will_be_drawn(tmp_path):
    trace = small_trace()
    quiet = simulate_steps(trace, small_cfg(over_provision=0.5, timeline=True))
    assert all(e.occupancy_t == [] for e in quiet.runs[0].engines)
    drawn = simulate_steps(trace, small_cfg(over_provision=0.5, timeline=True, out_dir=tmp_path))
    for e in drawn.runs[0].engines:
        assert len(e.occupancy_t) == len(e.occupancy_n) > 1 and max(e.occupancy_n) <= e.max_seqs


def test_cli_prints_and_writes_the_engines_and_the_timeline(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace_jsonl(small_trace(), trace)
    args = ["simulate", "--trace", str(trace), "--policy", "v3", "--fast", "2", "--heavy", "1", "--batch-size", "6",
            "--steps", "6", "--over-provision", "0.5", "--max-staleness", "2"]
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, args + ["--out-dir", str(out)])
    assert res.exit_code == 0, res.output
    assert "seqs_per_step" in res.output and "heavy-0" in res.output
    data = json.loads((out / "steps.json").read_text())
    rows = data["runs"][0]["engines"]
    assert [r["engine"] for r in rows] == ["fast-0", "fast-1", "heavy-0"]
    assert [r["lane"] for r in rows] == ["", "", "yes"]
    assert sum(r["token_share"] for r in rows) == pytest.approx(1.0)
    assert "engines" in data["definitions"]
    assert (out / "timeline.png").stat().st_size > 0
    bare = tmp_path / "bare"
    res = CliRunner().invoke(cli, args + ["--out-dir", str(bare), "--no-timeline", "--quiet"])
    assert res.exit_code == 0, res.output
    assert (bare / "steps.json").exists() and not (bare / "timeline.png").exists()
