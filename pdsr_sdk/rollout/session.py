"""A rollout session: engines + a policy serving one training step after another.

Trainers use it directly (see docs/sdk.md)::

    with RolloutSession(config) as session:             # starts the engines
        for step in range(steps):
            out = session.step(prompts)                  # this step's groups: out.table, out.groups, out.summary
            ...train...
            session.update_weights(model.state_dict())   # into every engine; the policy version goes up

or, from async code, ``async with RolloutSession(config) as session`` and ``await session.astep(...)``, ``await
session.aupdate_weights(...)``. ``pdsr rollout`` (:func:`.run.run_rollout`) is a loop over :meth:`generate`.

The class is written in nine files: this one (a step), :mod:`.session_start` (its engines' start and close),
:mod:`.session_stream` (partial rollout's steps), :mod:`.session_engines` (weights, pause; sleep in
:mod:`.session_sleep`, a staggered update's later loads in :mod:`.session_stagger`), :mod:`.session_rewards`
(rewards, a step's result), :mod:`.session_serve` (serving) and :mod:`.session_callbacks` (the run's callbacks).
Results: :mod:`.results`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable, Iterable

from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.dispatch.scheduler import Scheduler
from pdsr_sdk.dispatch.types import Group
from pdsr_sdk.errors import ConfigError, DataError, RunError
from pdsr_sdk.policies.resolve import check_streaming, resolve_policy
from pdsr_sdk.rollout.aio import LoopThread
from pdsr_sdk.rollout.data import PromptRecord, build_groups, group_size, prompt_records, step_prompts
from pdsr_sdk.rollout.preflight import check_prompt_ids, prompt_limits
from pdsr_sdk.rollout.results import BatchResult, SessionHooks, StepResult
from pdsr_sdk.rollout.session_callbacks import RunCallbacks
from pdsr_sdk.rollout.session_engines import EngineControl
from pdsr_sdk.rollout.session_rewards import SessionRewards
from pdsr_sdk.rollout.session_serve import Serving
from pdsr_sdk.rollout.session_start import EngineLifecycle
from pdsr_sdk.rollout.session_stream import StreamSteps

__all__ = ["BatchResult", "RolloutSession", "SessionHooks", "StepResult"]


class RolloutSession(EngineLifecycle, StreamSteps, EngineControl, SessionRewards, Serving, RunCallbacks):
    """Engines + one policy instance for a sequence of training steps (see the module docstring).

    ``config``: a :class:`~pdsr_sdk.rollout.config.RolloutConfig` (default: all defaults: the
    built-in tiny model on an automatic engine layout). ``engines``: already started engines to use
    (the caller keeps ownership and closes them); default: build and start them from the config.
    ``model_dir``: the model folder (default ``config.model``, else the built-in tiny model).
    ``reward``: a reward function to use instead of ``config.reward`` (any signature ``config.reward``
    accepts: pdsr's ``fn(response_text, ground_truth, **info)`` or verl's ``compute_score``).
    ``draft_history``: with speculative ``group``, a :class:`~pdsr_sdk.engines.group_drafter.DraftHistory` to
    draft from and add to (e.g. one kept across sessions); default: a new one, read from
    ``config.speculative_settings.history_file`` if given. ``agent``: an ``async def run(agent)`` (or its
    import path) that runs each sample over several turns (:mod:`pdsr_sdk.agent`); default
    ``config.agent.function``; a step's own ``agent=`` overrides it.

    Rewards are computed as samples finish, on ``config.reward_workers`` threads off the event loop
    (:mod:`pdsr_sdk.rollout.reward_runner`); a step's summary has their time and wait (``reward_s``, ``reward_wait_s``).

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
        self.policy_cls, self.policy_settings = resolve_policy(config.policy,
                                                               config.policy_settings.get(config.policy, {}))
        if group_filter is None and config.filter_groups is not None:
            group_filter = self._config_group_filter()
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
        self._closed = False   # close() ran: every later call is refused
        self._stepping: asyncio.Task | None = None   # the task running a step or batch (one at a time)
        self._tokenizer = None
        self._prompt_limits: tuple | None = None   # (vocabulary, context, its source): set at the first prompts
        self._init_rewards(reward)   # a reward pdsr cannot call is an error here, before any engine
        self._thread: LoopThread | None = None
        self._init_engine_control()
        self._init_stream()   # partial rollout across steps (config.streaming)
        #: speculative 'group': earlier responses per prompt, given to each group the session hands to the engines
        #: (``pdsr_sdk.engines.group_drafter.DraftHistory``): ``draft_history`` if given (e.g. an earlier session's),
        #: else one read from ``speculative_settings.history_file``, if any; every group it finishes is added
        self.draft_history = draft_history
        spec = config.speculative_settings
        if self.draft_history is None and config.speculative == "group" and spec.history_responses > 0:
            from pdsr_sdk.engines.group_drafter import DraftHistory

            self.draft_history = DraftHistory(spec.history_responses, spec.history_tokens)
            if spec.history_file is not None:
                self.draft_history.read(spec.history_file, "speculative_settings.history_file (--draft-history)")
        # multi-turn: the default agent function (``agent``, else config.agent.function; None: single-turn)
        from pdsr_sdk.agent.runner import AgentRunner, load_agent

        given_agent = agent if agent is not None else config.agent.function
        if given_agent is not None and self.streaming:
            from pdsr_sdk.rollout.config import check_agent_streaming

            check_agent_streaming(config.max_staleness, group_filter is not None)
        where = "agent.function (--agent)" if agent is None else "RolloutSession(agent=...)"
        self.agent = load_agent(given_agent, where=where) if given_agent is not None else None
        self._step_agent = self.agent   # the agent of the groups a partial-rollout step launches
        self._init_serving()
        self.agents = AgentRunner(lambda: self.scheduler, lambda: self.tokenizer, config.agent,
                                  template_kwargs=config.data.chat_template_kwargs,
                                  vocab=lambda: (self._prompt_limits or (None,))[0])   # set by the step's prompts

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
        self._thread = LoopThread()
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
            self.check_usable(what)   # closed: say so, not "open it first"
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

    # ------------------------------------------------------------ one step
    def load_prompts(self, path: str | Path | None = None) -> list[PromptRecord]:
        """Prompts from a Parquet/JSONL/CSV file read as ``config.data`` says (default: ``config.data.path``,
        else the built-in sample prompts), tokenized with the model's chat template."""
        from pdsr_sdk.rollout.data import load_prompts
        from pdsr_sdk.rollout.sample_data import default_sample_path

        data_path = path or self.config.data.path or default_sample_path()
        return load_prompts(self.config.data, self.tokenizer, path=data_path, n=self.config.sampling.n,
                            reward=self._data_reward())

    def step(self, prompts: Iterable = (), *, n: int | None = None, last: bool = False,
             wait_for_update: bool = False, agent: Callable[..., Any] | None = None) -> StepResult:
        """Run one training step's rollout and return the groups it completed (synchronous; see :meth:`astep`)."""
        return self._call(self.astep(prompts, n=n, last=last, wait_for_update=wait_for_update, agent=agent), "step")

    async def astep(self, prompts: Iterable = (), *, n: int | None = None, last: bool = False,
                    wait_for_update: bool = False, agent: Callable[..., Any] | None = None) -> StepResult:
        """Run one training step's rollout: ``prompts`` is this step's list, or an iterator the step takes
        ``config.batch_size`` prompts from (the rest stay for the next steps). A prompt is a string, a list
        of chat messages, a mapping (``prompt`` or ``messages``, optional ``id``, ``ground_truth``; a verl row) or a
        :class:`~pdsr_sdk.rollout.data.PromptRecord`. Every group gets ``n`` samples (default
        ``config.sampling.n``); each segment records the current :attr:`policy_version`.

        With partial rollout (``config.over_provision`` set, see :meth:`_astream_step`) the step returns
        the ``step_groups`` groups that completed first, and unfinished samples carry into the next
        step: read the groups from the result rather than assume they are the prompts given.
        ``wait_for_update`` (partial rollout, a trainer that trains on the previous step while this one
        runs): the step does not end before the trainer's next :meth:`update_weights`, so its token ages
        count at the weights the trainer trains it with. Only for a trainer that updates during every
        such step: without an update it never ends. One step at a time: another while one runs is a RunError.

        ``agent``: ``async def run(agent)`` run for each sample of this step (multi-turn; default: the
        session's agent, if any; see :mod:`pdsr_sdk.agent`)."""
        self._check_can_generate("step")
        with self._one_step("step"):
            return await self._astep(prompts, n=n, last=last, wait_for_update=wait_for_update, agent=agent)

    async def _astep(self, prompts: Iterable, *, n, last: bool, wait_for_update: bool, agent) -> StepResult:
        given_n, n = n, group_size(n, self.config.sampling.n)   # a stream checks the one given (None: its own)
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
            return await self._astream_step(prompts, n=given_n, last=last, wait_for_update=wait_for_update)
        items = step_prompts(prompts, self.config.batch_size)
        if not items:
            raise DataError("step: no prompts (an empty list, or the prompt iterator is exhausted)")
        step = self.run.batch_index
        records = prompt_records(items, self.config.data, self.tokenizer, id_prefix=f"s{step}-p",
                                 where=f"step {step} prompts")
        version = self.policy_version
        result = await self.generate(records, n=n, agent=agent)
        return await self._step_result(result, version)

    def give_history(self, groups: list[Group]) -> None:
        """Speculative 'group': each group drafts from the earlier responses to its prompt kept so far (none
        recorded while it runs: a prompt's groups rarely overlap). Called for every group the session hands to the
        engines: a step's, a stream's, restored carried ones and a served request's (:mod:`.serve`)."""
        if self.draft_history is not None:
            for g in groups:
                g.draft_responses = self.draft_history.responses(g)

    async def generate(self, records: list[PromptRecord], *, n: int | None = None,
                       agent: Callable[..., Any] | None = None) -> BatchResult:
        """Run one batch of prompt records to completion and return its groups and costs (``agent``: run each
        sample with it, multi-turn; default: the session's agent, if any)."""
        self._check_can_generate("generate")
        with self._one_step("generate"):
            if not self._started:
                await self.start()
            self._check_prompts(records)
            groups = build_groups(records, group_size(n, self.config.sampling.n), self.config.sampling.max_tokens)
            fn = self.agent if agent is None else _load_agent(agent)
            if fn is not None:
                self.agents.prepare(groups, fn, cap_tools=True)
            return await self.run_groups(groups)

    def _check_prompts(self, records: list[PromptRecord]) -> None:
        """A prompt the engines would refuse (no ids, an id out of vocabulary, too long) is a DataError naming it,
        raised before anything reaches an engine: the session goes on."""
        if self._prompt_limits is None:
            self._prompt_limits = prompt_limits(self.config, self.tokenizer, self._model_dir(), self.engines,
                                                self._given_engines is not None)
        vocab, limit, source = self._prompt_limits
        check_prompt_ids(records, vocab=vocab, limit=limit, source=source,
                         max_tokens=self.config.sampling.max_tokens, where=f"step {self.run.batch_index}")

    async def run_groups(self, groups: list[Group]) -> BatchResult:
        self.give_history(groups)
        done = asyncio.get_running_loop().create_future()
        self.run.start_batch(groups, lambda: done.done() or done.set_result(None))
        await asyncio.wait({done, self._fatal}, return_when=asyncio.FIRST_COMPLETED)
        if self._fatal.done():
            raise self._fatal.result()
        return BatchResult.from_report(self.run.finish_batch())


def _load_agent(agent: Callable[..., Any] | str) -> Callable[..., Any]:
    from pdsr_sdk.agent.runner import load_agent
    return load_agent(agent, where="step(agent=...)")
