"""v3's tail lane asks whether restarted runaways run away again (``pdsr_sdk.policies.runaway_recurrence``):
a replay repeats them and keeps the lane; fresh draws (``restart_lengths: redraw``) do not, and turn it off."""

from __future__ import annotations

import pytest

from pdsr_sdk.policies.runaway_recurrence import RunawayRecurrence, earlier_peak
from pdsr_sdk.sim.steps import run_steps
from pdsr_sdk.traces import synth_trace
from sim_cases import small_cfg


def test_earlier_peak_is_the_longest_generation_before_the_last_restart():
    assert earlier_peak([]) == 0
    assert earlier_peak([(0, 40), (40, 30)]) == 0                        # never restarted (a move continues)
    assert earlier_peak([(0, 40), (40, 30), (0, 10), (10, 5)]) == 70     # restarted after 70 tokens
    assert earlier_peak([(0, 90), (0, 20), (20, 20), (0, 5)]) == 90      # twice: the longest earlier one


def test_an_outcome_counts_once_per_generation_when_it_runs_away_again_or_finishes_short():
    r = RunawayRecurrence(min_outcomes=3, share=0.5)
    r.observe(1, 0, 4000, 0, 1000.0, finished=False)          # never restarted: nothing to learn
    r.observe(2, 1, 4000, 300, 1000.0, finished=True)         # was not a runaway before its restart
    assert (r.outcomes, r.known, r.recurs) == (0, False, True)
    r.observe(3, 1, 200, 4096, 1000.0, finished=False)        # running, below the threshold: not known yet
    assert r.outcomes == 0
    r.observe(3, 1, 350, 4096, 1000.0, finished=True)         # finished short: no recurrence
    r.observe(4, 1, 1200, 2500, 1000.0, finished=False)       # past the threshold again: a recurrence at once
    r.observe(4, 1, 1900, 2500, 1000.0, finished=False)       # ... counted once
    r.observe(4, 1, 2500, 2500, 1000.0, finished=True)
    assert (r.outcomes, r.recurred, r.known, r.recurs) == (2, 1, False, True)
    r.observe(5, 1, 100, 4096, 1000.0, finished=True)
    assert (r.outcomes, r.recurred, r.known, r.recurs) == (3, 1, True, False)   # 1 of 3 < half
    r.observe(3, 2, 3000, 4096, 1000.0, finished=False)       # sample 3 restarted again: a new generation
    assert (r.outcomes, r.recurred, r.recurs) == (4, 2, True)  # 2 of 4: half


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
                        policy_settings={"v3": {"lane": {"evidence": 2}}})
        facts[rl] = run_steps(trace, cfg, "v3", 0.5).policy_facts
    replay, redraw = facts["replay"], facts["redraw"]
    assert replay["restarted_runaways"] >= 2 and replay["recurred"] == replay["restarted_runaways"]
    assert replay["tail_lane"] and replay["lane_engines"] == ["heavy-0"]
    assert redraw["restarted_runaways"] >= 2 and redraw["recurred"] < redraw["restarted_runaways"] / 2
    assert not redraw["tail_lane"] and redraw["lane_engines"] == []


def test_a_lane_asked_for_always_stays_whatever_the_restarts_did():
    cfg = small_cfg(policy="v3", max_staleness=1, restart_lengths="redraw", steps=16, batch_size=16,
                    policy_settings={"v3": {"lane": {"evidence": 2, "mode": "always"}}})
    facts = run_steps(_trace(2), cfg, "v3", 0.5).policy_facts    # 'auto' drops the lane here (above)
    assert facts["tail_lane"] and facts["lane_engines"] == ["heavy-0"]


def _first_generation_moves_to_the_lane(run) -> int:
    """Segments that continue a never-restarted sample on a heavy (lane) engine after another engine."""
    moves = 0
    for g in run.groups:
        for s in g.samples:
            generation = -1
            for prev, seg in zip([None] + s.segments[:-1], s.segments):
                if seg.start_token == 0:
                    generation += 1
                elif generation == 0 and prev.engine != seg.engine and seg.engine.startswith("heavy"):
                    moves += 1
    return moves


@pytest.mark.parametrize("seed", [2, 3])
@pytest.mark.parametrize("slots, lane_engines", [(64, ["heavy-0", "heavy-1"]), (8, ["heavy-0"])],
                         ids=["room", "full"])
def test_before_the_verdict_only_restarted_runaways_go_to_the_lane(seed, slots, lane_engines):
    """Whether the stream leaves slots free (64 a engine: every heavy engine is lane) or fills every slot (8:
    one is), a first-generation runaway stays where it runs until restarts are seen to repeat runaways (here
    never: lane_evidence is out of reach); 'always' moves such samples. Migration is off: until the lane opens
    (the first restarted runaway) it moves the tail, to either pool."""
    profile = dict(max_num_seqs=slots, kv_cache_tokens=65536, block_size=16)
    moved = {}
    for lane in ("auto", "always"):
        cfg = small_cfg(policy="v3", max_staleness=1, steps=16, batch_size=16, heavy=2,
                        profiles={"fast": profile, "heavy": profile}, restart_lengths="replay",
                        policy_settings={"v3": {"lane": {"evidence": 1000, "mode": lane}, "disable": ["migration"]}})
        run = run_steps(_trace(seed), cfg, "v3", 0.5, keep_groups=True)
        assert run.policy_facts["lane_engines"] == lane_engines
        moved[lane] = _first_generation_moves_to_the_lane(run)
    assert moved["auto"] == 0 and moved["always"] > 0
