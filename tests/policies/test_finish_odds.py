"""v3's early restarts read :class:`~pdsr_sdk.policies.finish_odds.FinishOdds`: the tokens a sample makes in a
step, and the chance that a sample ends within so many more tokens, the restarted ones counted as longer than
they ran (over the last few steps) and so are the ones still running. Each read is held to a plain loop over
the same numbers."""

from __future__ import annotations

import random

import pytest

from pdsr_sdk.policies.finish_odds import FinishOdds


def loop_chance(generated, tokens, finished, censored, running):
    ends = longer = 0
    for n in finished:
        if n > generated:
            longer += 1
            ends += n <= generated + tokens
    longer += sum(1 for c in censored if c > generated)
    longer += sum(1 for r in running if r > generated)
    return ends / longer if longer else 0.0


@pytest.mark.parametrize("seed", range(5))
def test_chance_and_rate_match_a_plain_loop(seed):
    rng = random.Random(seed)
    window = 3
    odds = FinishOdds(steps=window, quantile=0.9)
    gen = {k: 0 for k in range(40)}
    restarts = {k: 0 for k in range(40)}
    wasted = {k: 0 for k in range(40)}
    per_step: list[tuple[list[int], list[int]]] = []   # the loop's own record: finished, censored
    for step in range(8):
        before = dict(gen), dict(restarts)
        rows = []
        threw = {}
        for k in gen:
            if rng.random() < 0.15:         # restarted since the last step end, after running on
                threw[k] = gen[k] + rng.randrange(1, 300)
                wasted[k] += threw[k]
                restarts[k] += 1
                gen[k] = rng.randrange(0, 50)
            else:
                gen[k] += rng.randrange(0, 400)
            rows.append((k, restarts[k], gen[k], False, wasted[k]))
        finished = [rng.randrange(1, 4096) for _ in range(rng.randrange(0, 30))]
        odds.step_end(rows, finished)
        # the loop: of those seen at the last step end (none at the first), the restarted ones add the tokens
        # they threw away and the others what they made
        censored = [threw[k] for k in gen if step and k in threw]
        per_step = (per_step + [(finished, censored)])[-window:]
        if step:
            made = sorted(gen[k] - before[0][k] for k in gen if restarts[k] == before[1][k])
            assert odds.rate == made[min(len(made) - 1, int(0.9 * len(made)))]
        else:
            assert odds.rate is None
        fin = [n for f, _ in per_step for n in f]
        cen = [n for _, c in per_step for n in c]
        assert odds.censored_sorted == sorted(cen) and odds.finished_sorted == sorted(fin)
        for _ in range(50):
            g, t = rng.randrange(0, 4096), rng.randrange(0, 2000)
            assert odds.chance(g, t) == pytest.approx(loop_chance(g, t, fin, cen, list(gen.values())))


def test_a_finished_sample_leaves_and_a_sample_seen_once_tells_no_rate():
    odds = FinishOdds(steps=2, quantile=0.5)
    odds.step_end([("a", 0, 100, False, 0), ("b", 0, 40, False, 0)], [])
    assert odds.rate is None                                   # nothing seen at two step ends yet
    odds.step_end([("a", 0, 900, False, 0), ("b", 0, 60, True, 0), ("c", 0, 10, False, 0)], [60])
    assert odds.rate == 800                                    # only a ran across the whole step
    odds.step_end([("a", 1, 5, False, 1300), ("c", 0, 500, False, 0)], [1250])
    assert (odds.rate, odds.censored_sorted) == (490, [1300])  # a restarted after reaching 1,300
    # past 1,200: 1,250 ended, and the one restarted at 1,300 ran longer
    assert odds.chance(1200, 100) == 0.5
    assert odds.chance(1200, 10) == 0.0
    assert odds.chance(5000, 10) == 0.0                        # nothing seen that long
    odds.step_end([("c", 0, 900, False, 0)], [])
    odds.step_end([("c", 0, 1300, False, 0)], [])
    assert odds.censored_sorted == [] and odds.finished_sorted == []   # both left the two-step window


def test_a_runaway_whose_like_has_not_ended_yet_is_not_certain_to_end():
    """Early in a stream only lengths shorter than the time run so far can have finished: every one finished past
    1,000 ended by 1,300. Two samples still running past 1,500 say that lengths run longer than that."""
    odds = FinishOdds(steps=4, quantile=0.5)
    odds.step_end([("a", 0, 800, False, 0), ("b", 0, 700, False, 0), ("c", 0, 600, False, 0)], [])
    odds.step_end([("a", 0, 1600, False, 0), ("b", 0, 1500, False, 0), ("c", 0, 1400, False, 0)], [1100, 1300])
    assert odds.running_sorted == [1400, 1500, 1600]
    # past 1,000: 1,100 and 1,300 ended within 400 more; a, b and c are still running, longer
    assert odds.chance(1000, 400) == pytest.approx(2 / 5)
    # past 1,450 only the two running ones are known, neither ended
    assert odds.chance(1450, 1000) == 0.0
    odds.step_end([("a", 0, 2400, False, 0), ("b", 0, 1500, True, 0), ("c", 0, 1400, True, 0)], [1500, 1400])
    assert odds.running_sorted == [2400]                       # finished samples leave the running ones
    assert odds.chance(1450, 100) == 0.5                       # past 1,450: 1,500 ended; a, at 2,400, runs on
