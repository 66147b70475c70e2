"""The step stream: one multi-step run's events (launches, group ends, a step's end, its consumption and the
next step's refill); the module docstring of :mod:`pdsr_sdk.dispatch.steps` says what a step is."""

from __future__ import annotations

from typing import Callable, Sequence

from pdsr_sdk.dispatch.config import GroupFilterConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.dispatch.steps.filtering import GroupFiltering
from pdsr_sdk.dispatch.steps.record import StepRecord, consumed_tokens
from pdsr_sdk.dispatch.steps.staleness import StalenessRules
from pdsr_sdk.dispatch.scheduler.watch import hook_error, policy_label
from pdsr_sdk.dispatch.types import Group, Sample, StreamSpec, oldest_version
from pdsr_sdk.errors import DataError, PdsrError, RunError


class StepStream(StalenessRules, GroupFiltering):
    """The event handlers of one multi-step run (called by the scheduler and the owner's clock).

    ``new_groups(count)`` builds up to ``count`` new groups (fewer when the data runs out);
    ``on_step_end()`` is called once a step's groups are chosen (:attr:`pending`): the owner bumps the
    policy version (its weight update) and then calls :meth:`advance`. ``check`` verifies every
    consumed sample (:func:`check_consumed`, for runs whose lengths are known in advance).
    ``group_filter(group) -> bool``: dynamic sampling (see the module); the owner calls :meth:`group_done`
    once the group's rewards are in. ``keep_records``: keep every step's :class:`StepRecord` (:attr:`records`) and
    each prompt's launch and consumption step (:attr:`launched_at`, :attr:`consumed_at`), as the simulator's report
    reads them; False keeps the last step's record only, as a session that runs for days needs. ``adapt``: the
    in-flight count follows the measured pass rate (``in_flight`` is then the first step's); ``filter_config``
    gives the estimate's floor and the bound on a step's launches
    (:class:`~pdsr_sdk.dispatch.config.GroupFilterConfig`). ``on_top_up_error(exc)``: a
    DataError ``new_groups`` raised for a top-up in the middle of a step goes to it, and the stream then waits for
    :meth:`refill` as after a step's end (without it, the error ends the run).

    Its parts: :class:`~pdsr_sdk.dispatch.steps.staleness.StalenessRules` (the bound, restarts, due groups) and
    :class:`~pdsr_sdk.dispatch.steps.filtering.GroupFiltering` (dynamic sampling), each setting its own state in
    its ``_init_*``; what they read of the stream is declared in :class:`~pdsr_sdk.dispatch.steps.state.StreamState`.
    """

    def __init__(self, run: DispatchRun, *, step_groups: int, in_flight: int, steps: int | None,
                 max_staleness: int | None, group_deadline: int | None,
                 new_groups: Callable[[int], list[Group]], on_step_end: Callable[[], None],
                 keep_groups: bool = False, keep_records: bool = True, check: bool = False,
                 on_advance: Callable[[], None] | None = None,
                 group_filter: Callable[[Group], bool] | None = None, adapt: bool = False,
                 filter_config: GroupFilterConfig | None = None,
                 on_top_up_error: Callable[[DataError], None] | None = None):
        self.run = run
        self.sched = run.scheduler
        self.clock = run.clock
        self.b = step_groups
        self.k = steps
        self._init_staleness(max_staleness, group_deadline)
        # what the policy is told with the groups (DispatchContext.stream). It hears of the bound only where
        # groups carry over a step's end (in_flight > B, or a group filter's top-ups): with nothing carried no
        # token grows more than one version old (an update in the middle of a step), and capacity spent on
        # keeping long samples young (v3's tail lane) would be lost
        self.spec = StreamSpec(step_groups=step_groups, in_flight=in_flight,
                               max_staleness=max_staleness if in_flight > step_groups or group_filter is not None
                               else None)
        self.keep = keep_groups
        self.keep_records = keep_records
        self.check = check
        self.new_groups = new_groups
        self.on_step_end = on_step_end
        self.on_advance = on_advance
        self._init_filter(step_groups, max_staleness, group_filter, adapt, filter_config, on_top_up_error)
        self.t = 0
        #: the policy version at the step's start, and at its end (token ages count from the latter)
        self.step_version = self.sched.policy_version
        self.end_version = self.step_version
        # keyed by id(group) (groups are unhashable dataclasses)
        self.flying: dict[int, tuple[Group, int]] = {}   # in flight (launched, not consumed): (group, launch step)
        self.complete: dict[int, Group] = {}             # complete, not consumed, in completion order
        self.closing = False
        self.done = False
        #: the last step: nothing new launches, and the step ends when every group in flight is complete
        self.draining = False
        #: ``new_groups`` gave fewer groups than asked: the source ran out
        self.exhausted = False
        self.start_s = self.clock.now()
        self.end_s = self.start_s
        self.held_since: float | None = None
        self.held_s = 0.0
        #: the step does not end before the policy version reaches this (None: no such wait)
        self.hold_until: int | None = None
        self.early_restarts = 0
        self.refreshed = 0
        self.stats0 = dict(self.sched.stats)
        #: the steps' records (the last one only, unless ``keep_records``)
        self.records: list[StepRecord] = []
        self.consumed: list[Group] = []
        #: with ``keep_records``: each prompt's consumption and launch step
        self.consumed_at: dict[str, int] = {}
        self.launched_at: dict[str, int] = {}
        self.pending: list[Group] = []
        # groups launched since the last consumed step (its record's), and since this step began (what
        # max_launch_factor bounds): a step that failed before its end (the owner refused a prompt) adds its
        # launches to the next step's record, as its filtered groups, but not to that step's bound
        self._launched_now = 0
        self._step_launches = 0

    # ------------------------------------------------------------ launching
    def launch(self, count: int) -> None:
        """Launch up to ``count`` new groups, tagged with the current step."""
        groups = self.new_groups(count) if count > 0 else []
        if len(groups) < count:
            self.exhausted = True
        for g in groups:
            self.flying[id(g)] = (g, self.t)
            if self.keep_records:
                self.launched_at[g.prompt_id] = self.t
        self._launched_now += len(groups)
        self._step_launches += len(groups)
        if groups:
            self.run.add_groups(groups, self.t, self.spec)

    @property
    def target(self) -> int:
        """Groups kept in flight (B x (1 + F), or adapted to the pass rate): the one the policy is told."""
        return self.spec.in_flight


    def start(self, *, last: bool = False, carried: Sequence[tuple[Group, int]] = ()) -> None:
        """Launch the first step's groups (``last``: B of them, and the step drains; see :meth:`refill`).

        ``carried``: groups an earlier run had in flight (restored from disk, with the step each was
        launched in, counted from this stream's step 0, so earlier steps are negative). They go first,
        continuing from their tokens; a sample too stale for the current version starts over now (a
        resumed run may thus restart a sample once more than an uninterrupted one)."""
        self.draining = last
        self._adapt_target()
        running = []
        for g, step in carried:
            self.flying[id(g)] = (g, step)
            if self.keep_records:
                self.launched_at[g.prompt_id] = step
            for smp in g.samples:
                if self._too_old(smp, self.step_version):
                    # before the policy sees the group: it queues the sample afresh
                    smp.finish_reason = smp.finish_time_s = None
                    self.sched.restart(smp)
                    self.stale_restarts += 1
                if smp.restarts:
                    self.restarted[id(smp)] = smp.restarts
                    self.watch[id(g)] = g
            if g.done:
                self.complete[id(g)] = g
            else:
                running.append(g)
        if running:
            self.run.add_groups(running, self.t, self.spec)
        self.launch((self.b if last else self.target) - len(self.flying))
        self.maybe_end()

    def in_flight_groups(self) -> list[tuple[Group, int]]:
        """Groups launched and not consumed, each with the step it was launched in."""
        return list(self.flying.values())

    # --------------------------------------------------------------- events

    def group_done(self, group: Group) -> None:
        if id(group) not in self.flying or id(group) in self.complete:
            return
        if self.s is not None and self._stale(group, self.sched.policy_version):
            # finished with tokens too old for this step (an abort found its last token generated):
            # regenerate them, after the scheduler's current callback
            self.clock.call_later(0.0, lambda: self.sched.guarded(self._restart_stale, group,
                                                                   self.sched.policy_version))
            return
        if self.group_filter is not None and not self._judge(group):
            self.maybe_end()
            return
        self.complete[id(group)] = group
        self.maybe_end()


    def maybe_end(self) -> None:
        """End the step if B groups are complete and no due group is incomplete; when draining (or when
        the source ran out and fewer than B are left), once every group in flight is complete."""
        if self.closing or self.done:
            return
        if self.hold_until is not None and self.sched.policy_version < self.hold_until:
            return
        if self.draining and self.group_filter is not None and len(self.complete) < self.b and not self.exhausted:
            return   # the last step too needs B passing groups (the filtered ones' replacements are on their way)
        if self.draining or (self.exhausted and len(self.flying) < self.b):
            # (everything left was filtered out and nothing more comes: the step ends with what it has)
            if (not self.flying and not (self.exhausted and self.filtered)) or len(self.complete) < len(self.flying):
                return
        elif len(self.complete) < self.b:
            return
        now = self.clock.now()
        if any(key not in self.complete for key in self._due()):
            if self.held_since is None:
                self.held_since = now
            return
        if self.held_since is not None:
            self.held_s = now - self.held_since
        self.closing = True
        # due groups first, then the earliest launched (a stable sort keeps completion order within a
        # launch step); every due group is taken even if that makes more than B
        due = self._due()
        order = sorted(self.complete.values(), key=lambda g: (id(g) not in due, self.flying[id(g)][1]))
        self.pending = order if self.draining else order[:max(self.b, len(due))]
        self.end_s = now
        self.end_version = self.sched.policy_version
        self.on_step_end()

    def advance(self) -> list[Group]:
        """:meth:`consume` the ended step, then :meth:`refill` for the next; returns the consumed groups."""
        consumed = self.consume()
        self.refill()
        return consumed

    def consume(self) -> list[Group]:
        """Take the ended step's groups (returned) out of the stream and record the step."""
        t = self.t
        consumed = self.pending
        lags = []
        for g in consumed:
            lags.append(t - self.flying.pop(id(g))[1])
            del self.complete[id(g)]
            self._leave(g)
            if self.keep_records:
                self.consumed_at[g.prompt_id] = t
        if self.drop_stale:   # every group with a token now would be too stale under the next version
            for g, _ in list(self.flying.values()):
                if any(oldest_version(s) is not None for s in g.samples):
                    self._drop(g)
        ages, partial, carried, carried_tokens = consumed_tokens(consumed, self.end_version,
                                                                 check_step=t if self.check else None)
        stats = self.sched.stats
        tokens = sum(ages.values())
        if not self.keep_records:
            self.records.clear()
        self.records.append(StepRecord(
            index=t, start_s=self.start_s, end_s=self.end_s, groups=len(consumed), launched=self._launched_now,
            tokens=tokens, off_policy_tokens=tokens - ages.get(0, 0), partial_tokens=partial,
            ages=dict(sorted(ages.items())), max_group_lag=max(lags, default=0),
            restarts=stats["restarts"] - self.stats0.get("restarts", 0),
            wasted_tokens=stats["wasted_tokens"] - self.stats0.get("wasted_tokens", 0),
            stale_restarts=self.stale_restarts, held_s=self.held_s, refreshed=self.refreshed,
            early_restarts=self.early_restarts, version=self.end_version, filtered=len(self.filtered),
            filtered_tokens=self._filtered_tokens,
            pass_rate=self.pass_rate if self.group_filter is not None else None,
            dropped=len(self.dropped), dropped_tokens=self._dropped_tokens, carried=carried,
            carried_tokens=carried_tokens))
        self.last_filtered = self.filtered
        self.filtered = []
        self._filtered_tokens = 0
        self.last_dropped = self.dropped
        self.dropped = []
        self._dropped_tokens = 0
        self._launched_now = 0
        self.stats0 = dict(stats)
        self.stale_restarts = 0
        self.early_restarts = 0
        self.refreshed = 0
        if self.keep:
            self.consumed.extend(consumed)
        self.t += 1
        self.pending = []
        if self.on_advance is not None:
            self.on_advance()
        if self.k is not None and self.t == self.k:
            self.done = True
        return consumed


    def refill(self, *, last: bool = False) -> None:
        """Start the next step at the scheduler's policy version now: restart what is too stale for it,
        refill the in-flight count. ``last``: the last step: launch only what brings the groups in flight
        to B, and end when every group in flight is complete (it drains)."""
        if self.done:
            return
        self.step_version = self.sched.policy_version
        if self.s is not None:
            for g, _ in list(self.flying.values()):
                self._restart_stale(g, self.step_version)
        choose = getattr(self.run.policy, "on_step_end", None)
        if choose is not None:
            for smp in self._chosen(choose):
                if id(smp.group) not in self.flying or smp.turns is not None:
                    continue   # a multi-turn sample is never regenerated: its agent holds the conversation
                if smp.finished:
                    self.sched.restart(smp)
                    self.refreshed += 1
                    self.complete.pop(id(smp.group), None)
                elif self.s is not None and smp.num_generated and not self._restarted(smp):
                    # the policy expects it to outlive its group's last step: its staleness restart, a step early
                    self._restart_once(smp)
                    self.early_restarts += 1
        self.draining = last
        self._adapt_target()
        self._step_launches = 0
        self.launch((self.b if last else self.target) - len(self.flying))
        self.start_s = self.clock.now()
        self.held_since = None
        self.held_s = 0.0
        self.closing = False
        self.maybe_end()

    def _chosen(self, choose: Callable[[list[Group]], Sequence[Sample]]) -> list[Sample]:
        """The policy's ``on_step_end`` over the groups in flight; what it raises, or a return that is not a list
        of samples, is a RunError naming the policy and the hook."""
        policy = self.run.policy
        try:
            picked = choose([g for g, _ in self.flying.values()])
        except PdsrError:
            raise
        except Exception as exc:
            raise hook_error(policy, "on_step_end", exc) from exc
        if not isinstance(picked, (list, tuple)) or not all(isinstance(smp, Sample) for smp in picked):
            raise RunError(f"policy {policy_label(policy)}: on_step_end returned {type(picked).__name__} "
                           f"{picked!r:.80}; it returns a list of samples to generate again ([] for none)")
        return list(picked)

    def release_hold(self) -> None:
        """Let the step end without waiting for :attr:`hold_until` (a change that must wait for the step's
        end, :meth:`blocked_by`, would otherwise wait forever)."""
        self.hold_until = None
        self.maybe_end()
