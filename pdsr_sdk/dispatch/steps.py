"""Partial rollout across training steps: the step accounting that the simulator (``pdsr simulate
--steps``) and a trainer's session share.

A stream of groups runs through one dispatch run; nothing waits for a batch's longest sample:

- Step t keeps ``in_flight`` groups in flight (carried + newly launched; over-provision F gives
  ``ceil(B x (1 + F))``, :func:`in_flight`).
- The step ends at the moment B groups are complete and not yet consumed (counted in completion
  order: a group completing after the B-th, even in the same instant, is the next step's) and no
  *due* group (below) is incomplete. It consumes B complete groups (more only if more are due):
  due ones first, then the earliest launched. Its end is the trainer's weight update: the owner's
  ``on_step_end`` bumps the scheduler's ``policy_version`` (recorded on every segment launched from
  then on) and later calls :meth:`StepStream.advance`, which consumes the step's groups, refills the
  in-flight count, and lets unfinished samples continue with their tokens.
- A segment's tokens carry the version its segment started under, so a token's age at consumption
  is at least its true age. Off-policy tokens are both the older part of responses carried across
  a weight update and whole responses that finished under an older version while their group
  waited for its other samples.
- Staleness (``max_staleness`` S): at each step's advance, every sample of an unconsumed group whose
  oldest kept token is more than S versions old is restarted (``Scheduler.restart``; finished
  samples too), so no consumed token is older than S versions. Thrown-away tokens count as wasted.
- The version may also change in the middle of a step (a pipelined trainer updates weights while the
  next step generates): the owner then calls :meth:`StepStream.version_changed`, which restarts what
  the new version makes too stale. A step's token ages count from the version current at its end
  (:attr:`StepStream.end_version`, the one its groups are trained with). A change that would make a
  sample already restarted once too stale again must wait for the step's end
  (:meth:`StepStream.blocked_by` names those samples; their groups are due, so that end consumes them).
  With :attr:`StepStream.hold_until` set, a step does not end before the version reaches it (a pipelined
  trainer's update for the previous step), so its ages count at the weights the trainer trains with.
- At a step's start the policy may name samples of carried groups to generate again (its optional
  ``on_step_end``): finished ones are regenerated under the new weights (``refreshed``); under a bound,
  running ones are given their staleness restart a step early (``early_restarts``: v3 picks runaways
  unlikely to end within their group's last step, whose finished siblings would be restarted with them).
- No starvation: a sample is restarted for staleness at most once (an early restart is that once). A
  group holding a restarted sample that would be too stale after the next version change is due: the
  step does not end before it completes and consumes it. So with S set every sample is generated at
  most twice, and a group is consumed at most S steps after the version under which its first
  restarted sample generated its first new token. Without S nothing is restarted. ``group_deadline``
  D adds a hard bound: a group launched at step t is due at step t + D. Groups are complete when
  consumed (GRPO needs all N of a group).
- Dynamic sampling (DAPO, ``group_filter``): a complete group that fails the filter (all N rewards
  equal: no GRPO signal) is taken out of the stream at once (:attr:`StepStream.filtered`, counted in
  the step's record) and the step goes on until B groups that pass are complete. The stream keeps
  enough groups in flight to expect B passing ones: with p the pass rate measured so far (Laplace:
  (passed + 1) / (judged + 2) over every group judged in the run, at least ``min_pass_rate``), a step
  starts ``ceil(B / p)`` in flight (or ``ceil(B x (1 + F))`` with a fixed over-provision F), and each
  filtered group launches new ones while the groups in flight, times p, fall short of the passing groups
  still needed (:func:`needed_launches`). On-policy (S = 0), the groups with tokens that a step's end does
  not take (generating, or complete beyond B) are dropped then, as DAPO's recipe drops its excess: their
  unfinished samples finish as ``dropped``, their tokens count in that step's ``dropped_tokens``, and they are
  never consumed (:attr:`StepStream.last_dropped`). Restarting them instead would make each one due at the
  next step (a sample restarts at most once), so that step would wait for groups that started afresh at its
  start. Groups launched but not started yet stay.
"""

from __future__ import annotations

import dataclasses

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

from pdsr_sdk.dispatch.config import GroupFilterConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.dispatch.types import DROPPED, TRUNCATED, Group, Sample, StreamSpec, kept_segments, oldest_version
from pdsr_sdk.errors import ConfigValueError, PdsrError, RunError


