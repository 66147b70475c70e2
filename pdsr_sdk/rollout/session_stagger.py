"""A staggered weight update (``update: staggered``): the part of
:class:`~pdsr_sdk.rollout.session.RolloutSession` that lets the samples a partial-rollout step's end stopped, whose
tokens are all of the ending version, finish under it on the fewest engines (:func:`plan_stagger`), and loads the
update into those engines once their samples have ended (:meth:`Scheduler.lag
<pdsr_sdk.dispatch.scheduler.lag.Lagging.lag>`). Every other engine loads at once, as with ``update: all``."""

from __future__ import annotations

import asyncio

from pdsr_sdk.dispatch.protocols import Engine
from pdsr_sdk.dispatch.steps.stagger import plan_stagger
from pdsr_sdk.dispatch.types import Sample
from pdsr_sdk.errors import PdsrWarning
from pdsr_sdk.rollout.aio import failures, reset_prefix_cache


class StaggeredLoads:
    """Which samples lag where at an update, and the later loads of their engines (a mixin of
    :class:`~pdsr_sdk.rollout.session_engines.EngineControl`; :meth:`_init_stagger` sets its state)."""

    def _init_stagger(self) -> None:
        self._lag_staged = None   # the update's parts a lagging engine loads once drained (None: next_version's none)
        self._lag_loads: set[asyncio.Task] = set()   # those loads, running

    def _stagger_plan(self, staged, *, mid_step: bool) -> dict[Sample, Engine]:
        """At an update between partial-rollout steps with ``update: staggered``: the samples to finish under the
        ending version, each with its engine; else none. An update in the middle of a step loads every engine at
        once, and so does one in buckets (``staged``: its first) whose copy would not fit the shared memory free."""
        sched = self.scheduler
        if (self.config.update != "staggered" or mid_step or self._stream is None or sched is None
                or sched.paused is None):
            return {}
        keep = plan_stagger(sched.held_on(), self.policy_version)
        if keep and staged is not None and staged.bucket is not None and not self._copy_fits(staged):
            return {}
        return keep

    def _copy_fits(self, first) -> bool:
        """Whether shared memory has room for a copy of the update ``first`` begins (a warning says when not)."""
        import shutil
        import warnings

        from pdsr_sdk.engines.weights_buckets import update_bytes
        from pdsr_sdk.engines.weights_shm import shm_dir

        folder = shm_dir()
        need, free = update_bytes(self._reference_weights, first), shutil.disk_usage(folder).free
        if need < free:
            return True
        warnings.warn(f"update: staggered: this update goes in buckets, and the copy the engines held back would "
                      f"load later ({need / 2**30:.2f} GiB) does not fit the {free / 2**30:.2f} GiB free in "
                      f"{folder} (PDSR_SHM_DIR chooses it): every engine loads it at once", PdsrWarning,
                      stacklevel=2)
        return False

    def _stagger(self, keep: dict[Sample, Engine], ended: int, staged: list | None) -> None:
        """After the bump to the new version: ``keep``'s samples go on under ``ended`` on their engines, which load
        ``staged`` once drained (the update's parts in order, each kept where :meth:`StagedWeights.again` put it: a
        whole update in the session's block, each bucket in a block of its own until no engine lags; None: only
        reset their prefix caches)."""
        self._free_lag_staged()
        self._lag_staged = staged
        if keep:
            self.scheduler.lag(keep, ended, on_drained=self._lag_drained)

    def _lag_drained(self, engine: Engine) -> None:
        """(In the scheduler.) An engine's samples under the older weights have all ended: load the update."""
        version = self.scheduler.lagging()[engine.name]
        task = asyncio.get_running_loop().create_task(self._load_lagging(engine, version))
        self._lag_loads.add(task)
        task.add_done_callback(self._lag_loads.discard)

    async def _load_lagging(self, engine: Engine, version: int) -> None:
        parts = self._lag_staged
        try:
            if parts is not None:
                for part in parts:
                    await engine.update_weights(part, reset_prefix_cache=part.last and not self._keep_kv)
            elif not self._keep_kv:
                await reset_prefix_cache(engine)
        except Exception as exc:
            if parts and parts[0].bucket is not None and hasattr(engine, "end_weights"):
                await failures([engine.end_weights()])   # end the reload its bucket 0 opened
            # it keeps the older weights and takes no work; nothing generates until a whole update loads everywhere
            self._weights_partial = (f"engine {engine.name!r} failed to load a staggered update once its samples "
                                     f"under version {version} had ended ({type(exc).__name__}: {exc})")
            return
        if self.scheduler.lagging().get(engine.name) == version:   # not loaded by an update meanwhile
            self.scheduler.lag_loaded(engine)
        if not self.scheduler.lagging():
            self._free_lag_staged()

    async def _settle_lagging(self) -> None:
        """Wait for the later loads running (an update, sleep or close must not overlap them)."""
        if self._lag_loads:
            await asyncio.gather(*self._lag_loads, return_exceptions=True)

    def _cancel_lagging(self) -> None:
        for task in list(self._lag_loads):
            task.cancel()
        self._free_lag_staged()

    def _free_lag_staged(self) -> None:
        """No engine will load the kept parts any more: free a bucketed update's blocks (a model's worth)."""
        for part in self._lag_staged or ():
            part.close()
        self._lag_staged = None
