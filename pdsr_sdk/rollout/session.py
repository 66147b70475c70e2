"""A rollout session: engines + a policy serving one training step after another.

Trainers use it directly (see docs/sdk.md)::

    with RolloutSession(config) as session:             # starts the engines
        for step in range(steps):
            out = session.step(prompts)                  # this step's groups: out.table, out.groups, out.summary
            ...train...
            session.update_weights(model.state_dict())   # into every engine; the policy version goes up

or, from async code, ``async with RolloutSession(config) as session`` and ``await session.astep(...)``,
``await session.aupdate_weights(...)``. ``pdsr rollout`` (:func:`pdsr_sdk.rollout.run.run_rollout`)
is a loop over :meth:`RolloutSession.generate`.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import threading
from collections import deque
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Iterator

from pdsr_sdk.dispatch.clock import LoopClock
from pdsr_sdk.dispatch.run import BatchReport, DispatchRun
from pdsr_sdk.dispatch.scheduler import PAUSE_MODES, Scheduler
from pdsr_sdk.dispatch.steps import StepRecord, StepStream, in_flight
from pdsr_sdk.dispatch.types import DROPPED, FAILED, Group, Sample
from pdsr_sdk.errors import ConfigError, ConfigValueError, DataError, RunError, UnsupportedError
from pdsr_sdk.policies.resolve import check_streaming, resolve_policy
from pdsr_sdk.rollout.data import PromptRecord, build_groups, prompt_records


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
    #: one-line messages (``starting 2 vLLM engines ...``, ``engines ready in 23.1 s``); see pdsr_sdk.progress
    on_status: list[Callable[[str], None]] = field(default_factory=list)


class RolloutSession:
    """Engines + one policy instance for a sequence of training steps (see the module docstring).

    ``config``: a :class:`~pdsr_sdk.rollout.config.RolloutConfig` (default: all defaults: the
    built-in tiny model on an automatic engine layout). ``engines``: already started engines to use
    (the caller keeps ownership and closes them); default: build and start them from the config.
    ``model_dir``: the model folder (default ``config.model``, else the built-in tiny model).
    ``reward``: a reward function to use instead of ``config.reward`` (any signature ``config.reward``
    accepts: pdsr's ``fn(response_text, ground_truth, **info)`` or verl's ``compute_score``).
    ``draft_history``: with speculative ``group``, a :class:`~pdsr_sdk.engines.group_drafter.DraftHistory` to
    draft from and add to (e.g. one kept across sessions); default: a new one, read from
    ``config.speculative_settings.history_file`` if given.

    Rewards are computed as samples finish, on ``config.reward_workers`` threads off the event loop
    (:mod:`pdsr_sdk.rollout.reward_runner`); a step's summary has their time (``reward_s``) and how long
    the step waited for them after its groups were complete (``reward_wait_s``).

    Dynamic sampling (DAPO): ``config.filter_groups`` (``kind: zero-variance``), or ``group_filter(group,
    rewards) -> bool`` (True keeps the group; it replaces the config's kind), makes steps stream and filters
    each complete group by its rewards; a step returns B groups that passed, and the filtered ones in
    :attr:`StepResult.filtered` (see :mod:`pdsr_sdk.dispatch.steps`).

    Use it as a context manager: ``with`` (synchronous calls: :meth:`step`, :meth:`update_weights`;
    the engines run on an event loop in a background thread) or ``async with`` (:meth:`astep`,
    :meth:`aupdate_weights` on the caller's loop). Engine processes are spawned: a script that
    starts a session needs the ``if __name__ == "__main__":`` guard.
    """

    def __init__(self, config=None, *, engines: list | None = None, model_dir: str | Path | None = None,
                 reward: Callable[..., Any] | None = None,
                 group_filter: Callable[[Group, list[float | None]], bool] | None = None,
                 agent: Callable[..., Any] | None = None, draft_history: Any = None):
        if config is None:
            from pdsr_sdk.rollout.config import RolloutConfig

            config = RolloutConfig()
        self.config = config
        given = model_dir or config.model
        #: the model folder the engines load (resolved when the session starts if not given)
        self.model_dir: str | None = str(given) if given else None
        self.policy_cls, self.policy_settings = resolve_policy(config.policy, config.policy_settings.get(config.policy, {}))
        if group_filter is None and config.filter_groups is not None:
            from pdsr_sdk.dispatch.steps import GROUP_FILTERS

            kind = GROUP_FILTERS[config.filter_groups.kind]

            def group_filter(group: Group, rewards: list[float | None]) -> bool:
                if self.reward_for(group) is None:
                    raise ConfigError(f"filter_groups filters groups by their rewards, and group {group.prompt_id!r} "
                                      f"has none: reward is {config.reward!r} and its prompt has no ground truth; "
                                      f"give the data a ground truth column or set a reward")
                return kind(rewards)
        #: dynamic sampling's predicate (None: no filter)
        self.group_filter = group_filter
        #: whether steps stream (partial rollout; dynamic sampling streams too)
        self.streaming = config.streaming or group_filter is not None
        if self.streaming:
            check_streaming(self.policy_cls, config.policy)
        self._given_engines = engines
        self.engines: list = []
        self.engine_specs: list = []
        self.hooks = SessionHooks()
        self.run: DispatchRun | None = None
        self._fatal: asyncio.Future | None = None
        self._started = False
        self._tokenizer = None
        # by whether the data has a ground truth; a reward pdsr cannot call is an error here, before any engine
        from pdsr_sdk.rollout.reward import adapt_reward, config_reward

        self._reward_fns: dict[bool, Any] = {True: config_reward(config, True)}
        self._reward_override = None if reward is None else adapt_reward(reward, getattr(reward, "__name__", "reward"))
        #: scores finished samples off the event loop (made when the session starts)
        self.rewards = None
        self._reference_weights = None
        self._weights_block = None     # the shared-memory block updates are written to, kept across them
        self._thread: _LoopThread | None = None
        self._prompt_counter = itertools.count()
        self._asleep = False
        self._sleep_paused = False   # sleep() paused the scheduler itself (wake() resumes it)
        # partial rollout across steps (config.streaming): the step stream, where its new prompts come
        # from, the group size, and the future a step's end sets (to the future of its drained pause)
        self._stream: StepStream | None = None
        self._sources: deque[Iterator] = deque()
        self._stream_n = 0
        self._step_end: asyncio.Future | None = None
        self._loading: asyncio.Future | None = None   # set while update_weights loads (a step waits for it)
        self._stream_base = 0   # batch index of the stream's first step (launch steps are counted from it)
        self._restored: list[tuple[Group, int]] = []
        #: speculative 'group': earlier responses per prompt, given to each group the session hands to the engines
        #: (``pdsr_sdk.engines.group_drafter.DraftHistory``): ``draft_history`` if given (e.g. an earlier session's),
        #: else one read from ``speculative_settings.history_file``, if any; every group it finishes is added
        self.draft_history = draft_history
        spec = config.speculative_settings
        if self.draft_history is None and config.speculative == "group" and spec.history_responses > 0:
            from pdsr_sdk.engines.group_drafter import DraftHistory

            self.draft_history = DraftHistory(spec.history_responses)
            if spec.history_file is not None:
                self.draft_history.read(spec.history_file)
        # multi-turn: the default agent function (``agent``, else config.agent.function; None: single-turn), and
        # the runner of agent tasks
        from pdsr_sdk.agent.runner import AgentRunner, load_agent

        given_agent = agent if agent is not None else config.agent.function
        if given_agent is not None and self.streaming:
            from pdsr_sdk.rollout.config import check_agent_streaming

            check_agent_streaming(config.max_staleness, group_filter is not None)
        self.agent = load_agent(given_agent) if given_agent is not None else None
        self._step_agent = self.agent   # the agent of the groups a partial-rollout step launches
        self._http = None   # the HTTP server while serving (aserve)
        self.agents = AgentRunner(lambda: self.scheduler, lambda: self.tokenizer, max_turns=config.agent.max_turns,
                                  turn_max_tokens=config.agent.turn_max_tokens,
                                  env_timeout_s=config.agent.env_timeout_s)

    @property
    def scheduler(self) -> Scheduler | None:
        return self.run.scheduler if self.run is not None else None

    @property
    def policy_version(self) -> int:
        """The weights version new segments are stamped with (bumped by :meth:`update_weights`)."""
        return self.scheduler.policy_version if self.scheduler else self.config.policy_version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        if self.scheduler is None:
            raise RunError("start the session before setting the policy version")
        if value == self.scheduler.policy_version:
            return
        self._check_not_blocked(value, "the policy version", "their groups are due at this step's end: set it "
                                "after step() returns")
        self.scheduler.policy_version = value
        if self._mid_stream_step():
            self._stream.version_changed()

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

    @property
    def tokenizer(self):
        """The model's tokenizer (``config.tokenizer`` or the model folder's), loaded on first use."""
        if self._tokenizer is None:
            from pdsr_sdk.rollout.data import load_tokenizer

            self._tokenizer = load_tokenizer(self.config.tokenizer or self._model_dir())
        return self._tokenizer

    # ------------------------------------------------------- context managers
    def __enter__(self) -> "RolloutSession":
        if self._thread is not None or self._started:
            raise RunError("this session is already open")
        self._thread = _LoopThread()
        try:
            self._thread.call(self.start())
        except BaseException:
            self._thread.call(self.close())
            self._thread.stop()
            self._thread = None
            raise
        return self

    def __exit__(self, *exc) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            thread.call(self.close())
        finally:
            thread.stop()

    async def __aenter__(self) -> "RolloutSession":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _call(self, coro, what: str):
        """Run ``coro`` on the session's background loop (synchronous API)."""
        if self._thread is None:
            coro.close()
            try:
                asyncio.get_running_loop()
                inside = True
            except RuntimeError:
                inside = False
            if inside:
                raise RunError(f"session.{what}() is the synchronous call; in async code use "
                                f"`await session.a{what}(...)`")
            raise RunError(f"session.{what}(): open the session first: `with RolloutSession(config) as session:`")
        return self._thread.call(coro)

    # ------------------------------------------------------------- lifecycle
    def _model_dir(self) -> str:
        if self.model_dir is None:
            from pdsr_sdk.models.tiny import ensure_tiny_model

            self.model_dir = str(ensure_tiny_model())
        return self.model_dir

    async def start(self, *, max_model_len: int | None = None) -> None:
        """Build and start the engines (at once; each engine process is pinned when it is spawned)."""
        if self._started:
            return
        from pdsr_sdk.engines import build_engine
        from pdsr_sdk.engines.vllm_env import is_cpu_build
        from pdsr_sdk.rollout.layout import engine_layout, starting_message

        cfg = self.config
        if cfg.reward_executor == "process":
            self._check_rewards_pickle()   # before any engine starts
        if self._given_engines is not None:
            self.engines = list(self._given_engines)
        else:
            model_dir = self._model_dir()
            needed = max_model_len or (cfg.sampling.max_tokens + 1024)
            self.engine_specs = engine_layout(cfg, required_pools=self.policy_cls.required_pools,
                                              cpu=is_cpu_build(), max_model_len=needed)
            speculative = cfg.vllm_speculative_config()
            self.engines = [build_engine(spec, model=model_dir, tokenizer=cfg.tokenizer, seed=cfg.seed,
                                         logprobs_mode=cfg.logprobs_mode, speculative=speculative)
                            for spec in self.engine_specs]
        missing = [p for p in self.policy_cls.required_pools if p not in {e.pool for e in self.engines}]
        if missing:
            raise ConfigError(f"policy {self.policy_cls.name!r} needs an engine in pool(s) {', '.join(missing)}")
        loop = asyncio.get_running_loop()
        self._fatal = loop.create_future()
        version = self.scheduler.policy_version if self.scheduler is not None else cfg.policy_version
        self.run = DispatchRun(
            self.engines, self.policy_cls, self.policy_settings, LoopClock(loop), cfg.sampling, cfg.segments,
            policy_version=version, on_sample_done=self._sample_done, on_group_done=self._group_done,
            on_fatal=self._set_fatal, on_turn_end=self.agents.on_turn_end, first_batch_index=self.run.batch_index if self.run is not None else 0)
        self.run.scheduler.salt_by_version = self._keep_kv
        if self.rewards is None:
            from pdsr_sdk.rollout.reward_runner import RewardRunner

            self.rewards = RewardRunner(self.reward_for, lambda: self.tokenizer, workers=cfg.reward_workers,
                                        executor=cfg.reward_executor, given=self._agent_score)
        if self._given_engines is None:
            began = loop.time()
            self._status(starting_message(self.engine_specs, self._model_dir()))
            failed = await _failures(engine.start() for engine in self.engines)
            if failed:
                await _failures(engine.close() for engine in self.engines)
                raise failed[0]
            self._status(f"engines ready in {loop.time() - began:.1f} s")
        self._started = True

    async def close(self) -> None:
        """Close the engines this session built (engines passed in belong to the caller) and free the
        shared-memory block weight updates used."""
        if self._weights_block is not None:
            self._weights_block.close()
            self._weights_block = None
        if self.rewards is not None:
            self.rewards.close()
            self.rewards = None
        self.agents.cancel_all()
        if self._given_engines is not None:
            self._started = False
            return
        await _failures(engine.close() for engine in self.engines)
        self._started = False

    # ------------------------------------------------------------ one step
    def load_prompts(self, path: str | Path | None = None) -> list[PromptRecord]:
        """Prompts from a Parquet/JSONL file read as ``config.data`` says (default: ``config.data.path``,
        else the built-in sample prompts), tokenized with the model's chat template."""
        from pdsr_sdk.rollout.data import load_prompts
        from pdsr_sdk.rollout.sample_data import default_sample_path

        data_path = path or self.config.data.path or default_sample_path()
        return load_prompts(self.config.data, self.tokenizer, path=data_path, n=self.config.sampling.n)

    def step(self, prompts: Iterable = (), *, n: int | None = None, last: bool = False,
             wait_for_update: bool = False, agent: Callable[..., Any] | None = None) -> StepResult:
        """Run one training step's rollout and return the groups it completed (synchronous; see :meth:`astep`)."""
        return self._call(self.astep(prompts, n=n, last=last, wait_for_update=wait_for_update, agent=agent), "step")

    async def astep(self, prompts: Iterable = (), *, n: int | None = None, last: bool = False,
                    wait_for_update: bool = False, agent: Callable[..., Any] | None = None) -> StepResult:
        """Run one training step's rollout: ``prompts`` is this step's list, or an iterator the step takes
        ``config.batch_size`` prompts from (the rest stay for the next steps). A prompt is a string, a list
        of chat messages, a mapping (``prompt`` or ``messages``, optional ``id``, ``ground_truth``) or a
        :class:`~pdsr_sdk.rollout.data.PromptRecord`. Every group gets ``n`` samples (default
        ``config.sampling.n``); each segment records the current :attr:`policy_version`.

        With partial rollout (``config.over_provision`` set, see :meth:`_astream_step`) the step returns
        the ``step_groups`` groups that completed first, and unfinished samples carry into the next
        step: read the groups from the result rather than assume they are the prompts given.
        ``wait_for_update`` (partial rollout, a trainer that trains on the previous step while this one
        runs): the step does not end before the trainer's next :meth:`update_weights`, so its token ages
        count at the weights the trainer trains it with. Only for a trainer that updates during every
        such step: without an update it never ends.

        ``agent``: ``async def run(agent)`` run for each sample of this step (multi-turn; default: the
        session's agent, if any; see :mod:`pdsr_sdk.agent`)."""
        if agent is not None and self.streaming:
            from pdsr_sdk.rollout.config import check_agent_streaming

            check_agent_streaming(self.config.max_staleness, self.group_filter is not None)
        if wait_for_update and not self.streaming:
            raise ConfigError("step(wait_for_update=True) is for partial rollout (config.over_provision or "
                              "config.steps set): a step without it ends when its groups are complete")
        if not self._started:
            await self.start()
        while self._loading is not None:   # a trainer's update_weights (another thread) is loading
            await asyncio.shield(self._loading)
        if self.streaming:
            # the groups this step launches run with this agent (carried ones keep theirs)
            self._step_agent = self.agent if agent is None else _load_agent(agent)
            return await self._astream_step(prompts, n=n, last=last, wait_for_update=wait_for_update)
        items = list(prompts) if isinstance(prompts, (list, tuple)) else _take(prompts, self.config.batch_size)
        if not items:
            raise DataError("step: no prompts (an empty list, or the prompt iterator is exhausted)")
        step = self.run.batch_index
        records = prompt_records(items, self.config.data, self.tokenizer, id_prefix=f"s{step}-p",
                                 where=f"step {step} prompts")
        version = self.policy_version
        result = await self.generate(records, n=n, agent=agent)
        return await self._step_result(result, version)

    # ------------------------------------------------- partial rollout
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
        cfg = self.config
        self._sources.append(iter(prompts))
        self._step_end = asyncio.get_running_loop().create_future()
        self.run.begin_span()
        if self._stream is None:
            b = cfg.step_groups or cfg.batch_size
            self._stream_n = n or cfg.sampling.n
            self._stream = StepStream(
                self.run, step_groups=b, in_flight=in_flight(b, cfg.over_provision or 0.0), steps=None,
                max_staleness=cfg.max_staleness, group_deadline=cfg.group_deadline,
                new_groups=self._new_stream_groups, on_step_end=self._stream_step_end,
                group_filter=self._passes if self.group_filter is not None else None,
                adapt=cfg.over_provision is None, filter_config=cfg.filter_groups)
            self._stream_base = self.run.batch_index
            self._stream.start(last=last, carried=[(g, step - self._stream_base) for g, step in self._restored])
            self._restored = []
        else:
            # the version after the one the previous step ended under: reached already if the trainer
            # updated before this step began
            self._stream.hold_until = self._stream.end_version + 1 if wait_for_update else None
            self._stream.refill(last=last)
            # a step whose B groups were complete before it began ends inside refill: the engines stay
            # stopped (the trainer trains next) and its new groups wait, queued, for the next step
            if not self._step_end.done():
                self.scheduler.resume()
        stream = self._stream
        if not stream.flying:
            raise DataError("step: nothing to run: no new prompts (an empty list, or the iterator is exhausted) "
                            "and no group carried from the previous step")
        await self._await_step_end(self._step_end)
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
                                "dropped_groups": record.dropped, "dropped_tokens": record.dropped_tokens})
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
        return result

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
        records = prompt_records(items, self.config.data, self.tokenizer, id_prefix=f"s{step}-p",
                                 where=f"step {step} prompts")
        groups = build_groups(records, self._stream_n, self.config.sampling.max_tokens)
        if self._step_agent is not None:
            self.agents.prepare(groups, self._step_agent)
        self.give_history(groups)
        return groups

    def give_history(self, groups: list[Group]) -> None:
        """Speculative 'group': each group drafts from the earlier responses to its prompt kept so far (none
        recorded while it runs: a prompt's groups rarely overlap). Called for every group the session hands to the
        engines: a step's, a stream's, restored carried ones and a served request's (:mod:`.serve`)."""
        if self.draft_history is not None:
            for g in groups:
                g.draft_responses = self.draft_history.responses(g)

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

    def reward_for(self, group: Group):
        """The reward function for a group's samples: the one given to the session, else ``config.reward``
        resolved for data with a ground truth or without (None: no reward)."""
        if self._reward_override is not None:
            return self._reward_override
        has_truth = group.ground_truth is not None
        if has_truth not in self._reward_fns:
            from pdsr_sdk.rollout.reward import config_reward

            self._reward_fns[has_truth] = config_reward(self.config, has_truth)
        return self._reward_fns[has_truth]

    def _check_rewards_pickle(self) -> None:
        """``reward_executor: process``: the reward functions must pickle (ConfigError naming them if not)."""
        from pdsr_sdk.rollout.reward import config_reward
        from pdsr_sdk.rollout.reward_runner import check_picklable

        if self._reward_override is not None:
            check_picklable(self._reward_override)
            return
        for has_truth in (True, False):
            if has_truth not in self._reward_fns:
                self._reward_fns[has_truth] = config_reward(self.config, has_truth)
            check_picklable(self._reward_fns[has_truth], f"reward {self.config.reward!r}")

    def _agent_score(self, sample: Sample) -> tuple[float | None, str | None, str | None] | None:
        """A multi-turn sample's reward when its agent decided it: (reward, extra as JSON, error); None when the
        reward function scores it (see RewardRunner's ``given``)."""
        import json

        if sample.turns is None:
            return None
        outcome = self.agents.outcomes.pop(sample, None)
        if sample.finish_reason == FAILED:
            return None, None, None   # no reward; the row's error says why
        if outcome is None or outcome.reward is None:
            return None
        extra = json.dumps(outcome.extra, default=str) if outcome.extra else None
        return outcome.reward, extra, None

    async def scores(self, samples: Iterable[Sample]) -> list:
        """The rewards of finished samples (:class:`~pdsr_sdk.rollout.reward_runner.Scored`, in order), waiting
        for those still being computed; a reward misconfigured (a pdsr error) raises here."""
        if self.rewards is None:
            raise RunError("scores: start the session first")
        return await self.rewards.wait(samples)

    async def _step_result(self, result: BatchResult, version: int) -> StepResult:
        import pyarrow as pa

        from pdsr_sdk.dispatch.trajectory import reward_extra_struct, sample_row, trajectory_schema

        samples = [s for g in result.groups for s in g.samples]
        loop = asyncio.get_running_loop()
        began = loop.time()
        scored = await self.scores(samples)
        waited = loop.time() - began
        self.rewards.forget(samples)
        rows = [sample_row(s, self.tokenizer, None, scored=sc) for s, sc in zip(samples, scored)]
        timeouts = sum(sc.timeouts for sc in scored)
        errors = sum(r["reward_error"] is not None for r in rows)
        table = reward_extra_struct(pa.Table.from_pylist(rows, schema=trajectory_schema()))
        rewards = [r["reward"] for r in rows if r["reward"] is not None]
        summary = {
            "step": result.batch_index, "policy_version": version, "groups": len(result.groups),
            "samples": len(rows), "tokens": result.tokens, "makespan_s": result.makespan_s,
            "tokens_per_s": result.tokens_per_s,
            "mean_response_length": result.tokens / len(rows) if rows else 0.0,
            "reward_mean": sum(rewards) / len(rewards) if rewards else None, "reward_timeouts": timeouts,
            "reward_errors": errors, "reward_s": sum(sc.seconds for sc in scored), "reward_wait_s": waited,
            "engine_busy_s": dict(result.engine_busy_s), **result.stats,
        }
        multi = [s for s in samples if s.turns is not None]
        if multi:
            summary.update({
                "agent_failed": sum(s.finish_reason == FAILED for s in multi),
                "turns_mean": sum(sum(t.role == "assistant" for t in s.turns) for s in multi) / len(multi),
                "env_tokens": sum(s.env_tokens for s in multi), "env_s": sum(s.env_s for s in multi)})
        return StepResult(step=result.batch_index, policy_version=version, groups=result.groups, table=table,
                          summary=summary, report=result, scores=scored)

    async def generate(self, records: list[PromptRecord], *, n: int | None = None,
                       agent: Callable[..., Any] | None = None) -> BatchResult:
        """Run one batch of prompt records to completion and return its groups and costs (``agent``: run each
        sample with it, multi-turn; default: the session's agent, if any)."""
        if not self._started:
            await self.start()
        groups = build_groups(records, n or self.config.sampling.n, self.config.sampling.max_tokens)
        fn = self.agent if agent is None else _load_agent(agent)
        if fn is not None:
            self.agents.prepare(groups, fn)
        return await self.run_groups(groups)

    async def run_groups(self, groups: list[Group]) -> BatchResult:
        self.give_history(groups)
        done = asyncio.get_running_loop().create_future()
        self.run.start_batch(groups, lambda: done.done() or done.set_result(None))
        await asyncio.wait({done, self._fatal}, return_when=asyncio.FIRST_COMPLETED)
        if self._fatal.done():
            raise self._fatal.result()
        return BatchResult.from_report(self.run.finish_batch())

    # -------------------------------------------------------------- serving
    def serve(self, host: str = "127.0.0.1", port: int = 8000, **kw: Any) -> None:
        """Serve OpenAI-style requests until :meth:`stop_serving` or Ctrl-C (synchronous; see :meth:`aserve`)."""
        return self._call(self.aserve(host, port, **kw), "serve")

    async def aserve(self, host: str = "127.0.0.1", port: int = 8000, *, model_name: str | None = None,
                     tool_parser: str | None = None, on_ready: Callable[[int], None] | None = None) -> None:
        """Serve ``POST /v1/chat/completions``, ``POST /v1/completions`` and ``GET /v1/models`` on the engines,
        each request a group through the policy, until :meth:`stop_serving` (:mod:`pdsr_sdk.rollout.serve`:
        named samples, recorded token-exact). ``on_ready(port)`` is called once it listens (``port=0``: any
        free port). ``tool_parser``: parse the model's tool calls into ``tool_calls`` with that vLLM parser."""
        import uvicorn

        from pdsr_sdk.rollout.serve import ChatServer
        from pdsr_sdk.rollout.serve_app import create_app

        if self.streaming:
            raise ConfigError("serve: a serving session runs requests as they come; drop over_provision, steps "
                              "and filter_groups")
        check_streaming(self.policy_cls, self.config.policy)   # requests arrive while others run
        if not self._started:
            await self.start()
        server = ChatServer(self, model_name=model_name or Path(self._model_dir()).name, tool_parser=tool_parser)
        http = uvicorn.Server(uvicorn.Config(create_app(server), host=host, port=port, log_level="warning",
                                             lifespan="off"))
        self._http = http
        task = asyncio.ensure_future(http.serve())
        try:
            while not http.started and not task.done():
                await asyncio.sleep(0.02)
            if http.started and on_ready is not None:
                on_ready(http.servers[0].sockets[0].getsockname()[1])
            await task
        finally:
            self._http = None
            self.hooks.on_group_done.remove(server._group_done)
            if not task.done():
                http.should_exit = True
                await asyncio.gather(task, return_exceptions=True)

    def stop_serving(self) -> None:
        """Stop :meth:`aserve` (it returns once open requests are answered); from any thread."""
        if self._http is not None:
            self._http.should_exit = True

    # -------------------------------------------------------------- weights
    def update_weights(self, weights, *, version: int | None = None) -> int:
        """Load new weights into every engine (synchronous; see :meth:`aupdate_weights`)."""
        return self._call(self.aupdate_weights(weights, version=version), "update_weights")

    async def aupdate_weights(self, weights, *, version: int | None = None) -> int:
        """Load new weights into every engine, reset their prefix caches, and bump the policy version
        (to ``version`` if given, else by one); returns the new version.

        ``weights``: a state dict (``{name: tensor}``, e.g. ``model.state_dict()``), an iterable of
        ``(name, tensor)`` pairs, or a model folder (safetensors). Every tensor of the model at once,
        with the checkpoint's names (Hugging Face names; a tied ``lm_head.weight`` may be left in).
        Tensors travel through one shared-memory block that every local engine process maps (no
        pickling; the session keeps the block and rewrites it at each update, until :meth:`close`), to
        Ray engines through Ray's object store, and by CUDA IPC handle to a local engine on the GPU the
        tensors sit on. Between steps, or while paused; in partial rollout (``over_provision`` set) also
        while a step runs, for a trainer that trains on one step while the next generates: the engines
        then stop keeping every token, load, and go on under the new version (a change that would make a
        sample already restarted for staleness too stale again waits for the step's end).
        A bad name or shape raises a :class:`~pdsr_sdk.errors.DataError` naming the parameter before
        anything changes; an engine's failure an :class:`~pdsr_sdk.errors.EngineError` with its name.
        """
        from pdsr_sdk.engines.weights import ModelWeights, WeightsBlock, stage_weights

        if not self._started:
            raise RunError("update_weights: start the session first")
        if self._asleep:
            raise RunError("update_weights: the engines are asleep; call session.wake() first")
        streaming_mid_step = self._mid_stream_step()
        if not streaming_mid_step and self.scheduler is not None and not self.scheduler.idle \
                and self.scheduler.paused is None:
            raise RunError("update_weights: a step is running; pause it first (session.pause(...)) or update "
                           "weights between steps")
        new = self.policy_version + 1 if version is None else int(version)
        engines = self._live_engines()
        unsupported = [e.name for e in engines if not hasattr(e, "update_weights")]
        if unsupported:
            raise ConfigError(f"update_weights: engine(s) {', '.join(unsupported)} cannot load weights (their "
                              f"backend has no update_weights; the 'vllm' and 'ray' backends do)")
        if self._reference_weights is None:
            self._reference_weights = ModelWeights.read(self._model_dir())
        if self._weights_block is None:
            self._weights_block = WeightsBlock()
        staged = stage_weights(weights, self._reference_weights, block=self._weights_block)
        step_end, paused_here = self._step_end, False
        try:
            if streaming_mid_step:
                # a pipelined trainer's update while a partial-rollout step runs: stop the engines keeping
                # every token (their samples go on under the new version), unless the caller paused them
                if self.scheduler.paused is None:
                    await self.apause("abort")
                    paused_here = True
                if paused_here and self._mid_stream_step() and self._stream.blocked_by(new):
                    # a sample restarted for staleness once would turn stale again: its group is due, so
                    # this step's end consumes it (even if it waits for this update); load after that end
                    self._stream.release_hold()
                    if not step_end.done():
                        await self.aresume()
                    paused_here = False
                    await self._await_step_end(step_end)
            self._check_not_blocked(new, "update_weights: the policy version",
                                    "their groups are due at this step's end: call update_weights without "
                                    "pausing first (it then waits for that end), or after step() returns")
            self._loading = asyncio.get_running_loop().create_future()
            failed = await _failures(e.update_weights(staged, reset_prefix_cache=not self._keep_kv) for e in engines)
            if failed:
                raise failed[0]
            self.policy_version = new
        finally:
            staged.close()
            if self._loading is not None:
                self._loading.set_result(None)
                self._loading = None
            if paused_here and not step_end.done():   # else the step ended meanwhile: its engines stay stopped
                await self.aresume()
        return new

    @property
    def _keep_kv(self) -> bool:
        return self.config.kv_on_update == "keep"

    def next_version(self) -> int:
        """A weight update without weights (synchronous; see :meth:`anext_version`)."""
        return self._call(self.anext_version(), "next_version")

    async def anext_version(self) -> int:
        """A weight update without weights: the policy version goes up by one and, unless ``kv_on_update`` is
        ``keep``, the engines' prefix caches are reset, as :meth:`aupdate_weights` does (``pdsr rollout --steps``
        and the benchmarks stand in for a trainer with it). Between steps, or while paused with nothing running.
        Returns the new version."""
        if not self._started or self.scheduler is None:
            raise RunError("next_version: start the session first")
        if not self._keep_kv:
            failed = await _failures(_reset_prefix_cache(e) for e in self._live_engines())
            if failed:
                raise failed[0]
        self.policy_version += 1
        return self.policy_version

    # --------------------------------------------------------- pause / sleep
    @property
    def paused(self) -> str | None:
        """The pause mode while paused (``abort``, ``wait``, ``keep``), else None."""
        return self.scheduler.paused if self.scheduler is not None else None

    def pause(self, mode: str = "abort") -> None:
        """Pause generation for a weight update (synchronous; see :meth:`apause`). Call it from another
        thread than the one blocked in :meth:`step`."""
        return self._call(self.apause(mode), "pause")

    async def apause(self, mode: str = "abort") -> None:
        """Pause generation, e.g. to update weights in the middle of a step; :meth:`aresume` goes on.

        - ``abort``: running requests are aborted now; each sample keeps its tokens and log-probs and
          continues from them after resume (a new segment, stamped with the policy version then).
          Returns once every aborted request has come back.
        - ``wait``: running samples run to their end (or until the policy queues them); nothing new
          starts. Returns when none runs.
        - ``keep``: running requests are frozen inside the engines (vLLM's ``pause_generation("keep")``;
          the KV cache is dropped, so they recompute their context with the weights loaded by resume)
          and go on after resume; each such sample's segment is split at the resume when the policy
          version changed. Needs engines that can freeze requests (the ``vllm`` and ``ray`` backends).

        Nothing new starts until resume, also in a step started while paused. Every sample finishes
        in full: the step returns every sample of its groups.
        """
        if mode not in PAUSE_MODES:
            raise ConfigValueError(f"pause: mode must be one of {', '.join(PAUSE_MODES)}; got {mode!r}")
        if not self._started or self.scheduler is None:
            raise RunError("pause: start the session first")
        sched = self.scheduler
        if sched.paused is not None:
            raise RunError(f"pause: already paused (mode {sched.paused!r}); call resume() first")
        engines = self._live_engines()
        if mode == "keep":
            lacking = [e.name for e in engines if not hasattr(e, "pause_generation")]
            if lacking:
                raise UnsupportedError(f"pause('keep'): engine(s) {', '.join(lacking)} cannot freeze running "
                                       f"requests (their backend has no pause_generation; the 'vllm' and 'ray' "
                                       f"backends do); use pause('abort') or pause('wait')")
        drained = asyncio.get_running_loop().create_future()
        sched.pause(mode, on_drained=lambda: drained.done() or drained.set_result(None))
        if mode == "keep":
            failed = await _failures(e.pause_generation("keep", clear_cache=not self._keep_kv) for e in engines)
            if failed:
                await self.aresume()
                raise failed[0]
            return
        await asyncio.wait({drained, self._fatal}, return_when=asyncio.FIRST_COMPLETED)
        if self._fatal.done() and not drained.done():
            raise self._fatal.result()

    def resume(self) -> None:
        """End a pause (synchronous; see :meth:`aresume`)."""
        return self._call(self.aresume(), "resume")

    async def aresume(self) -> None:
        """End a pause: held samples continue from their tokens, frozen ones go on, queued work starts.
        Segments generated from here on record the current :attr:`policy_version`. Not paused: nothing."""
        sched = self.scheduler
        if sched is None or sched.paused is None:
            return
        if self._asleep:
            raise RunError("resume: the engines are asleep; call session.wake() first")
        mode = sched.paused
        self._sleep_paused = False
        sched.resume()
        if mode == "keep":
            failed = await _failures(e.resume_generation() for e in self._live_engines())
            if failed:
                raise failed[0]

    def sleep(self, level: int = 1) -> None:
        """Free the engines' memory between steps (synchronous; see :meth:`asleep`)."""
        return self._call(self.asleep(level), "sleep")

    async def asleep(self, level: int = 1) -> None:
        """Free the engines' memory (vLLM sleep mode) while the trainer needs it; :meth:`awake` restores it.
        Level 1 keeps the weights in host memory and drops the KV cache; level 2 drops the weights too
        (load them again with :meth:`aupdate_weights` after waking). No request may be running: call it
        between steps or after ``pause("abort")`` / ``pause("wait")``; nothing starts while asleep.

        Engines that cannot free memory make it raise :class:`~pdsr_sdk.errors.UnsupportedError` naming
        them, before any engine sleeps: vLLM's CPU build (its sleep mode is GPU-only), and GPU engines
        started without ``engine_args: {enable_sleep_mode: true}``."""
        if not self._started or self.scheduler is None:
            raise RunError("sleep: start the session first")
        if self._asleep:
            return
        sched = self.scheduler
        if sched.in_flight:
            raise RunError(f"sleep: {sched.in_flight} request(s) are running; call it between steps or after "
                           f"pause('abort') / pause('wait')")
        engines = self._live_engines()
        reasons = {e.name: (e.sleep_unsupported() if hasattr(e, "sleep_unsupported") else
                            "its backend has no sleep mode") for e in engines}
        reasons = {name: why for name, why in reasons.items() if why}
        if reasons:
            detail = "; ".join(f"{name}: {why}" for name, why in reasons.items())
            raise UnsupportedError(f"sleep: engine memory cannot be freed here ({detail}); the engines stay "
                                   f"awake and keep their memory")
        if sched.paused is None:
            sched.pause("abort")   # nothing runs: this only keeps new work from starting
            self._sleep_paused = True
        failed = await _failures(e.sleep(level) for e in engines)
        self._asleep = True
        if failed:
            await self.awake()
            raise failed[0]

    def wake(self) -> None:
        """Restore what :meth:`sleep` freed (synchronous; see :meth:`awake`)."""
        return self._call(self.awake(), "wake")

    async def awake(self) -> None:
        """Restore the engines' memory after :meth:`asleep` (after level 2, load weights next). Not asleep:
        nothing."""
        if not self._asleep:
            return
        failed = await _failures(e.wake_up() for e in self._live_engines())
        self._asleep = False
        if self._sleep_paused:
            self._sleep_paused = False
            self.scheduler.resume()
        if failed:
            raise failed[0]

    def _live_engines(self) -> list:
        """The engines the scheduler has not seen die."""
        return self.scheduler.live_engines() if self.scheduler is not None else list(self.engines)

    # -------------------------------------------------------------- hooks
    def _sample_done(self, sample: Sample) -> None:
        if sample.turns is not None:
            self.agents.on_sample_done(sample)
        if self.rewards is not None and sample.finish_reason != DROPPED:   # a dropped group is never judged
            self.rewards.submit(sample)
        for fn in self.hooks.on_sample_done:
            fn(sample)

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
        if self._fatal is not None and not self._fatal.done():
            self._fatal.set_result(exc)


