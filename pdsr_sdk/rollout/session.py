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

The class is written in three files: this one (its engines' lifecycle, a step, rewards, serving, the dispatcher's
callbacks), :mod:`.session_stream` (partial rollout's steps) and :mod:`.session_engines` (weight updates, pause,
sleep). Its results are in :mod:`.results`.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from pdsr_sdk.dispatch.clock import LoopClock
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.dispatch.scheduler import Scheduler
from pdsr_sdk.dispatch.types import DROPPED, FAILED, Group, Sample
from pdsr_sdk.errors import ConfigError, DataError, RunError
from pdsr_sdk.policies.resolve import check_streaming, resolve_policy
from pdsr_sdk.rollout.aio import LoopThread, failures
from pdsr_sdk.rollout.data import PromptRecord, build_groups, prompt_records
from pdsr_sdk.rollout.results import BatchResult, SessionHooks, StepResult
from pdsr_sdk.rollout.session_engines import EngineControl
from pdsr_sdk.rollout.session_stream import StreamSteps

__all__ = ["BatchResult", "RolloutSession", "SessionHooks", "StepResult"]


class RolloutSession(StreamSteps, EngineControl):
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
            failed = await failures(engine.start() for engine in self.engines)
            if failed:
                await failures(engine.close() for engine in self.engines)
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
        await failures(engine.close() for engine in self.engines)
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

    def give_history(self, groups: list[Group]) -> None:
        """Speculative 'group': each group drafts from the earlier responses to its prompt kept so far (none
        recorded while it runs: a prompt's groups rarely overlap). Called for every group the session hands to the
        engines: a step's, a stream's, restored carried ones and a served request's (:mod:`.serve`)."""
        if self.draft_history is not None:
            for g in groups:
                g.draft_responses = self.draft_history.responses(g)

    # ------------------------------------------------------ rewards, results
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
            server.close()
            if not task.done():
                http.should_exit = True
                await asyncio.gather(task, return_exceptions=True)

    def stop_serving(self) -> None:
        """Stop :meth:`aserve` (it returns once open requests are answered); from any thread."""
        if self._http is not None:
            self._http.should_exit = True

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


def _load_agent(agent: Callable[..., Any] | str) -> Callable[..., Any]:
    from pdsr_sdk.agent.runner import load_agent

    return load_agent(agent)


def _take(prompts: Iterable, count: int) -> list:
    """Up to ``count`` items from an iterator (or any iterable)."""
    it: Iterator = iter(prompts)
    return list(itertools.islice(it, count))
