"""A rollout session's engines, built and started, then closed: a part of
:class:`~pdsr_sdk.rollout.session.RolloutSession` (a mixin; its state is set in the session's ``__init__``)."""

from __future__ import annotations

import asyncio

from pdsr_sdk.dispatch.clock import LoopClock
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.errors import ConfigError, RunError
from pdsr_sdk.rollout.aio import failures
from pdsr_sdk.rollout.preflight import SESSION_PROMPT_ROOM, check_engine_model


class EngineLifecycle:
    """:meth:`start` and :meth:`close` of the session's engines, and the model folder they load."""

    def _model_dir(self) -> str:
        if self.model_dir is None:
            from pdsr_sdk.models.tiny import ensure_tiny_model

            self.model_dir = str(ensure_tiny_model())
        return self.model_dir

    async def start(self, *, max_model_len: int | None = None) -> None:
        """Build and start the engines (at once; each engine process is pinned when it is spawned)."""
        self.check_usable("start")
        if self._started:
            return
        from pdsr_sdk.engines import build_engine
        from pdsr_sdk.engines.vllm_env import is_cpu_build
        from pdsr_sdk.rollout.layout import engine_layout, starting_message

        cfg, required = self.config, getattr(self.policy_cls, "required_pools", ())   # optional in the Protocol
        if cfg.reward_executor == "process":
            self._check_rewards_pickle()   # before any engine starts
        if self._given_engines is not None:
            self.engines = list(self._given_engines)
        else:
            model_dir = self._model_dir()
            needed = max_model_len or (cfg.sampling.max_tokens + SESSION_PROMPT_ROOM)
            self.engine_specs = engine_layout(cfg, required_pools=required, cpu=is_cpu_build(), max_model_len=needed)
            self.engine_specs = check_engine_model(cfg, self.engine_specs, model_dir, lambda: self.tokenizer)
            speculative = cfg.vllm_speculative_config()
            self.engines = [build_engine(spec, model=model_dir, tokenizer=cfg.tokenizer, seed=cfg.seed,
                                         logprobs_mode=cfg.logprobs_mode, speculative=speculative)
                            for spec in self.engine_specs]
        missing = [p for p in required if p not in {e.pool for e in self.engines}]
        if missing:
            raise ConfigError(f"policy {cfg.policy!r} needs an engine in pool(s) {', '.join(missing)}")
        loop = asyncio.get_running_loop()
        self._fatal = loop.create_future()
        version = self.scheduler.policy_version if self.scheduler is not None else cfg.policy_version
        self.run = DispatchRun(
            self.engines, self.policy_cls, self.policy_settings, LoopClock(loop), cfg.sampling, cfg.segments,
            policy_version=version, on_sample_done=self._sample_done, on_group_done=self._group_done,
            on_fatal=self._set_fatal, on_turn_end=self.agents.on_turn_end, on_tokens=self._tokens,
            first_batch_index=self.run.batch_index if self.run is not None else 0)
        self.run.scheduler.salt_by_version = self._keep_kv
        if self.rewards is None:
            from pdsr_sdk.rollout.reward_runner import RewardRunner

            self.rewards = RewardRunner(self.reward_for, lambda: self.tokenizer, workers=cfg.reward_workers,
                                        executor=cfg.reward_executor, given=self._agent_score,
                                        time_limit_s=cfg.reward_time_limit_s)
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
        shared-memory block weight updates used. A call still waiting (a step in another thread or task) ends with
        a RunError; the session refuses every call after."""
        self._closed = True
        self._set_fatal(RunError("the session was closed while this call waited"))
        self._close_weights()
        if self.rewards is not None:
            self.rewards.close()
            self.rewards = None
        self.agents.cancel_all()
        if self._given_engines is None:   # engines passed in are the caller's to close
            await failures(engine.close() for engine in self.engines)
        self._started = False