@dataclass
class StepRecord:
    """One training step of a multi-step run."""

    index: int
    start_s: float
    end_s: float
    #: groups consumed at its end, and launched at its start (the refill after the previous step)
    groups: int
    launched: int
    #: response tokens of the consumed groups; those generated under an older version than the step's
    tokens: int
    off_policy_tokens: int
    #: the off-policy tokens of responses that crossed a weight update while being generated (their
    #: older part: the partial responses a step carried); the rest are whole responses finished under
    #: an older version while their group waited for its other samples
    partial_tokens: int
    #: tokens of the consumed groups by age in versions (the step's version - segment's policy_version)
    ages: dict[int, int]
    #: most steps a consumed group spent in flight (consumed step - launch step)
    max_group_lag: int
    #: restarts and wasted tokens during the step (all causes), and staleness restarts at its start (the
    #: early ones included)
    restarts: int
    wasted_tokens: int
    stale_restarts: int
    #: seconds the step's end was held for an overdue group (group_deadline)
    held_s: float
    #: finished samples of carried groups the policy chose to generate again at the step's start
    #: (``on_step_end``; their tokens are in ``wasted_tokens``)
    refreshed: int = 0
    #: the policy version at the step's end, which its token ages count from (the one its groups are trained with)
    version: int = 0
    #: running samples the policy restarted at the step's start, expecting them to outlive their group's last
    #: step (``on_step_end``): their staleness restart, a step early (also in ``stale_restarts``)
    early_restarts: int = 0
    #: dynamic sampling: groups the filter took out during the step, their response tokens, and the pass rate
    #: the stream estimated at the step's end (None without a filter)
    filtered: int = 0
    filtered_tokens: int = 0
    pass_rate: float | None = None
    #: dynamic sampling on-policy: groups with tokens the step's end did not take, dropped then, and the
    #: response tokens they had
    dropped: int = 0
    dropped_tokens: int = 0
    #: consumed responses that crossed a weight update (those ``partial_tokens`` come from) and all their tokens:
    #: what the partial share buys, a few long responses carried nearly done or many carried early
    carried: int = 0
    carried_tokens: int = 0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def max_age(self) -> int:
        return max((a for a, n in self.ages.items() if n), default=0)

    @property
    def off_policy_share(self) -> float:
        return self.off_policy_tokens / self.tokens if self.tokens else 0.0


def in_flight(b: int, over_provision: float) -> int:
    """Groups kept in flight for steps of ``b`` groups with over-provision ``over_provision``."""
    return max(b, math.ceil(b * (1.0 + over_provision) - 1e-9))


def has_reward_variance(rewards: Sequence[float | None]) -> bool:
    """The ``zero-variance`` filter: a group passes when its rewards (failed ones, None, left out) are not all
    equal, i.e. at least two differ; all right or all wrong gives every GRPO advantage 0."""
    return len({r for r in rewards if r is not None}) > 1


#: the filters ``filter_groups.kind`` names: rewards of a group's samples -> passes
GROUP_FILTERS: dict[str, Callable[[Sequence[float | None]], bool]] = {"zero-variance": has_reward_variance}


def adaptive_in_flight(b: int, pass_rate: float) -> int:
    """Groups to keep in flight so that ``b`` of them are expected to pass the filter at ``pass_rate``."""
    return max(b, math.ceil(b / pass_rate - 1e-9))


def needed_launches(need: int, incomplete: int, pass_rate: float) -> int:
    """New groups to launch when ``need`` passing groups are still missing and ``incomplete`` groups are in
    flight, each expected to pass with ``pass_rate``: enough that ``incomplete x pass_rate >= need``."""
    if need <= 0:
        return 0
    return max(0, math.ceil(need / pass_rate - 1e-9) - incomplete)


def groups_launched(b: int, over_provision: float, steps: int) -> int:
    """Groups a stream of ``steps`` steps launches (carried ones included) when every step consumes
    exactly ``b``: the first fills the in-flight count, each middle step refills ``b``, and the last
    launches only what brings the groups in flight to ``b`` (it drains). A step that must also take
    due groups consumes more, so this is what a progress bar expects, not a bound."""
    if steps <= 1:
        return b
    return b * (steps - 2) + max(in_flight(b, over_provision), 2 * b)