async def _reset_prefix_cache(engine) -> None:
    """An engine's ``reset_prefix_cache`` (async on vLLM and Ray engines, immediate on simulated ones; an engine
    without a prefix cache has none)."""
    result = getattr(engine, "reset_prefix_cache", lambda: None)()
    if inspect.isawaitable(result):
        await result


async def _failures(calls: Iterable[Awaitable]) -> list[BaseException]:
    """Await ``calls`` together, each to its end; the exceptions they raised (the caller raises the first)."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    return [r for r in results if isinstance(r, BaseException)]


def _load_agent(agent: Callable[..., Any] | str) -> Callable[..., Any]:
    from pdsr_sdk.agent.runner import load_agent

    return load_agent(agent)


def _take(prompts: Iterable, count: int) -> list:
    """Up to ``count`` items from an iterator (or any iterable)."""
    it: Iterator = iter(prompts)
    return list(itertools.islice(it, count))


class _LoopThread:
    """An asyncio loop in a daemon thread: where a synchronous session's engines live (vLLM's
    ``AsyncLLM`` stays on the loop it started on)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="pdsr-session", daemon=True)
        self.thread.start()

    def call(self, coro):
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            # Ctrl-C or an error here: stop the coroutine too (its engines are closed by __exit__)
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=60)
        if not self.thread.is_alive():
            self.loop.close()
