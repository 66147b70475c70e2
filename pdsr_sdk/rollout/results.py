"""What a rollout session returns and the callbacks it calls: a batch's :class:`BatchResult`, a training step's
:class:`StepResult` and :class:`SessionHooks` (:mod:`pdsr_sdk.rollout.session`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

from pdsr_sdk.dispatch.run import BatchReport
from pdsr_sdk.dispatch.steps import StepRecord
from pdsr_sdk.dispatch.types import Group, Sample


@dataclass
class BatchResult(BatchReport):
    """One finished batch: its groups and what it cost (a :class:`~pdsr_sdk.dispatch.run.BatchReport`),
    with v2.5's cut and fast-pool cap (None for other policies)."""

    l_cut: int | None = None
    fast_cap: int | None = None
    #: a step of partial rollout: its off-policy tokens and share, oldest token age, staleness restarts,
    #: and what it left in flight (None for a batch)
    step: dict[str, Any] | None = None

    @classmethod
    def from_report(cls, report: BatchReport) -> "BatchResult":
        facts = report.policy
        return cls(**{f.name: getattr(report, f.name) for f in fields(BatchReport)},
                   l_cut=facts.get("l_cut"), fast_cap=facts.get("fast_cap"))


@dataclass
class StepResult:
    """What one :meth:`RolloutSession.step` completed.

    ``groups`` are the Python objects (:class:`~pdsr_sdk.dispatch.types.Group`, each with its
    samples' token ids, engine log-probs and segments); ``table`` the same samples as Arrow, one
    row per sample, in the trajectories schema (``schemas/trajectory.arrow.json``: text, reward,
    segments with their policy version, ...); ``summary`` plain numbers about the step;
    ``report`` the batch report they come from.
    """

    step: int
    #: the policy version the step's segments were generated with
    policy_version: int
    groups: list[Group]
    table: Any   # pyarrow.Table
    summary: dict[str, Any]
    report: BatchResult
    #: with partial rollout: the step's record (off-policy tokens, token ages, restarts); else None
    record: StepRecord | None = None
    #: each sample's reward, in the order of :attr:`samples`
    #: (:class:`~pdsr_sdk.rollout.reward_runner.Scored`: text, reward, extra, error, seconds, timeouts)
    scores: list = field(default_factory=list)
    #: dynamic sampling: the groups the filter took out during the step (not in :attr:`groups`), and their
    #: samples' scores in order
    filtered: list[Group] = field(default_factory=list)
    filtered_scores: list = field(default_factory=list)
    #: on-policy dynamic sampling: the groups with tokens the step's end did not take (generating, or complete
    #: beyond B), dropped then (never consumed; their prompts are not tried again in the run)
    dropped: list[Group] = field(default_factory=list)

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g.samples]


@dataclass
class SessionHooks:
    """Callbacks the caller may set (progress bars, writers). Called on the event loop."""

    on_sample_done: list[Callable[[Sample], None]] = field(default_factory=list)
    on_group_done: list[Callable[[Group], None]] = field(default_factory=list)
    #: ``fn(sample, n)``: ``n`` tokens just added to a running sample (its ``token_ids`` end with them when the engine
    #: reports ids), as the engine reports them: each engine step's, or more at once
    on_tokens: list[Callable[[Sample, int], None]] = field(default_factory=list)
    #: ``fn(exc)``: the session just failed (a policy's exception, a pool's last engine lost); the samples still
    #: running will never end, and every later call raises a RunError (``check_usable``)
    on_fatal: list[Callable[[BaseException], None]] = field(default_factory=list)
    #: one-line messages (``starting 2 vLLM engines ...``, ``engines ready in 23.1 s``); see pdsr_sdk.progress
    on_status: list[Callable[[str], None]] = field(default_factory=list)