def check_consumed(s: Sample, step: int) -> None:
    """A consumed sample is finished and holds every token its kept segments say (else a bug)."""
    kept = sum(seg.num_tokens for seg in kept_segments(s))
    if (not s.finished or kept != s.sampled_tokens
            or (s.max_tokens is not None and s.num_generated != s.max_tokens and s.finish_reason != TRUNCATED)):
        raise PdsrError(f"step {step}: sample {s.key} consumed with {s.num_generated} of {s.max_tokens} tokens "
                        f"({kept} in kept segments, {s.finish_reason}); tokens were lost (a bug)")


class StepStream:
    """The event handlers of one multi-step run (called by the scheduler and the owner's clock).

    ``new_groups(count)`` builds up to ``count`` new groups (fewer when the data runs out);
    ``on_step_end()`` is called once a step's groups are chosen (:attr:`pending`): the owner bumps the
    policy version (its weight update) and then calls :meth:`advance`. ``check`` verifies every
    consumed sample (:func:`check_consumed`, for runs whose lengths are known in advance).
    ``group_filter(group) -> bool``: dynamic sampling (see the module); the owner calls :meth:`group_done`
    once the group's rewards are in. ``adapt``: the in-flight count follows the measured pass rate
    (``in_flight`` is then the first step's); ``filter_config`` gives the estimate's floor and the bound on a
    step's launches (:class:`~pdsr_sdk.dispatch.config.GroupFilterConfig`).
    """

    def __init__(self, run: DispatchRun, *, step_groups: int, in_flight: int, steps: int | None,
                 max_staleness: int | None, group_deadline: int | None,
                 new_groups: Callable[[int], list[Group]], on_step_end: Callable[[], None],
                 keep_groups: bool = False, check: bool = False, on_advance: Callable[[], None] | None = None,
                 group_filter: Callable[[Group], bool] | None = None, adapt: bool = False,
                 filter_config: GroupFilterConfig | None = None):
        self.run = run
        self.sched = run.scheduler
        self.clock = run.clock
        self.b = step_groups
        self.k = steps
        self.s = max_staleness
        # what the policy is told with the groups (DispatchContext.stream). It hears of the bound only where
        # groups carry over a step's end (in_flight > B, or a group filter's top-ups): with nothing carried no
        # token grows more than one version old (an update in the middle of a step), and capacity spent on
        # keeping long samples young (v3's tail lane) would be lost
        self.spec = StreamSpec(step_groups=step_groups, in_flight=in_flight,
                               max_staleness=max_staleness if in_flight > step_groups or group_filter is not None
                               else None)
        self.d = group_deadline
        self.keep = keep_groups
        self.check = check
        self.new_groups = new_groups
        self.on_step_end = on_step_end
        self.on_advance = on_advance
        self.group_filter = group_filter
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
        self.stale_restarts = 0
        self.early_restarts = 0
        self.refreshed = 0
        self.stats0 = dict(self.sched.stats)
        self.records: list[StepRecord] = []
        self.consumed: list[Group] = []
        self.consumed_at: dict[str, int] = {}
        self.launched_at: dict[str, int] = {}
        self.pending: list[Group] = []
        self.restarted: dict[int, int] = {}    # id(sample) -> its restarts count once the staleness restart is done
        self.watch: dict[int, Group] = {}      # groups with such a sample (checked by _due)
        self._launched_now = 0

    # ------------------------------------------------------------ launching
    def launch(self, count: int) -> None:
        """Launch up to ``count`` new groups, tagged with the current step."""
        groups = self.new_groups(count) if count > 0 else []
        if len(groups) < count:
            self.exhausted = True
        for g in groups:
            self.flying[id(g)] = (g, self.t)
            self.launched_at[g.prompt_id] = self.t
        self._launched_now += len(groups)
        if groups:
            self.run.add_groups(groups, self.t, self.spec)

    @property
    def target(self) -> int:
        """Groups kept in flight (B x (1 + F), or adapted to the pass rate): the one the policy is told."""
        return self.spec.in_flight

    def _adapt_target(self) -> None:
        """At a step's start, under dynamic sampling without a given F: groups in flight from the pass rate."""
        if self.adapt:
            self.spec = dataclasses.replace(self.spec, in_flight=adaptive_in_flight(self.b, self.pass_rate))

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

    @property
    def pass_rate(self) -> float:
        """The filter's pass rate so far, (passed + 1) / (judged + 2), at least ``min_pass_rate`` (1 without a filter)."""
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
        self.watch.pop(id(group), None)
        self.filtered.append(group)
        if self.keep:
            self.all_filtered.append(group)
        self._filtered_tokens += sum(s.num_generated for s in group.samples)
        # after the scheduler's current callback (this one may be inside it)
        self.clock.call_later(0.0, lambda: self.sched.guarded(self._top_up))
        return False

    def _top_up(self) -> None:
        """Launch what the groups in flight are not expected to bring of this step's B passing ones."""
        if self.closing or self.done or self.exhausted:
            return
        incomplete = len(self.flying) - len(self.complete)
        count = needed_launches(self.b - len(self.complete), incomplete, self.pass_rate)
        if count and self.max_launches is not None and self._launched_now + count > self.max_launches:
            raise RunError(
                f"dynamic sampling: step {self.t} has launched {self._launched_now} groups and {len(self.complete)} "
                f"of the {self.b} that pass the filter are complete ({self.passed} of {self.judged} groups passed so "
                f"far); filter_groups.max_launch_factor bounds a step at {self.max_launches}. Nearly every group's "
                f"rewards are all equal: the prompts are too hard or too easy for this model (or its reward never "
                f"tells right from wrong). Raise the bound, or set it to null for no bound")
        self.launch(count)
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
            self.consumed_at[g.prompt_id] = t
        if self.drop_stale:   # every group with a token now would be too stale under the next version
            for g, _ in list(self.flying.values()):
                if any(oldest_version(s) is not None for s in g.samples):
                    self._drop(g)
        ages: Counter[int] = Counter()
        partial = carried = carried_tokens = 0
        for g in consumed:
            for s in g.samples:
                if self.check:
                    check_consumed(s, t)
                segs = [seg for seg in kept_segments(s) if seg.num_tokens]
                mixed = len(segs) > 1 and segs[0].policy_version != segs[-1].policy_version
                if mixed:
                    carried += 1
                    carried_tokens += sum(seg.num_tokens for seg in segs)
                for seg in segs:
                    ages[self.end_version - seg.policy_version] += seg.num_tokens
                    if mixed and seg.policy_version < self.end_version:
                        partial += seg.num_tokens
        stats = self.sched.stats
        tokens = sum(ages.values())
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
            for smp in choose([g for g, _ in self.flying.values()]):
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
        self.launch((self.b if last else self.target) - len(self.flying))
        self.start_s = self.clock.now()
        self.held_since = None
        self.held_s = 0.0
        self.closing = False
        self.maybe_end()

    def _drop(self, group: Group) -> None:
        """Take a group out of the stream for good: its unfinished samples finish as ``dropped``."""
        del self.flying[id(group)]
        self.complete.pop(id(group), None)
        self.watch.pop(id(group), None)
        self.dropped.append(group)
        self._dropped_tokens += sum(s.num_generated for s in group.samples)
        for smp in group.samples:
            self.sched.finish(smp, DROPPED)   # a finished one stays as it is

    # ------------------------------------------------------------ staleness
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

    def release_hold(self) -> None:
        """Let the step end without waiting for :attr:`hold_until` (a change that must wait for the step's
        end, :meth:`blocked_by`, would otherwise wait forever)."""
        self.hold_until = None
        self.maybe_end()

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


def check_agent_streaming(max_staleness: int | None, filtering: bool, what: str = "with an agent") -> None:
    """ConfigValueError where a step stream would restart multi-turn samples for staleness (their agents hold
    the conversation, so they are never restarted): a bound other than none, or 0 with filter_groups. ``what``
    names the multi-turn source in the message (an agent, a simulated trace of turns)."""
    if max_staleness is None or (max_staleness == 0 and filtering):
        return
    raise ConfigValueError(f"max_staleness {max_staleness} {what}: a multi-turn sample is never restarted "
                           f"(its agent holds the conversation), so partial rollout {what} keeps its "
                           f"samples' older tokens (drop max_staleness; correct them with importance weights), "
                           f"or, with filter_groups, max_staleness 0 drops the groups a step's end leaves")
