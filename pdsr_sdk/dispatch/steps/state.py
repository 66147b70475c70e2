"""What the parts of a :class:`~pdsr_sdk.dispatch.steps.stream.StepStream` read of each other."""

from __future__ import annotations

from pdsr_sdk.dispatch.protocols import Clock
from pdsr_sdk.dispatch.scheduler import Scheduler
from pdsr_sdk.dispatch.types import Group, StreamSpec


class StreamState:
    """The state the stream's parts share, declared once: :class:`~pdsr_sdk.dispatch.steps.stream.StepStream`
    sets it (``watch``: :class:`~pdsr_sdk.dispatch.steps.staleness.StalenessRules`), and its parts
    (staleness, dynamic sampling) read it."""

    sched: Scheduler
    clock: Clock
    #: B (groups a step consumes), and the current step
    b: int
    t: int
    #: what the policy is told with the groups (DispatchContext.stream)
    spec: StreamSpec
    keep: bool
    #: in flight (launched, not consumed): id(group) -> (group, launch step); complete, not consumed, in
    #: completion order; the ended step's groups
    flying: dict[int, tuple[Group, int]]
    complete: dict[int, Group]
    pending: list[Group]
    #: groups holding a sample restarted for staleness (checked by ``_due``)
    watch: dict[int, Group]
    closing: bool
    done: bool
    exhausted: bool
    _launched_now: int
    _step_launches: int

    def launch(self, count: int) -> None:
        raise NotImplementedError

    def maybe_end(self) -> None:
        raise NotImplementedError

    def _leave(self, group: Group) -> None:
        raise NotImplementedError
