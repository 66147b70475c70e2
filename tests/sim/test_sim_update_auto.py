"""`pdsr simulate --steps --update auto`: each over-provision value runs with every engine loading at the step's
end (all) and with a staggered update, and the search names the fastest of either within the partial-share
budget. Held to the two updates simulated one at a time."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.sim.steps import SEARCH, SEARCH_STAGGERED, curve_values, run_steps, simulate_steps
from pdsr_sdk.traces import write_trace_jsonl
from sim_cases import small_cfg, small_trace

STREAM = dict(policy="v3", max_staleness=2, kv_on_update="keep", restart_lengths="replay")


def by_run(report):
    return {(r.update, r.in_flight): (r.steady_step_s, r.partial_share, r.off_policy_share) for r in report.runs}


@pytest.mark.parametrize("budget", [None, 0.1])
def test_auto_runs_both_updates_as_each_alone_and_picks_the_fastest_within(budget):
    trace = small_trace(groups=160)
    alone = {u: simulate_steps(trace, small_cfg(**STREAM, update=u, max_partial_share=budget))
             for u in ("all", "staggered")}
    auto = simulate_steps(trace, small_cfg(**STREAM, update="auto", max_partial_share=budget))
    # the same runs, each with the numbers of its update simulated alone (the same draws, a deterministic clock)
    assert by_run(auto) == {**by_run(alone["all"]), **by_run(alone["staggered"])}
    assert [r.update for r in auto.runs] == (["all"] * len(alone["all"].runs)
                                             + ["staggered"] * len(alone["staggered"].runs))
    assert auto.baseline_steps_s == alone["all"].baseline_steps_s
    rows = auto.rows()
    assert [r["update"] for r in rows] == [r.update for r in auto.runs]
    assert "update" not in alone["all"].rows()[0]          # one update: no column for it
    if budget is None:
        assert auto.fastest_within() is None
        return
    picks = [rep.fastest_within() for rep in alone.values()]
    want = min((p for p in picks if p is not None), key=lambda r: r.steady_step_s)
    pick = auto.fastest_within()
    assert (pick.update, pick.in_flight, pick.steady_step_s) == (want.update, want.in_flight, want.steady_step_s)
    assert pick.partial_share <= budget
    for update, rep in alone.items():   # each update's own pick, as its search alone names it
        mine, theirs = auto.fastest_within(update), rep.fastest_within()
        assert (mine.in_flight, mine.steady_step_s) == (theirs.in_flight, theirs.steady_step_s)
    d = auto.to_dict()
    assert (d["update"], d["fastest_within"], d["fastest_within_update"]) == ("auto", pick.over_provision,
                                                                            pick.update)
    assert {r["update"] for r in d["runs"]} == {"all", "staggered"}


def test_auto_searches_each_update_over_its_own_grid():
    big = dict(STREAM, step_groups=512, max_partial_share=0.1)   # B = 512: no two values keep the same count
    assert curve_values(small_cfg(**big, update="all")) == SEARCH
    for update in ("staggered", "auto"):   # auto: the values its staggered runs need groups for (the most)
        assert curve_values(small_cfg(**big, update=update)) == SEARCH_STAGGERED


def test_auto_is_checked_where_it_cannot_run():
    from pdsr_sdk.rollout.config import RolloutConfig

    with pytest.raises(ValueError, match="update: auto: .* needs pipeline off"):
        small_cfg(update="auto", max_staleness=2, pipeline=True)
    with pytest.raises(ValueError, match="update: auto: .* needs max_staleness unset or at least 1"):
        small_cfg(update="auto", max_staleness=0)
    with pytest.raises(ValueError, match="update"):         # a session has one update: all or staggered
        RolloutConfig(update="auto", steps=3, max_staleness=1)
    with pytest.raises(ConfigError, match="update: a run has one update, all or staggered; got 'auto'"):
        run_steps(small_trace(), small_cfg(**STREAM, update="auto"), "v3", 0.5)


def test_cli_names_the_update_of_the_pick_and_the_other_updates_best(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace_jsonl(small_trace(groups=160), path)
    args = ["simulate", "--trace", str(path), "--policy", "v3", "--fast", "2", "--heavy", "1", "--batch-size", "6",
            "--steps", "6", "--max-staleness", "2", "--kv-on-update", "keep", "--update", "auto",
            "--max-partial-share", "0.1", "--no-timeline", "--quiet", "--out-dir", str(tmp_path / "o"),
            ]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "each F with update all and staggered" in res.output
    d = json.loads((tmp_path / "o" / "steps.json").read_text())
    pick = next(r for r in d["runs"] if r["over_provision"] == d["fastest_within"]
                and r["update"] == d["fastest_within_update"])
    assert (f"fastest within 10.0% partial tokens: update {pick['update']}, F = {pick['over_provision']:.3g} "
            f"({pick['in_flight']} groups in flight)") in res.output
    other = [r for r in d["runs"] if r["update"] != pick["update"] and r["partial_share"] <= 0.1]
    best = min(other, key=lambda r: r["steady_step_s"])
    assert (f"with update {best['update']}: fastest within F = {best['over_provision']:.3g}, "
            f"{best['ratio']:.3f}x (partial {best['partial_share']:.1%}") in res.output
    # a session runs one update: pdsr rollout has no auto
    res = CliRunner().invoke(cli, ["rollout", "--update", "auto", "--steps", "2"])
    assert res.exit_code == 2 and "'auto' is not one of 'all', 'staggered'" in res.output


def test_the_family_bench_takes_the_faster_update_and_says_which():
    """bench/stream_oracle.py --updates auto: its search is simulate's with update auto, so its pick is the faster
    of its own searches with each update alone, and it says which update that was."""
    from support import load_bench

    oracle = load_bench("stream_oracle")
    trace = small_trace(groups=160)
    alone = {u: oracle.fastest_within(trace, "v3", 6, 0.1, steps=6, update=u) for u in ("all", "staggered")}
    got = oracle.fastest_within(trace, "v3", 6, 0.1, steps=6, update="auto")
    want = min((a for a in alone.values() if a is not None), key=lambda a: a[1])
    assert got == want and got[5] in ("all", "staggered")
