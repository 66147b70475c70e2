"""A rollout session: engines + a policy serving one batch after another.

Trainers use it directly::

    async with RolloutSession(config) as session:
        for step in range(steps):
            groups = await session.generate(records)   # one batch
            ...train...
            session.policy_version += 1                 # recorded on new segments

``pdsr rollout`` (:func:`pdsr_sdk.rollout.run.run_rollout`) is a loop over this.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

from pdsr_sdk.dispatch.clock import LoopClock
from pdsr_sdk.dispatch.run import BatchReport, DispatchRun
from pdsr_sdk.dispatch.scheduler import Scheduler
from pdsr_sdk.dispatch.types import Group, Sample
from pdsr_sdk.errors import ConfigError, PdsrError
from pdsr_sdk.policies.resolve import resolve_policy
from pdsr_sdk.rollout.data import PromptRecord, build_groups


@dataclass
class BatchResult(BatchReport):
    """One finished batch: its groups and what it cost (a :class:`~pdsr_sdk.dispatch.run.BatchReport`),
    with v2.5's cut and fast-pool cap (None for other policies)."""

    l_cut: int | None = None
    fast_cap: int | None = None

    @classmethod
    def from_report(cls, report: BatchReport) -> "BatchResult":
        facts = report.policy
        return cls(**{f.name: getattr(report, f.name) for f in fields(BatchReport)},
                   l_cut=facts.get("l_cut"), fast_cap=facts.get("fast_cap"))


@dataclass
class SessionHooks:
    """Callbacks the caller may set (progress bars, writers). Called on the event loop."""

    on_sample_done: list[Callable[[Sample], None]] = field(default_factory=list)
    on_group_done: list[Callable[[Group], None]] = field(default_factory=list)


class RolloutSession:
    """Engines + one policy instance for a sequence of batches.

    ``engines``: already started engines to use (the caller keeps ownership
    and closes them); default: build and start them from the config.
    """

    def __init__(self, config, *, engines: list | None = None, model_dir: str | Path | None = None):
        self.config = config
        self.model_dir = str(model_dir or config.model or "")
        self.policy_cls, self.policy_settings = resolve_policy(config.policy, config.policy_settings.get(config.policy, {}))
        self._given_engines = engines
        self.engines: list = []
        self.engine_specs: list = []
        self.hooks = SessionHooks()
        self.run: DispatchRun | None = None
        self._fatal: asyncio.Future | None = None
        self._started = False

    @property
    def scheduler(self) -> Scheduler | None:
        return self.run.scheduler if self.run is not None else None

    @property
    def policy_version(self) -> int:
        return self.scheduler.policy_version if self.scheduler else self.config.policy_version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        if self.scheduler is None:
            raise PdsrError("start the session before setting the policy version")
        self.scheduler.policy_version = value

    async def __aenter__(self) -> "RolloutSession":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self, *, max_model_len: int | None = None) -> None:
        """Build and start the engines (at once; each engine process is pinned when it is spawned)."""
        if self._started:
            return
        from pdsr_sdk.engines import build_engine
        from pdsr_sdk.engines.vllm_env import is_cpu_build
        from pdsr_sdk.rollout.layout import engine_layout

        cfg = self.config
        if self._given_engines is not None:
            self.engines = list(self._given_engines)
        else:
            needed = max_model_len or (cfg.sampling.max_tokens + 1024)
            self.engine_specs = engine_layout(cfg, required_pools=self.policy_cls.required_pools,
                                              cpu=is_cpu_build(), max_model_len=needed)
            self.engines = [build_engine(spec, model=self.model_dir, tokenizer=cfg.tokenizer, seed=cfg.seed,
                                         logprobs_mode=cfg.logprobs_mode) for spec in self.engine_specs]
        missing = [p for p in self.policy_cls.required_pools if p not in {e.pool for e in self.engines}]
        if missing:
            raise ConfigError(f"policy {self.policy_cls.name!r} needs an engine in pool(s) {', '.join(missing)}")
        loop = asyncio.get_running_loop()
        self._fatal = loop.create_future()
        self.run = DispatchRun(
            self.engines, self.policy_cls, self.policy_settings, LoopClock(loop), cfg.sampling, cfg.segments,
            policy_version=cfg.policy_version, on_sample_done=self._sample_done, on_group_done=self._group_done,
            on_fatal=self._set_fatal, first_batch_index=self.run.batch_index if self.run is not None else 0)
        if self._given_engines is None:
            results = await asyncio.gather(*(engine.start() for engine in self.engines), return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                await asyncio.gather(*(engine.close() for engine in self.engines), return_exceptions=True)
                raise failed[0]
        self._started = True

    async def close(self) -> None:
        """Close the engines this session built (engines passed in belong to the caller)."""
        if self._given_engines is not None:
            self._started = False
            return
        await asyncio.gather(*(engine.close() for engine in self.engines), return_exceptions=True)
        self._started = False

    async def generate(self, records: list[PromptRecord], *, n: int | None = None) -> BatchResult:
        """Run one batch to completion and return its groups and costs."""
        if not self._started:
            await self.start()
        groups = build_groups(records, n or self.config.sampling.n, self.config.sampling.max_tokens)
        return await self.run_groups(groups)

    async def run_groups(self, groups: list[Group]) -> BatchResult:
        done = asyncio.get_running_loop().create_future()
        self.run.start_batch(groups, lambda: done.done() or done.set_result(None))
        await asyncio.wait({done, self._fatal}, return_when=asyncio.FIRST_COMPLETED)
        if self._fatal.done():
            raise self._fatal.result()
        return BatchResult.from_report(self.run.finish_batch())

    # -------------------------------------------------------------- hooks
    def _sample_done(self, sample: Sample) -> None:
        for fn in self.hooks.on_sample_done:
            fn(sample)

    def _group_done(self, group: Group) -> None:
        for fn in self.hooks.on_group_done:
            fn(group)

    def _set_fatal(self, exc: BaseException) -> None:
        if self._fatal is not None and not self._fatal.done():
            self._fatal.set_result(exc)
