"""Fresh lengths for restarted samples (``pdsr simulate --steps --restart-lengths redraw``).

A replay forces every sample to its recorded length, also after a restart. In RL a restart samples
the response afresh, under newer weights: its length is a new draw from its prompt's distribution,
and a response that ran to the cap (a loop) need not run there again. The draw modelled here: the
cap with the prompt's chance of reaching it, else one of the group's recorded lengths that did not
reach it (the prompt's own spread).

A group of eight says little about a 0.3% event: the group's own share (1 in 8 where one sibling ran
away) would make runaways far likelier after a restart than before it. So the prompt's chance is
the posterior mean under a beta prior fitted to the whole trace by moments (:func:`cap_prior`):
where runaways strike samples independently of their prompt (``pdsr trace synth``'s default) the
fit finds no spread between prompts and the chance is the trace's pooled share; where they cluster
by prompt (``--runaway-concentration k``: a Beta prior of strength k) a group that ran away
before is likelier to again. Plain numbers in and out: no engines, no config.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Sequence


def cap_prior(capped: Sequence[Sequence[bool]]) -> tuple[float, float]:
    """(share, strength): a beta prior Beta(share x strength, (1 - share) x strength) of a prompt's chance
    to reach the cap, fitted by moments to every group's flags. ``share`` is the pooled share; the
    intraclass correlation rho of the flags within a group gives ``strength`` = 1 / rho - 1, infinite
    (every prompt alike) when the groups vary no more than independent draws would."""
    n = [len(g) for g in capped]
    k = [sum(1 for c in g if c) for g in capped]
    total = sum(n)
    if not total:
        return 0.0, math.inf
    p = sum(k) / total
    if p <= 0.0 or p >= 1.0:
        return p, math.inf
    # E[(k - n p)^2] = n p (1 - p) (1 + (n - 1) rho) for a beta-binomial group of n
    spread = sum((ki - ni * p) ** 2 for ki, ni in zip(k, n))
    binomial = p * (1 - p) * total
    pairs = p * (1 - p) * sum(ni * (ni - 1) for ni in n)
    rho = (spread - binomial) / pairs if pairs else 0.0
    if rho <= 0.0:
        return p, math.inf
    return p, max(0.0, 1.0 / min(rho, 1.0) - 1.0)


def cap_chance(capped: Sequence[bool], share: float, strength: float) -> float:
    """A prompt's chance to reach the cap given its group's flags: the posterior mean under the prior."""
    if math.isinf(strength):
        return share
    return (sum(1 for c in capped if c) + share * strength) / (len(capped) + strength)


def redraw_length(lengths: Sequence[int], capped: Sequence[bool], cap: int, chance: float, key: str) -> int:
    """A fresh length for a restarted sample of a group with recorded ``lengths`` (``capped``: which
    reached the response cap ``cap``): ``cap`` with probability ``chance``, else one of the uncapped
    lengths, each as likely (``cap`` if every one was capped). ``key`` names the draw (sample and
    restart): the same key gives the same length."""
    rng = random.Random(zlib.crc32(key.encode()))
    if rng.random() < chance:
        return cap
    pool = [n for n, c in zip(lengths, capped) if not c]
    return rng.choice(pool) if pool else cap
