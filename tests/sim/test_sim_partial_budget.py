"""`pdsr simulate --steps --max-partial-share P`: the fastest over-provision within a partial-share budget."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.dispatch.steps import in_flight
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.sim.steps import SEARCH, SEARCH_STAGGERED, curve_values, refine_within, simulate_steps
from pdsr_sdk.traces import write_trace_jsonl
from sim_cases import small_cfg, small_trace


def test_the_search_runs_each_in_flight_count_once():
    # B = 6: F = 0.05, 0.1 and 0.15 all keep 7 groups in flight
    values = curve_values(small_cfg(max_partial_share=0.1))
    counts = [in_flight(6, f) for f in values]
    assert values[0] == 0.0 and counts == sorted(set(counts)) == sorted({in_flight(6, f) for f in SEARCH})
    assert all(f == min(g for g in SEARCH if in_flight(6, g) == in_flight(6, f)) for f in values)
    assert len(curve_values(small_cfg(max_partial_share=0.1, batch_size=128))) == len(SEARCH)
    assert curve_values(small_cfg()) == (0.0, 0.25, 0.5, 1.0)
    # a staggered update's responses cross no update: its search goes on to F = 1.5
    wide = curve_values(small_cfg(max_partial_share=0.1, batch_size=128, update="staggered"))
    assert wide == SEARCH_STAGGERED and wide[:len(SEARCH)] == SEARCH and max(wide) == 1.5


def test_without_a_budget_the_timeline_draws_every_run():
    rep = simulate_steps(small_trace(), small_cfg(steps=4))
    assert [r.over_provision for r in rep.timeline_runs()] == [0.0, 0.25, 0.5, 1.0]


@pytest.mark.parametrize("policy", ["baseline", "v3"])
def test_the_pick_is_the_fastest_run_within_the_budget(policy):
    rep = simulate_steps(small_trace(groups=100), small_cfg(policy=policy, max_staleness=2, steps=8,
                                                             max_partial_share=0.15))
    budget = rep.cfg.max_partial_share
    best = None
    for r in rep.runs:     # by hand: the shortest steady step among the runs within the budget
        if r.partial_share <= budget and (best is None or r.steady_step_s < best.steady_step_s):
            best = r
    pick = rep.fastest_within()
    assert pick is best and pick.over_provision > 0
    # the budget binds: a faster run went over it
    assert any(r.steady_step_s < pick.steady_step_s and r.partial_share > budget for r in rep.runs)
    assert [row["pick"] for row in rep.rows()].count("fastest within") == 1
    assert rep.timeline_runs() == [pick]                      # the timeline draws the pick alone
    d = rep.to_dict()
    assert d["max_partial_share"] == budget and d["fastest_within"] == pick.over_provision
    # the floor: no run within the budget beats it, and it is at least the F = 0 run's work bound
    f0 = next(r for r in rep.runs if r.over_provision == 0.0)
    assert f0.work_bound_s <= rep.floor_s <= pick.steady_step_s
    assert d["floor_s"] == rep.floor_s and d["floor_ratio"] == pytest.approx(rep.floor_s / rep.baseline_step_s)


def test_the_floor_is_the_higher_bound_for_the_streams_first_groups():
    import numpy as np

    from pdsr_sdk.sim.partial_floor import partial_floor
    from pdsr_sdk.sim.step_floor import step_floor

    trace = small_trace(groups=100)
    cfg = small_cfg(max_staleness=2, steps=8, max_partial_share=0.1)
    rep = simulate_steps(trace, cfg)
    work = next(r for r in rep.runs if r.over_provision == 0.0).work_bound_s
    g = cfg.steps * cfg.batch_size   # the groups F = 0 consumes, in the trace's order
    lengths = np.asarray(trace.lengths[:trace.offsets[g]])
    prompts = np.repeat(trace.prompt_lens[:g], trace.group_sizes[:g])
    p = cfg.profiles.fast
    kw = dict(steps=cfg.steps, engines=cfg.fast + cfg.heavy, budget=0.1, c0=p.c0_s, c1=p.c1_s_per_seq,
              max_seqs=p.max_num_seqs)
    want = max(partial_floor(lengths, work, **kw), step_floor(lengths, prompts, work, c2=p.c2_s_per_token,
                                                              kv_tokens=p.kv_cache_tokens, **kw))
    assert rep.floor_s == pytest.approx(want) and rep.floor_s > work
    assert simulate_steps(trace, small_cfg(max_staleness=2, steps=8)).floor_s is None   # no budget, no floor
    # speculation makes more than a token a request a step, which both bounds rule out: no floor either
    from sim_cases import SMALL

    spec = dict(SMALL, speculation={"tokens_per_step": 2.0, "verify_cost": [(1, 1.0)], "max_batch": 4})
    drafted = small_cfg(max_staleness=2, steps=8, max_partial_share=0.1, profiles={"fast": spec, "heavy": spec})
    assert simulate_steps(trace, drafted).floor_s is None


def test_max_partial_share_needs_steps_and_no_fixed_over_provision():
    with pytest.raises(ConfigError, match="max_partial_share applies to multi-step runs only"):
        small_cfg(steps=None, max_partial_share=0.1)
    with pytest.raises(ConfigError, match="leave over_provision unset"):
        small_cfg(max_partial_share=0.1, over_provision=0.25)
    with pytest.raises(ConfigError, match="max_partial_share"):
        small_cfg(max_partial_share=1.5)


def test_the_cli_names_the_pick_or_says_none_was_within(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace_jsonl(small_trace(groups=100), trace)
    args = ["simulate", "--trace", str(trace), "--fast", "2", "--heavy", "1", "--batch-size", "6", "--steps", "8",
            "--max-staleness", "2", "--no-timeline", "--quiet"]
    res = CliRunner().invoke(cli, args + ["--max-partial-share", "0.15", "--out-dir", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    d = json.loads((tmp_path / "o" / "steps.json").read_text())
    f = d["fastest_within"]
    pick = next(r for r in d["runs"] if r["over_provision"] == f)
    assert (f"fastest within 15.0% partial tokens: F = {f:.3g} ({pick['in_flight']} groups in flight), steady step "
            f"{pick['steady_step_s']:.4g} s = {pick['ratio']:.3f}x the on-policy step") in res.output
    assert (f"floor: no schedule of these engines in equal steps goes below {d['floor_s']:.4g} s = "
            f"{d['floor_ratio']:.3f}x within 15.0% partial tokens") in res.output
    # what its partial tokens are: responses carried across an update, and how much of each was made before it
    steps = pick["steps"]
    if pick["carried_responses"]:
        made = sum(s["partial_tokens"] for s in steps) / sum(s["carried_tokens"] for s in steps)
        assert pick["carried_made_before"] == pytest.approx(made) and 0 < made < 1
        assert (f"its partial tokens: {pick['carried_responses'] / len(steps):.3g} responses a step crossed an "
                f"update, {made:.0%} of their tokens made before it") in res.output
    else:
        assert pick["carried_made_before"] is None and "its partial tokens" not in res.output
    assert (tmp_path / "o" / "steps.png").stat().st_size > 0
    # a pipelined trainer's updates land mid-step: even F = 0 carries partial responses, over a 1% budget
    res = CliRunner().invoke(cli, args + ["--max-partial-share", "0.01", "--trainer-s", "1", "--pipeline"])
    assert res.exit_code == 0, res.output
    assert "no over-provision kept the partial share within 1.0%" in res.output


class _Run:
    """What refine_within reads of a run: groups in flight, partial share, steady step."""

    def __init__(self, b, f):
        self.in_flight = in_flight(b, f)
        self.partial_share = 0.001 * (self.in_flight - b)      # one more group in flight: 0.1% more partial
        self.steady_step_s = 100.0 - self.in_flight             # ... and a shorter step


@pytest.mark.parametrize("b, budget, want", [(512, 0.1, 612), (512, 0.0305, 542), (128, 0.01, 138), (128, 0.5, 192)])
def test_the_refinement_bisects_to_the_last_count_within_the_budget(b, budget, want):
    asked = []

    def run_at(f):
        asked.append(f)
        return _Run(b, f)

    coarse = [_Run(b, f) for f in SEARCH]
    runs = refine_within(coarse, budget, b, run_at)
    counts = [r.in_flight for r in runs]
    assert counts == sorted(counts) and len(runs) == len(coarse) + len(asked)
    assert len(set(counts)) == len(counts)                       # no count run twice
    within = [r for r in runs if r.partial_share <= budget]
    best = min(within, key=lambda r: r.steady_step_s)
    assert best.in_flight == want                                # by hand: b + floor(budget / 0.001), capped at 1.5 b
    if want < in_flight(b, 0.5):
        assert want + 1 in counts                                # its neighbour was run, and is over
        step = in_flight(b, 0.05) - b
        assert len(asked) <= step.bit_length()                   # a bisection, not a scan
    else:
        assert asked == []                                       # nothing over the budget to bisect toward


def test_the_refinement_does_not_run_again_a_count_the_grid_ran():
    """B = 32 on the staggered grid: F = 1, 1.25, 1.5 keep 64, 72 and 80 groups in flight. 72 is within the budget
    but slower than 64 and 80 is over it, so the bisection's first midpoint is 72: it was run, and it once ran
    again (a second row of the same count in the table)."""
    b = 32
    coarse = [_Run(b, f) for f in SEARCH_STAGGERED]
    for r in coarse:
        r.partial_share = 0.002 * (r.in_flight - b)            # 72: 8%, 80: 9.6%
        if r.in_flight == 72:
            r.steady_step_s = 100.0                             # within, but slower than 64
    asked = []

    def run_at(f):
        asked.append(in_flight(b, f))
        r = _Run(b, f)
        r.partial_share = 0.002 * (r.in_flight - b)
        return r

    runs = refine_within(coarse, 0.09, b, run_at)
    counts = [r.in_flight for r in runs]
    assert asked and not set(asked) & {r.in_flight for r in coarse}
    assert len(set(counts)) == len(counts) and counts == sorted(counts)
    assert max(r.in_flight for r in runs if r.partial_share <= 0.09) == 77   # 32 + floor(0.09 / 0.002)
