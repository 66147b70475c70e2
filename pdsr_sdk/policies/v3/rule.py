"""What a v3 rule is: a small object with the hooks it needs, called by the coordinator (:mod:`.policy`).

The coordinator hands each :class:`~pdsr_sdk.dispatch.protocols.Dispatcher` hook to its rules in a fixed order
(``V3Policy``'s tuples per hook), after its own bookkeeping in the shared :class:`~.ledger.Ledger`. A rule
reads the ledger and the lengths (:class:`~.lengths.Lengths`), keeps its own state, and acts only through the
dispatch context. :class:`BaseRule` gives every hook a no-op default.
"""

from __future__ import annotations

from typing import Protocol

from pdsr_sdk.dispatch.protocols import Engine
from pdsr_sdk.dispatch.types import Group, Sample


class Rule(Protocol):
    """One of v3's rules. The coordinator calls only the hooks listed for the rule in its per-hook order."""

    def on_batch(self, groups: list[Group]) -> None:
        """Groups arrived (a batch, or a stream's next groups); the ledger already knows every live engine."""

    def on_sample_finished(self, sample: Sample) -> None:
        """``sample`` finished; the ledger has already unbooked it (no longer placed, waiting or in the tail)."""

    def on_segment_end(self, sample: Sample, engine: Engine) -> None:
        """``sample`` ended a segment on ``engine`` and keeps running; the ledger already holds its new
        prediction and progress. Bookkeeping only: moves come after every rule has noted the segment."""

    def move(self, sample: Sample, engine: Engine) -> bool:
        """After every rule's ``on_segment_end``: may move ``sample`` away from ``engine``. True if this rule
        is in charge of such moves now (the rules after it are then not asked), whether or not it moved."""

    def on_worker_idle(self, engine: Engine) -> None:
        """``engine`` has a free slot and nothing queued."""

    def on_step_end(self, carried: list[Group]) -> list[Sample]:
        """Partial rollout, a step ended: the samples of ``carried`` groups this rule wants generated again."""

    def on_engine_lost(self, engine: Engine, requeued: list[Sample]) -> None:
        """``engine`` is gone; the ledger has already dropped its books and unbooked ``requeued``."""


class BaseRule:
    """No-op hooks (see :class:`Rule`)."""

    def on_batch(self, groups: list[Group]) -> None:
        pass

    def on_sample_finished(self, sample: Sample) -> None:
        pass

    def on_segment_end(self, sample: Sample, engine: Engine) -> None:
        pass

    def move(self, sample: Sample, engine: Engine) -> bool:
        return False

    def on_worker_idle(self, engine: Engine) -> None:
        pass

    def on_step_end(self, carried: list[Group]) -> list[Sample]:
        return []

    def on_engine_lost(self, engine: Engine, requeued: list[Sample]) -> None:
        pass
