"""Partial rollout across training steps, the part of :class:`~pdsr_sdk.rollout.session.RolloutSession` that
runs a step of a stream (:mod:`pdsr_sdk.dispatch.steps`): its groups, its end, and what it carries."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from typing import Iterable, Iterator, Mapping, Sized

from pdsr_sdk.dispatch.steps import StepStream, in_flight
from pdsr_sdk.dispatch.types import Group
from pdsr_sdk.errors import ConfigValueError, DataError, RunError
from pdsr_sdk.rollout.data import PromptRecord, build_groups, group_size, prompt_records, prompt_source
from pdsr_sdk.rollout.results import BatchResult, StepResult


class StreamSteps:
    """The partial-rollout steps of a session (a mixin of :class:`~pdsr_sdk.rollout.session.RolloutSession`, whose
    run, rewards, agents and results it uses). :meth:`_init_stream` sets its state when the session is made.

    It and :class:`~pdsr_sdk.rollout.session_engines.EngineControl` depend on each other: a ``wait_for_update``
    step ends only after the trainer's ``aupdate_weights``, and that update, in the middle of a step, uses the
    step-end state set here (``_stream``, ``_step_end``, :meth:`_mid_stream_step`, :meth:`_await_step_end`,
    :meth:`_check_not_blocked`)."""

    def _init_stream(self) -> None:
        # the step stream, where its new prompts come from, the group size, and the future a step's end sets (to
        # the future of its drained pause)
        self._stream: StepStream | None = None
        self._sources: deque[Iterator] = deque()
        self._stream_n = 0
        self._step_end: asyncio.Future | None = None
        self._stream_base = 0   # batch index of the stream's first step (launch steps are counted from it)
        self._restored: list[tuple[Group, int]] = []
        self._step_prompts = (-1, 0)   # (step, prompts it launched): ids given by the session go on counting
        self._step_error: DataError | None = None   # a top-up's refused prompt: the running step raises it
        # between steps a step's end holds the engines stopped; a caller's pause() then only records its mode and
        # resume() clears it: the next step starts the engines, unless the caller is still paused
        self._caller_paused: str | None = None

    def _between_stream_steps(self) -> bool:
        """Whether the engines are stopped between partial-rollout steps: a step's end stopped them (or kept a pause
        that held them when it came), holding every token, and the next step starts them."""
        return self._stream is not None and not self._mid_stream_step() and self.scheduler.paused in ("abort", "wait")

    def _mid_stream_step(self) -> bool:
        """Whether a partial-rollout step is running (started and not ended; paused or not)."""
        return self._stream is not None and self._step_end is not None and not self._step_end.done()

    def _check_not_blocked(self, version: int, what: str, hint: str) -> None:
        """Partial rollout restarts a stale sample at most once: refuse a version change that would make a
        sample already restarted for staleness too stale again."""
        blocked = self._stream.blocked_by(version) if self._stream is not None else []
        if blocked:
            keys = ", ".join(s.key for s in blocked[:4]) + (", ..." if len(blocked) > 4 else "")
            if not self._mid_stream_step():   # between steps only a jump of several versions can do that
                hint = f"go up one version a step (it is {self.policy_version})"
            raise RunError(f"{what} cannot change to {version} now: sample(s) {keys} were restarted for staleness "
                           f"once and would be too stale again (max_staleness {self._stream.s}); {hint}")

    async def _astream_step(self, prompts: Iterable, *, n: int | None, last: bool,
                            wait_for_update: bool = False) -> StepResult:
        """One step of partial rollout (:mod:`pdsr_sdk.dispatch.steps`).

        ``prompts`` join the stream's source (a list or an iterator; the session takes from it as it
        refills, so an iterator may be given once and ``()`` afterwards). The first step launches
        ``ceil(step_groups x (1 + over_provision))`` groups; each later one restarts samples too stale
        for the current policy version (``max_staleness``), refills that count, and resumes the samples
        the previous step carried, ahead of new work. The step ends when ``step_groups`` groups are
        complete (due groups first, ``group_deadline``): running samples are then aborted with their
        tokens and log-probs kept (as ``pause("abort")``), so the engines are idle while the trainer
        trains and updates weights, and the carried samples continue from their tokens at the next
        step under the new version (their segments say which tokens came from which version). A
        trainer that trains while the next step runs updates in its middle (:meth:`aupdate_weights`);
        the result's ``policy_version`` is the version at the step's end, which token ages count from.
        ``last=True`` launches only what brings the groups in flight to ``step_groups`` and returns every
        group in flight once all are complete (nothing is left carried).
        """
        if self._stream is not None and n is not None and n != self._stream_n:
            # the stream's groups (carried, queued, launched at any later step) all have its first step's size
            raise ConfigValueError(f"step(n={n}): partial rollout keeps one group size for its whole stream, and "
                                   f"this stream's groups have n={self._stream_n} samples (set at its first step); "
                                   f"leave n out at later steps, or start a new session for another n")
        source = prompt_source(prompts)
        if not (isinstance(prompts, Sized) and not isinstance(prompts, (str, Mapping)) and not len(prompts)):
            # (`()` at every step after the first, as the docs give an iterator: kept, it would wait behind an
            # iterator without end for good, one more each step)
            self._sources.append(source)
        self._step_end = asyncio.get_running_loop().create_future()
        self._step_error = None
        first = self._stream is None
        try:
            self._begin_stream_step(n, last, wait_for_update)
        except Exception:
            if first and self.scheduler.paused is not None:
                self._caller_paused = self.scheduler.paused   # paused before the stream began: the caller's pause
            await self._end_failed_step()
            raise
        stream = self._stream
        await self._await_step_end(self._step_end)
        await self._settle_lagging()   # update: staggered: each engine holds the old weights or the new, not half
        if self._step_error is not None:   # a top-up met a prompt it refused: the step ended there, as a step ends
            raise self._step_error
        consumed = stream.consume()
        record = stream.records[-1]
        version = record.version   # the version at the step's end: its token ages count from it
        report = BatchResult.from_report(self.run.report_span(consumed, record.start_s, record.end_s))
        for g in consumed:   # the step that hands the group to the trainer (it may have started earlier)
            g.batch_index = report.batch_index
        report.step = {
            "policy_version": version, "off_policy_tokens": record.off_policy_tokens,
            "off_policy_share": record.off_policy_share, "partial_tokens": record.partial_tokens,
            "max_token_age": record.max_age, "stale_restarts": record.stale_restarts,
            "early_restarts": record.early_restarts, "carried_groups": len(stream.flying),
            "carried_samples": len(self.scheduler.held())}
        if self.group_filter is not None:
            report.step.update({"filtered_groups": record.filtered, "filtered_tokens": record.filtered_tokens,
                                "pass_rate": record.pass_rate, "launched_groups": record.launched,
                                "dropped_groups": record.dropped, "dropped_tokens": record.dropped_tokens,
                                "filtered_reward_errors": 0})
        result = await self._step_result(report, version)
        result.summary.update(report.step)
        result.record = record
        if stream.last_dropped:
            result.dropped = stream.last_dropped
            if self.rewards is not None:
                self.rewards.forget(s for g in stream.last_dropped for s in g.samples)
        if stream.last_filtered:
            result.filtered = stream.last_filtered
            filtered = [s for g in stream.last_filtered for s in g.samples]
            result.filtered_scores = await self.scores(filtered)
            self.rewards.forget(filtered)
            # a failed reward is left out of the filter's comparison, so its group may be filtered for it: count them
            errors = sum(sc is not None and sc.error is not None for sc in result.filtered_scores)
            report.step["filtered_reward_errors"] = result.summary["filtered_reward_errors"] = errors
        return result

    def _begin_stream_step(self, n: int | None, last: bool, wait_for_update: bool) -> None:
        """Start a partial-rollout step: the stream's first launch, or the next step's refill (what it raises,
        such as a DataError naming a prompt, fails this step only)."""
        cfg = self.config
        self.run.begin_span()
        if self._stream is None:
            b = cfg.step_groups or cfg.batch_size
            self._stream_n = group_size(n, cfg.sampling.n)   # checked by astep (None: config.sampling.n)
            self._stream = StepStream(
                self.run, step_groups=b, in_flight=in_flight(b, cfg.over_provision or 0.0), steps=None,
                max_staleness=cfg.max_staleness, group_deadline=cfg.group_deadline,
                new_groups=self._new_stream_groups, on_step_end=self._stream_step_end,
                group_filter=self._passes if self.group_filter is not None else None, keep_records=False,
                adapt=cfg.over_provision is None, filter_config=cfg.filter_groups,
                on_top_up_error=self._top_up_refused)
            self._stream_base = self.run.batch_index
            self._stream.start(last=last, carried=[(g, step - self._stream_base) for g, step in self._restored])
            self._restored = []
        else:
            # the version after the one the previous step ended under: reached already if the trainer
            # updated before this step began
            self._stream.hold_until = self._stream.end_version + 1 if wait_for_update else None
            if self._sources:   # prompts given since the source ran out (which emptied the sources): launch again
                self._stream.exhausted = False
            self._stream.refill(last=last)
            # a step whose B groups were complete before it began ends inside refill: the engines stay
            # stopped (the trainer trains next) and its new groups wait, queued, for the next step
            if not self._step_end.done():
                if self._caller_paused is None:
                    self.scheduler.resume()
                # else the caller paused between steps: the stop is its pause now, and its resume() starts them
                self._caller_paused = None
        if not self._stream.flying:
            raise DataError("step: nothing to run: no new prompts (an empty list, or the iterator is exhausted) "
                            "and no group carried from the previous step")

    async def _end_failed_step(self) -> None:
        """A step failed before its end (a prompt refused at its first launch or at a top-up): end it as a step
        ends, its engines stopped holding every token, so that the session is between steps again (``paused`` is
        the caller's, pause and update_weights work as after a step) and the next step goes on with the groups in
        flight. A failed session (the run's fatal error) is left as it is."""
        if self._fatal.done() or self._stream is None:
            return
        self._stream.closing = True   # as after a step's end: nothing launches or ends until the next refill
        if not self._step_end.done():
            self._stream_step_end()
        await self._await_step_end(self._step_end)

    def _top_up_refused(self, exc: DataError) -> None:
        """Dynamic sampling's top-up in the middle of a step met a prompt that the step's first launch would
        refuse (:meth:`_new_stream_groups`; called inside the scheduler): the step ends now, as a step ends, and
        raises it; the groups in flight carry on into the next step. (Raised here it would end the session.)"""
        self._step_error = exc
        self._stream_step_end()

    def _passes(self, group: Group) -> bool:
        """Dynamic sampling: the group passes the filter (its rewards are in: :meth:`_group_done` saw to it)."""
        scores = [self.rewards.result(s) for s in group.samples]
        return bool(self.group_filter(group, [sc.reward if sc is not None else None for sc in scores]))

    def _group_scored(self, group: Group, scores: list) -> None:
        """A complete group's rewards are in: the step stream judges it (if it is still complete with these)."""
        if self._stream is None or not group.done or any(self.rewards.result(s) is None for s in group.samples):
            return   # restarted meanwhile: it completes, and is scored, again
        self.scheduler.guarded(self._stream.group_done, group)

    async def _await_step_end(self, step_end: asyncio.Future) -> None:
        """Wait for a partial-rollout step's end and for its engines to stop (or raise the run's error)."""
        await asyncio.wait({step_end, self._fatal}, return_when=asyncio.FIRST_COMPLETED)
        if self._fatal.done():
            raise self._fatal.result()
        drained = step_end.result()
        await asyncio.wait({drained, self._fatal}, return_when=asyncio.FIRST_COMPLETED)
        if self._fatal.done():
            raise self._fatal.result()

    def carried(self) -> list[tuple[Group, int]]:
        """Partial rollout: the groups in flight after a step (carried into the next), each with the step
        (batch index) it was launched in. Between steps every sample is stopped, holding its tokens,
        log-probs and segments: save them (``pdsr rollout`` writes ``<out>.parts/_carry.parquet``) and
        give them to :meth:`restore_carried` of a new session to go on after a crash."""
        if self._stream is None:
            return list(self._restored)
        return [(g, self._stream_base + step) for g, step in self._stream.in_flight_groups()]

    def restore_carried(self, groups: list[tuple[Group, int]]) -> None:
        """Before the first step of a partial-rollout session: groups (with their launch steps) that an
        earlier session had in flight, as :meth:`carried` gave them (samples restored, e.g. with
        :func:`~pdsr_sdk.dispatch.trajectory.restore_sample`). They go first and continue from their
        tokens; set :attr:`policy_version` to the version the earlier session had reached first."""
        if not self.streaming:
            raise RunError("restore_carried: only for partial rollout (config.over_provision or config.steps)")
        if self._stream is not None:
            raise RunError("restore_carried: the stream has started; call it before the first step")
        self._restored = list(groups)
        self.give_history([g for g, _ in self._restored])

    def _new_stream_groups(self, count: int) -> list[Group]:
        items: list = []
        while len(items) < count and self._sources:
            items.extend(itertools.islice(self._sources[0], count - len(items)))
            if len(items) < count:
                self._sources.popleft()   # exhausted
        if not items:
            return []
        step = self.run.batch_index
        # a step may launch several times (dynamic sampling's top-ups): its ids go on from its earlier launches
        first = self._step_prompts[1] if self._step_prompts[0] == step else 0
        flying = {g.prompt_id: launched for g, launched in self._stream.in_flight_groups()}
        records: list[PromptRecord] = []
        for j, item in enumerate(items):   # one at a time, so that a refusal names the one item refused
            try:
                records.append(self._stream_record(item, step, first + j, flying, records))
            except DataError:
                # nothing of this launch starts: the others go back to the front of the source, in order, and the
                # next launch takes them (an iterator's caller could not know which to give again)
                if len(items) > 1:
                    self._sources.appendleft(iter(items[:j] + items[j + 1:]))
                self._step_prompts = (step, first)
                raise
        self._step_prompts = (step, first + len(items))
        groups = build_groups(records, self._stream_n, self.config.sampling.max_tokens)
        if self._step_agent is not None:
            self.agents.prepare(groups, self._step_agent, cap_tools=True)
        self.give_history(groups)
        return groups

    def _stream_record(self, item, step: int, i: int, flying: dict[str, int],
                       taken: list[PromptRecord]) -> PromptRecord:
        """The record of a stream's new prompt ``item`` (the ``i``-th the step takes), or a DataError naming it:
        malformed, an id taken in this launch or by a group in flight, or a prompt the engines would refuse."""
        where = f"step {step} prompts"
        (r,) = prompt_records([item], self.config.data, self.tokenizer, id_prefix=f"s{step}-p", where=where, first=i)
        same = next((k for k, t in enumerate(taken, i - len(taken)) if t.prompt_id == r.prompt_id), None)
        if same is not None:
            raise DataError(f"{where}[{i}]: duplicate prompt id {r.prompt_id!r} (also item {same})")
        if r.prompt_id in flying:   # two groups of one id could be returned together, one uid in a trainer's batch
            raise DataError(f"{where}: prompt id {r.prompt_id!r} is given again while its group "
                            f"(launched at step {self._stream_base + flying[r.prompt_id]}) is still in flight; "
                            f"ids must be unique among the groups in flight: give each prompt once (another "
                            f"epoch over the same prompts: give them new ids, such as '{r.prompt_id}-e2')")
        self._check_prompts([r])
        return r

    def _stream_step_end(self) -> None:
        """A step's groups are chosen (called inside the scheduler): stop the engines, keeping every token."""
        drained = asyncio.get_running_loop().create_future()
        on_drained = lambda: drained.done() or drained.set_result(None)   # noqa: E731
        if self.scheduler.paused is None:
            self.scheduler.pause("abort", on_drained=on_drained)
        else:   # it ended before the engines restarted (in refill): they are stopped, or stopping
            self.scheduler.when_drained(on_drained)
        if self._step_end is not None and not self._step_end.done():
            self._step_end.set_result(drained)
