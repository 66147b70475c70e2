"""What a rollout session does when its dispatch run (:class:`~pdsr_sdk.dispatch.run.DispatchRun`) calls back: a
sample or a group finished, a status line, a fatal error."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Iterator

from pdsr_sdk.dispatch.steps import FilterBoundError
from pdsr_sdk.dispatch.types import DROPPED, Group, Sample
from pdsr_sdk.errors import RunError


class RunCallbacks:
    """The dispatch run's callbacks (a mixin of :class:`~pdsr_sdk.rollout.session.RolloutSession`, whose ``start()``
    gives them to the run). They hold no state of their own: they hand a finished sample to the agents, the reward
    runner (``rewards``, :class:`~pdsr_sdk.rollout.session_rewards.SessionRewards`) and the caller's ``hooks``; a
    running sample's new tokens to the hooks (a server streams them); a finished group to the draft history, the
    hooks and the step stream (``_stream``, judged by ``group_filter`` once scored: ``_group_scored`` of
    :class:`~pdsr_sdk.rollout.session_stream.StreamSteps`); and set ``_fatal``, the future a step waits on besides
    its groups."""

    def _sample_done(self, sample: Sample) -> None:
        if sample.turns is not None:
            self.agents.on_sample_done(sample)
        if self.rewards is not None and sample.finish_reason != DROPPED:   # a dropped group is never judged
            self.rewards.submit(sample)
        for fn in self.hooks.on_sample_done:
            fn(sample)

    def _tokens(self, sample: Sample, n: int) -> None:
        for fn in self.hooks.on_tokens:
            fn(sample, n)

    def _group_done(self, group: Group) -> None:
        if self.draft_history is not None:
            self.draft_history.record(group)
        for fn in self.hooks.on_group_done:
            fn(group)
        if self._stream is not None:
            if any(s.finish_reason == DROPPED for s in group.samples):
                return   # dropped at a step's end (on-policy dynamic sampling): out of the stream already
            if self.group_filter is not None:   # judged once its rewards are in
                self.rewards.when_scored(group, self._group_scored, self._set_fatal)
            else:
                self._stream.group_done(group)

    def _status(self, message: str) -> None:
        for fn in self.hooks.on_status:
            fn(message)

    def _set_fatal(self, exc: BaseException) -> None:
        if isinstance(exc, FilterBoundError):
            exc = self._with_reward_failures(exc)
        if self._fatal is not None and not self._fatal.done():
            self._fatal.set_result(exc)
            for fn in self.hooks.on_fatal:
                fn(exc)

    @property
    def closed(self) -> bool:
        """:meth:`close` ran: the session refuses every call (a server on it is shutting down)."""
        return self._closed

    def _with_reward_failures(self, exc: RunError) -> RunError:
        """Dynamic sampling's launch bound, with the step's filtered samples whose reward failed (each is left
        out of its group's comparison, so a reward that fails often gets its groups filtered: the bound's own
        words, prompts too hard or too easy, would send the user the wrong way)."""
        groups = self._stream.filtered if self._stream is not None and self.rewards is not None else []
        scored = [self.rewards.result(s) for g in groups for s in g.samples]
        failed = [sc.error for sc in scored if sc is not None and sc.error is not None]
        if not failed:
            return exc
        out = type(exc)(f"{exc}. But the reward failed on {len(failed)} of the {len(scored)} samples of the groups "
                        f"filtered in this step (a failed reward is left out of its group's comparison), the first "
                        f"with {failed[0][:300]}")
        out.__cause__ = exc
        return out

    def check_usable(self, what: str) -> None:
        """A closed session, or one a fatal error ended (a policy's exception, a pool's last engine lost), refuses
        every call with a RunError saying so (the error that ended it is its cause)."""
        if self._closed:
            raise RunError(f"{what}: this session is closed; open a new RolloutSession")
        if self._fatal is not None and self._fatal.done():
            cause = self._fatal.result()
            raise RunError(f"{what}: the session failed earlier ({type(cause).__name__}: {cause}) and cannot go on; "
                           f"close it and open a new RolloutSession") from cause

    @contextmanager
    def _one_step(self, what: str) -> Iterator[None]:
        """Steps (and ``generate`` batches) run one at a time: a second one started while another runs would take
        over the dispatch run's batch (or the stream's step end) and leave the first waiting for good. The task
        already running one may call ``generate`` inside it (``astep`` does)."""
        task = asyncio.current_task()
        if self._stepping is task:
            yield
            return
        if self._stepping is not None:
            raise RunError(f"{what}: another step is running on this session; steps run one at a time: call it "
                           f"after that step returns (a pipelined trainer starts step k + 1 once step k has "
                           f"returned, and updates weights while it runs)")
        self._stepping = task
        try:
            yield
        finally:
            self._stepping = None
