"""v3 and multi-turn samples (an agent runs each): the room of a sample waiting on its environment goes to others,
and its next turn goes back to the engine holding its prefix.

A turn's end parks the sample (the scheduler frees its slot); the ledger drops it from its engine's books, so that
the ranked pool's waiting work takes the room while the agent works. When its agent continues it, it is booked
again on the engine that ran its last turn (its context is cached there; the scheduler queues the turn first
there). Left out because they did not pay (docs/notes/multi-turn.md): moving a next turn to a less loaded engine by
the turns its group's finished siblings took, and ranking groups by their finished samples' durations."""

from __future__ import annotations

from pdsr_sdk.dispatch.protocols import Engine
from pdsr_sdk.dispatch.types import Sample
from pdsr_sdk.policies.v3.ledger import Ledger
from pdsr_sdk.policies.v3.lengths import Lengths
from pdsr_sdk.policies.v3.rule import BaseRule


class Turns(BaseRule):
    """Takes a parked multi-turn sample out of its engine's books and books its next turn there again."""

    def __init__(self, ledger: Ledger, lengths: Lengths) -> None:
        self.ledger = ledger
        self.lengths = lengths

    def parked(self, sample: Sample) -> None:
        """``sample``'s turn ended: out of its engine's books while its environment works."""
        self.ledger.unplace(sample)

    def next_turn(self, sample: Sample, home: Engine) -> None:
        """``sample``'s next turn is about to queue on ``home``: booked there, at its expected length."""
        if home.name in self.ledger.assigned:
            self.ledger.place(sample, home, self.lengths.expected(sample))
