"""One step's record (:class:`StepRecord`) and the token accounting of the groups a step consumes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from pdsr_sdk.dispatch.types import TRUNCATED, Group, Sample, kept_segments
from pdsr_sdk.errors import PdsrError


@dataclass
class StepRecord:
    """One training step of a multi-step run."""

    index: int
    start_s: float
    end_s: float
    #: groups consumed at its end, and launched since the previous step's (its refill and top-ups, and those of a
    #: step that failed in between: the owner refused a prompt)
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

def check_consumed(s: Sample, step: int) -> None:
    """A consumed sample is finished and holds every token its kept segments say (else a bug)."""
    kept = sum(seg.num_tokens for seg in kept_segments(s))
    if (not s.finished or kept != s.sampled_tokens
            or (s.max_tokens is not None and s.num_generated != s.max_tokens and s.finish_reason != TRUNCATED)):
        raise PdsrError(f"step {step}: sample {s.key} consumed with {s.num_generated} of {s.max_tokens} tokens "
                        f"({kept} in kept segments, {s.finish_reason}); tokens were lost (a bug)")

def consumed_tokens(groups: Sequence[Group], end_version: int, *, check_step: int | None = None,
                    ) -> tuple[Counter[int], int, int, int]:
    """The consumed groups' response tokens by age in versions (``end_version`` - each segment's version), their
    partial tokens (the older part of responses that crossed a weight update), and how many responses crossed
    one with how many tokens in all. ``check_step``: :func:`check_consumed` every sample first."""
    ages: Counter[int] = Counter()
    partial = carried = carried_tokens = 0
    for g in groups:
        for s in g.samples:
            if check_step is not None:
                check_consumed(s, check_step)
            segs = [seg for seg in kept_segments(s) if seg.num_tokens]
            mixed = len(segs) > 1 and segs[0].policy_version != segs[-1].policy_version
            if mixed:
                carried += 1
                carried_tokens += sum(seg.num_tokens for seg in segs)
            for seg in segs:
                ages[end_version - seg.policy_version] += seg.num_tokens
                if mixed and seg.policy_version < end_version:
                    partial += seg.num_tokens
    return ages, partial, carried, carried_tokens
