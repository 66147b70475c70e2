"""v3's tail lane asks whether restarted runaways run away again (``pdsr_sdk.policies.runaway_recurrence``):
a replay repeats them and keeps the lane; fresh draws (``restart_lengths: redraw``) do not, and turn it off."""

from __future__ import annotations

import pytest

from pdsr_sdk.policies.runaway_recurrence import RunawayRecurrence, earlier_peak
from pdsr_sdk.sim.steps import run_steps
from pdsr_sdk.traces import synth_trace
from test_sim_steps import small_cfg


def test_earlier_peak_is_the_longest_generation_before_the_last_restart():
    assert earlier_peak([]) == 0
    assert earlier_peak([(0, 40), (40, 30)]) == 0                        # never restarted (a move continues)
    assert earlier_peak([(0, 40), (40, 30), (0, 10), (10, 5)]) == 70     # restarted after 70 tokens
    assert earlier_peak([(0, 90), (0, 20), (20, 20), (0, 5)]) == 90      # twice: the longest earlier one


def test_the_lane_stays_until_enough_outcomes_then_follows_their_share():
    r = RunawayRecurrence(min_outcomes=3, share=0.5)
    r.note(4000, 300, 1000.0)          # was not a runaway: no outcome
    assert (r.outcomes, r.recurs) == (0, True)
    r.note(200, 4096, 1000.0)
    r.note(350, 2500, 1000.0)
    assert (r.outcomes, r.recurred, r.recurs) == (2, 0, True)           # not enough evidence yet
    r.note(300, 4096, 1000.0)
    assert (r.outcomes, r.recurred, r.recurs) == (3, 0, False)
    for _ in range(3):
        r.note(4096, 4096, 1000.0)
    assert (r.outcomes, r.recurred, r.recurs) == (6, 3, True)           # half of them again


def _trace(seed):
    # a few runaways (0.4% at 1,500 tokens) among ~120-token responses: they outlive S = 1 and are restarted
    return synth_trace(groups=300, n=8, seed=seed, median_length=120, max_length=1500, runaway_frac=0.004,
                       prompt_len_min=5, prompt_len_max=100)


@pytest.mark.parametrize("seed", [2, 3])
def test_v3_keeps_its_lane_where_restarts_repeat_runaways_and_drops_it_where_they_are_fresh(seed):
    trace = _trace(seed)
    facts = {}
    for rl in ("replay", "redraw"):
        cfg = small_cfg(policy="v3", max_staleness=1, restart_lengths=rl, steps=16, batch_size=16,
                        policy_settings={"v3": {"lane_evidence": 2}})
        facts[rl] = run_steps(trace, cfg, "v3", 0.5).policy_facts
    replay, redraw = facts["replay"], facts["redraw"]
    assert replay["restarted_runaways"] >= 2 and replay["recurred"] == replay["restarted_runaways"]
    assert replay["tail_lane"] and replay["lane_engines"] == ["heavy-0"]
    assert redraw["restarted_runaways"] >= 2 and redraw["recurred"] < redraw["restarted_runaways"] / 2
    assert not redraw["tail_lane"] and redraw["lane_engines"] == []


def test_a_lane_asked_for_always_stays_whatever_the_restarts_did():
    cfg = small_cfg(policy="v3", max_staleness=1, restart_lengths="redraw", steps=16, batch_size=16,
                    policy_settings={"v3": {"lane_evidence": 2, "tail_lane": "always"}})
    facts = run_steps(_trace(2), cfg, "v3", 0.5).policy_facts
    assert facts["restarted_runaways"] >= 2 and facts["tail_lane"]
