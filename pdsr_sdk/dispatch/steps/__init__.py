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

from pdsr_sdk.dispatch.steps.counts import (
    GROUP_FILTERS, adaptive_in_flight, check_agent_streaming, groups_launched, has_reward_variance, in_flight,
    needed_launches,
)
from pdsr_sdk.dispatch.steps.filtering import FilterBoundError
from pdsr_sdk.dispatch.steps.record import StepRecord, check_consumed, consumed_tokens
from pdsr_sdk.dispatch.steps.stream import StepStream

__all__ = [
    "GROUP_FILTERS", "FilterBoundError", "StepRecord", "StepStream", "adaptive_in_flight", "check_agent_streaming",
    "check_consumed", "consumed_tokens", "groups_launched", "has_reward_variance", "in_flight", "needed_launches",
]
