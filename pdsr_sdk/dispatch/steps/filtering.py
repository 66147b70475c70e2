"""Dynamic sampling in a step stream: groups whose rewards fail the filter leave the stream, and new ones launch
while those in flight are not expected to bring the step's B passing ones."""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from pdsr_sdk.dispatch.config import GroupFilterConfig
from pdsr_sdk.dispatch.steps.counts import adaptive_in_flight, needed_launches
from pdsr_sdk.dispatch.steps.state import StreamState
from pdsr_sdk.dispatch.types import DROPPED, Group
from pdsr_sdk.errors import DataError, RunError


class FilterBoundError(RunError):
    """Dynamic sampling reached ``max_launch_factor`` x B launches in a step and even all the groups in flight
    passing cannot bring its B (the owner may add what it knows of why, such as rewards that failed)."""


class GroupFiltering(StreamState):
    """The filter, its pass rate and the groups it took out or a step's end dropped (set by :meth:`_init_filter`)."""

    def _init_filter(self, step_groups: int, max_staleness: int | None, group_filter: Callable[[Group], bool] | None,
                     adapt: bool, filter_config: GroupFilterConfig | None,
                     on_top_up_error: Callable[[DataError], None] | None = None) -> None:
        self.group_filter = group_filter
        #: the owner's handler of a DataError its ``new_groups`` raised for a top-up (None: it ends the run)
        self.on_top_up_error = on_top_up_error
        self.adapt = adapt and group_filter is not None
        #: on-policy dynamic sampling drops the groups still generating at a step's end (see the module)
        self.drop_stale = group_filter is not None and max_staleness == 0
        #: the groups dropped at the end of the step consumed last (see ``dropped`` in :class:`StepRecord`)
        self.dropped: list[Group] = []
        self.last_dropped: list[Group] = []
        self._dropped_tokens = 0
        filter_config = filter_config or GroupFilterConfig.model_validate({})
        self.min_pass_rate = filter_config.min_pass_rate
        factor = filter_config.max_launch_factor
        #: dynamic sampling: the most groups one step may launch (None: no bound)
        self.max_launches = None if group_filter is None or factor is None else math.ceil(factor * step_groups)
        #: groups the filter judged and passed over the whole run (the pass-rate estimate)
        self.judged = 0
        self.passed = 0
        #: the groups the filter took out during the current step (the owner may write them), and all of them
        #: when ``keep_groups``
        self.filtered: list[Group] = []
        #: the filtered groups of the step consumed last
        self.last_filtered: list[Group] = []
        self.all_filtered: list[Group] = []
        self._filtered_tokens = 0

    def _adapt_target(self) -> None:
        """At a step's start, under dynamic sampling without a given F: groups in flight from the pass rate."""
        if self.adapt:
            self.spec = dataclasses.replace(self.spec, in_flight=adaptive_in_flight(self.b, self.pass_rate))

    @property
    def pass_rate(self) -> float:
        """The filter's pass rate so far, (passed + 1) / (judged + 2), at least ``min_pass_rate`` (1 without a
        filter)."""
        if self.group_filter is None:
            return 1.0
        return max(self.min_pass_rate, (self.passed + 1) / (self.judged + 2))

    def _judge(self, group: Group) -> bool:
        """Dynamic sampling: whether a complete group passes the filter. One that does not leaves the stream
        now (:attr:`filtered`), and new groups launch while those in flight are not expected to bring the
        step's B passing ones (not after the step's groups are chosen)."""
        assert self.group_filter is not None
        self.judged += 1
        if self.group_filter(group):
            self.passed += 1
            return True
        del self.flying[id(group)]
        self._leave(group)
        self.filtered.append(group)
        if self.keep:
            self.all_filtered.append(group)
        self._filtered_tokens += sum(s.num_generated for s in group.samples)
        # after the scheduler's current callback (this one may be inside it)
        self.clock.call_later(0.0, lambda: self.sched.guarded(self._top_up))
        return False

    def _top_up(self) -> None:
        """Launch what the groups in flight are not expected to bring of this step's B passing ones, within
        the step's bound (``max_launches``): at the bound the groups in flight run on, and the run ends with an
        error only once even all of them passing cannot bring B, as verl's trainer raises only after its last
        allowed generation batch is judged and still short."""
        if self.closing or self.done or self.exhausted:
            return
        incomplete = len(self.flying) - len(self.complete)
        need = self.b - len(self.complete)
        count = needed_launches(need, incomplete, self.pass_rate)
        if count and self.max_launches is not None and self._step_launches + count > self.max_launches:
            room = max(0, self.max_launches - self._step_launches)
            if incomplete + room < need:
                raise FilterBoundError(
                    f"dynamic sampling: step {self.t} has launched {self._step_launches} groups and "
                    f"{len(self.complete)} of the {self.b} that pass the filter are complete, with {incomplete} more "
                    f"generating ({self.passed} of {self.judged} groups passed so far); "
                    f"filter_groups.max_launch_factor bounds a step at "
                    f"{self.max_launches}. Nearly every group's rewards are all equal: the prompts are too hard or too "
                    f"easy for this model (or its reward never tells right from wrong). Raise the bound, or set it to "
                    f"null for no bound")
            count = room
        try:
            self.launch(count)
        except DataError as exc:
            if self.on_top_up_error is None:
                raise
            # the owner refused a prompt, as it would at a step's first launch: the step ends with that error, and
            # the stream waits as after a step's end (nothing launches or ends) until the next refill
            self.closing = True
            self.on_top_up_error(exc)
            return
        self.maybe_end()

    def _drop(self, group: Group) -> None:
        """Take a group out of the stream for good: its unfinished samples finish as ``dropped``."""
        del self.flying[id(group)]
        self.complete.pop(id(group), None)
        self._leave(group)
        self.dropped.append(group)
        self._dropped_tokens += sum(s.num_generated for s in group.samples)
        for smp in group.samples:
            self.sched.finish(smp, DROPPED)   # a finished one stays as it is
