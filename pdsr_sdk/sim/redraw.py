"""Fresh lengths for restarted samples (``pdsr simulate --steps --restart-lengths redraw``).

A replay forces every sample to its recorded length, also after a restart. In RL a restart samples
the response afresh, under newer weights: its length is a new draw from its prompt's distribution,
and a response that ran to the cap (a loop) need not run there again. The draw modelled here: the
cap, with the trace's pooled share of responses that reached it; otherwise one of the group's
recorded lengths that did not reach it (the prompt's own spread). The pooled share assumes a
response runs to the cap independently of its prompt, as ``pdsr trace synth`` draws runaways by
default; a group of eight says little about a 0.3% event, and drawing the cap with the group's own
share (1 in 8 where one sibling ran away) would make runaways far likelier after a restart than
before it. Plain numbers in and out: no engines, no config.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence


def capped_share(capped: Sequence[Sequence[bool]]) -> float:
    """The share of responses that reached the cap, over every group's flags."""
    total = sum(len(g) for g in capped)
    return sum(sum(1 for c in g if c) for g in capped) / total if total else 0.0


def redraw_length(lengths: Sequence[int], capped: Sequence[bool], cap: int, share: float, key: str) -> int:
    """A fresh length for a restarted sample of a group with recorded ``lengths`` (``capped``: which
    reached the response cap ``cap``): ``cap`` with probability ``share``, else one of the uncapped
    lengths, each as likely (``cap`` if every one was capped). ``key`` names the draw (sample and
    restart): the same key gives the same length."""
    rng = random.Random(zlib.crc32(key.encode()))
    if rng.random() < share:
        return cap
    pool = [n for n, c in zip(lengths, capped) if not c]
    return rng.choice(pool) if pool else cap
