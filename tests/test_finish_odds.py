"""v3's early restarts read :class:`~pdsr_sdk.policies.finish_odds.FinishOdds`: the tokens a sample makes in a
step, and the chance that a sample ends within so many more tokens, the restarted ones counted as longer than
they ran. Each read is held to a plain loop over the same numbers."""

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
    odds = FinishOdds(maxlen=6, quantile=0.9)
    censored_all: list[int] = []
    gen = {k: 0 for k in range(40)}
    restarts = {k: 0 for k in range(40)}
    peak = {k: 0 for k in range(40)}
    for step in range(6):
        before = dict(gen), dict(restarts)
        rows = []
        for k in gen:
            if rng.random() < 0.15:         # restarted since the last step end, after running on
                peak[k] = gen[k] + rng.randrange(1, 300)
                restarts[k] += 1
                gen[k] = rng.randrange(0, 50)
            else:
                gen[k] += rng.randrange(0, 400)
            rows.append((k, restarts[k], gen[k], False, peak[k]))
        odds.step_end(rows)
        # the loop: of those seen at the last step end (none at the first), the restarted ones add their peak
        # and the others what they made
        if step:
            censored_all += [peak[k] for k in gen if restarts[k] > before[1][k]]
            made = sorted(gen[k] - before[0][k] for k in gen if restarts[k] == before[1][k])
            assert odds.rate == made[min(len(made) - 1, int(0.9 * len(made)))]
        else:
            assert odds.rate is None
        assert odds.censored_sorted == sorted(censored_all[-6:])
        finished = sorted(rng.randrange(1, 4096) for _ in range(rng.randrange(0, 30)))
        for _ in range(50):
            g, t = rng.randrange(0, 4096), rng.randrange(0, 2000)
            assert odds.chance(g, t, finished) == pytest.approx(loop_chance(g, t, finished, censored_all[-6:]))


def test_a_finished_sample_leaves_and_a_sample_seen_once_tells_no_rate():
    odds = FinishOdds(maxlen=10, quantile=0.5)
    odds.step_end([("a", 0, 100, False, 0), ("b", 0, 40, False, 0)])
    assert odds.rate is None                                   # nothing seen at two step ends yet
    odds.step_end([("a", 0, 900, False, 0), ("b", 0, 60, True, 0), ("c", 0, 10, False, 0)])
    assert odds.rate == 800                                    # only a ran across the whole step
    odds.step_end([("a", 1, 5, False, 1300), ("c", 0, 500, False, 0)])
    assert (odds.rate, odds.censored_sorted) == (490, [1300])  # a restarted after reaching 1,300
    # nothing finished past 1,200: the one restarted at 1,300 ran longer, and did not end
    assert odds.chance(1200, 5000, []) == 0.0
    assert odds.chance(1200, 5000, [1250]) == 0.5
    assert odds.chance(5000, 10, [100]) == 0.0                 # nothing seen that long
