"""v3's early restarts read :class:`~pdsr_sdk.policies.finish_odds.FinishOdds`: the tokens a sample makes in a
step, and the chance that a sample ends within so many more tokens, the restarted ones counted as longer than
they ran, over the last few steps. Each read is held to a plain loop over the same numbers."""

from __future__ import annotations

import random

import pytest

from pdsr_sdk.policies.finish_odds import FinishOdds


def loop_chance(generated, tokens, finished, censored):
    ends = longer = 0
    for n in finished:
        if n > generated:
            longer += 1
            ends += n <= generated + tokens
    longer += sum(1 for c in censored if c > generated)
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
            assert odds.chance(g, t) == pytest.approx(loop_chance(g, t, fin, cen))


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
