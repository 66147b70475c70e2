"""Staleness in a step stream: which samples a policy version makes too stale, their one restart, and the groups
a step must consume (due)."""

from __future__ import annotations

from pdsr_sdk.dispatch.steps.state import StreamState
from pdsr_sdk.dispatch.types import Group, Sample, oldest_version
from pdsr_sdk.errors import PdsrError


class StalenessRules(StreamState):
    """The bound S, the deadline D and the samples restarted for staleness (set by :meth:`_init_staleness`)."""

    def _init_staleness(self, max_staleness: int | None, group_deadline: int | None) -> None:
        self.s = max_staleness
        self.d = group_deadline
        self.stale_restarts = 0
        self.restarted: dict[int, int] = {}    # id(sample) -> its restarts count once the staleness restart is done
        self.watch: dict[int, Group] = {}      # groups with such a sample (checked by _due)

    def _due(self) -> set[int]:
        """Groups that must be consumed at this step: at their deadline, or holding a sample that was
        restarted for staleness once and would be too stale after the next version change."""
        due: set[int] = set()
        if self.d is not None:
            due.update(key for key, (_, step) in self.flying.items() if step + self.d <= self.t)
        if self.s is not None:
            for key in list(self.watch):
                if key not in self.flying:
                    del self.watch[key]
                elif self._stale(self.watch[key], self.sched.policy_version + 1, restarted_only=True):
                    due.add(key)
        return due

    def blocked_by(self, version: int) -> list[Sample]:
        """Samples of unconsumed groups, already restarted for staleness once, that a change to ``version``
        now would make too stale again: such a change must wait for the step's end (which consumes their
        groups when ``version`` is the next one: they are due)."""
        if self.s is None:
            return []
        chosen = {id(g) for g in self.pending}   # an ended step's groups: consumed at its end version
        return [s for key, g in self.watch.items() if key in self.flying and key not in chosen
                for s in g.samples if self._restarted(s) and self._too_old(s, version)]

    def version_changed(self) -> None:
        """The owner changed the scheduler's policy version in the middle of a step (after checking
        :meth:`blocked_by`): restart what is too stale for it now. After a step has ended and before
        :meth:`refill`, nothing happens here: the ended step's groups are chosen, and refill restarts the
        rest."""
        if self.closing or self.done:
            return
        if self.s is not None:
            for g, _ in list(self.flying.values()):
                self._restart_stale(g, self.sched.policy_version)
        self.maybe_end()   # a step held for this version may end now

    def _leave(self, group: Group) -> None:
        """``group`` left the stream (consumed, filtered out or dropped): forget its samples' staleness restarts, which
        only groups in flight are asked about (keyed by id, a sample kept after its group left could be mistaken for
        a new one at its address, and a long run would keep them all)."""
        self.watch.pop(id(group), None)
        for s in group.samples:
            self.restarted.pop(id(s), None)

    def _restarted(self, s: Sample) -> bool:
        """Whether a staleness restart of ``s`` took effect (one of a running sample is only asked for
        until its abort comes back; if that finds its last token generated, it never happened)."""
        want = self.restarted.get(id(s))
        return want is not None and s.restarts >= want

    def _too_old(self, s: Sample, version: int) -> bool:
        """Whether ``s``'s oldest kept token would be more than S versions old at ``version``."""
        v = oldest_version(s)
        return self.s is not None and v is not None and version - v > self.s

    def _stale(self, group: Group, version: int, *, restarted_only: bool = False) -> bool:
        assert self.s is not None
        return any(self._too_old(s, version) and (not restarted_only or self._restarted(s)) for s in group.samples)

    def _restart_stale(self, group: Group, version: int) -> None:
        """Restart the group's samples whose oldest kept token is more than S versions older than
        ``version`` (each at most once: ``_due`` makes the step wait rather than restart one again)."""
        if id(group) not in self.flying or self.s is None:
            return
        for s in group.samples:
            if self._too_old(s, version):
                if self._restarted(s):
                    raise PdsrError(f"step {self.t}: sample {s.key} would be restarted for staleness a second "
                                    f"time (the step should have waited for it; a bug)")
                self._restart_once(s)
                self.complete.pop(id(group), None)

    def _restart_once(self, s: Sample) -> None:
        """The sample's one staleness restart: from now on its group is watched (``_due``)."""
        self.restarted[id(s)] = s.restarts + 1
        self.watch[id(s.group)] = s.group
        self.sched.restart(s)
        self.stale_restarts += 1
