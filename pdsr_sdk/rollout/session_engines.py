"""Weights, pauses and sleep: the part of :class:`~pdsr_sdk.rollout.session.RolloutSession` that acts on every
engine between (or in the middle of) steps, for a trainer."""

from __future__ import annotations

import asyncio

from pdsr_sdk.dispatch.scheduler import PAUSE_MODES
from pdsr_sdk.errors import ConfigError, ConfigValueError, DataError, EngineError, RunError, UnsupportedError
from pdsr_sdk.rollout.aio import failures, reset_prefix_cache
from pdsr_sdk.rollout.session_sleep import SleepWake
from pdsr_sdk.rollout.session_stagger import StaggeredLoads


class EngineControl(StaggeredLoads, SleepWake):
    """Weight updates, pause / resume and sleep / wake of a session's engines (a mixin of
    :class:`~pdsr_sdk.rollout.session.RolloutSession`). :meth:`_init_engine_control` sets its state when the
    session is made.

    It and :class:`~pdsr_sdk.rollout.session_stream.StreamSteps` depend on each other: :meth:`aupdate_weights` in
    the middle of a partial-rollout step uses the stream's step-end state (``_stream``, ``_step_end``,
    ``_mid_stream_step``, ``_await_step_end``, ``_check_not_blocked``), and a ``wait_for_update`` step of the
    stream ends only after such an update."""

    def _init_engine_control(self) -> None:
        self._reference_weights = None
        self._weights_block = None     # the shared-memory block updates are written to, kept across them
        self._loading: asyncio.Future | None = None   # set while update_weights loads (a step waits for it)
        # an update stopped part-way (a bucketed one after some bucket loaded, or one some engine loaded and another
        # failed): nothing generates until a whole one; what happened, for the refusals
        self._weights_partial: str | None = None
        self._partial_paused = False    # ... and it had paused a running step itself (the next whole one resumes)
        self._asleep = False
        self._sleep_paused = False   # sleep() paused the scheduler itself (wake() resumes it)
        self._init_stagger()

    def update_weights(self, weights, *, version: int | None = None, bucket_bytes: int | None = None) -> int:
        """Load new weights into every engine (synchronous; see :meth:`aupdate_weights`)."""
        return self._call(self.aupdate_weights(weights, version=version, bucket_bytes=bucket_bytes),
                          "update_weights")

    async def aupdate_weights(self, weights, *, version: int | None = None, bucket_bytes: int | None = None) -> int:
        """Load new weights into every engine, reset their prefix caches, and bump the policy version
        (to ``version`` if given, else by one); returns the new version.

        ``weights``: a state dict (``{name: tensor}``, e.g. ``model.state_dict()``), an iterable of
        ``(name, tensor)`` pairs, or a model folder (safetensors). Every tensor of the model at once,
        with the checkpoint's names (Hugging Face names; a tied ``lm_head.weight`` may be left in).
        An update bigger than ``bucket_bytes`` (default ``config.weights_bucket_bytes``, 1 GiB) goes in buckets
        of at most that size (:mod:`pdsr_sdk.engines.weights_buckets`); an iterator is consumed a bucket at a
        time. Tensors travel through one shared-memory block that every local engine process maps (no
        pickling; the session keeps the block and rewrites it at each update, until :meth:`close`), to
        Ray engines through Ray's object store, and by CUDA IPC handle to a local engine on the GPU the
        tensors sit on. Between steps, or while paused; in partial rollout (``over_provision`` set) also
        while a step runs, for a trainer that trains on one step while the next generates: the engines
        then stop keeping every token, load, and go on under the new version (a change that would make a
        sample already restarted for staleness too stale again waits for the step's end).
        A bad name or shape raises a :class:`~pdsr_sdk.errors.DataError` naming the parameter before
        anything changes (for an iterator in several buckets: before its bucket loads; one found after earlier
        buckets loaded says the engines hold a partial update, and the session then refuses to generate until
        an update_weights completes); an engine's failure an :class:`~pdsr_sdk.errors.EngineError` with its name
        (when other engines loaded the update, or earlier buckets of it, the engines are marked as holding a
        partial update, as above).
        """
        from pdsr_sdk.engines.weights import WeightsBlock
        from pdsr_sdk.engines.weights_buckets import stage_update
        from pdsr_sdk.engines.weights_check import ModelWeights

        self.check_usable("update_weights")
        if not self._started:
            raise RunError("update_weights: start the session first")
        await self._settle_lagging()
        streaming_mid_step = self._mid_stream_step()
        self._check_between_steps("update_weights", "update weights between steps", mid_stream=streaming_mid_step)
        new = self.policy_version + 1 if version is None else self._next_version_given(version)
        engines = self._live_engines()
        unsupported = [e.name for e in engines if not hasattr(e, "update_weights")]
        if unsupported:
            raise ConfigError(f"update_weights: engine(s) {', '.join(unsupported)} cannot load weights (their "
                              f"backend has no update_weights; the 'vllm' and 'ray' backends do)")
        if self._reference_weights is None:
            self._reference_weights = ModelWeights.read(self._model_dir())
        if self._weights_block is None:
            self._weights_block = WeightsBlock()
        parts = stage_update(weights, self._reference_weights, block=self._weights_block,
                             bucket_bytes=self.config.weights_bucket_bytes if bucket_bytes is None else bucket_bytes)
        staged = next(parts)    # a state dict is checked whole here, an iterator's first bucket
        keep = self._stagger_plan(staged, mid_step=streaming_mid_step)   # update: staggered
        lagging = {e.name for e in keep.values()}
        again: list | None = [] if keep else None   # each part, kept for the engines that load it later
        step_end, paused_here = self._step_end, False
        try:
            if streaming_mid_step:
                # a pipelined trainer's update while a partial-rollout step runs: stop the engines keeping
                # every token (their samples go on under the new version), unless the caller paused them
                if self.scheduler.paused is None:
                    await self._pause("abort", caller=False)
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
            await self._load_parts(staged, parts, [e for e in engines if e.name not in lagging], again=again)
            self.policy_version = new
            self.scheduler.all_loaded()   # engines still lagging loaded it with the others
            self._stagger(keep, new - 1, again)
        finally:
            staged.close()
            parts.close()
            if self._loading is not None:
                self._loading.set_result(None)
                self._loading = None
            if self._weights_partial:   # a step this paused stays paused: the next whole update resumes it
                self._partial_paused = self._partial_paused or paused_here
            elif (paused_here or self._partial_paused) and not step_end.done():
                self._partial_paused = False      # else the step ended meanwhile: its engines stay stopped
                await self.aresume()
        return new

    async def _load_parts(self, staged, parts, engines: list, *, again: list | None = None) -> None:
        """Load each staged part of an update (one, or its buckets in order) into ``engines``, each part first
        copied into ``again`` if given (:meth:`StagedWeights.again`: for engines that load later). A failure after
        some engine loaded a bucket, or of some engines where others loaded the whole update, ends the engines'
        open reloads (:meth:`VllmEngine.end_weights`), marks the weights partial (nothing generates until a whole
        update) and says so, naming the engines that failed, in the error it raises."""
        loaded = 0      # buckets some engine has loaded
        split = False   # some engine loaded a one-block update that another failed: they hold different weights
        failed: list[str] = []   # the engines the last part sent failed
        bucket = None            # that part's bucket index (None: one block)
        try:
            while True:
                try:
                    if again is not None:
                        again.append(staged.again())
                    results = await asyncio.gather(
                        *(e.update_weights(staged, reset_prefix_cache=staged.last and not self._keep_kv)
                          for e in engines), return_exceptions=True)
                finally:
                    staged.close()
                errors = [r for r in results if isinstance(r, BaseException)]
                failed = [e.name for e, r in zip(engines, results) if isinstance(r, BaseException)]
                bucket = staged.bucket.index if staged.bucket is not None else None
                if staged.bucket is not None and len(errors) < len(engines):
                    loaded += 1
                if errors:
                    split = staged.bucket is None and len(errors) < len(engines)
                    raise errors[0]
                if staged.last:
                    break
                staged = next(parts)    # the next bucket, checked before it loads
        except Exception as exc:
            if not loaded and not split:
                raise
            await failures(e.end_weights() for e in engines if hasattr(e, "end_weights"))
            names = ", ".join(repr(n) for n in failed)
            if split:
                took = ", ".join(repr(e.name) for e in engines if e.name not in failed)
                what = (f"engine(s) {names} failed this update and {took} loaded it: the engines now hold different "
                        f"weights")
            else:
                what = f"the engines had loaded up to {loaded} bucket(s) of this update: they now hold a partial update"
                if failed:
                    what += f", engine(s) {names} having failed bucket {bucket}"
            self._weights_partial = what
            raise partial_update_error(exc, what) from exc
        except BaseException:
            # cancelled (a trainer's timeout, Ctrl-C) while the engines load: their processes go on loading, so they
            # may hold the update, part of it or the old weights, under the old version; the next whole update
            # ends any reload left open (VllmEngine.update_weights)
            self._weights_partial = "an update_weights was cancelled while the engines loaded it"
            raise
        self._weights_partial = None

    @property
    def weights_partial(self) -> str | None:
        """What an update_weights stopped part-way left the engines holding (a bucketed one after some bucket
        loaded, or one some engine failed and another loaded), or None: nothing generates until a whole update."""
        return self._weights_partial

    def _check_between_steps(self, what: str, hint: str, *, mid_stream: bool = False) -> None:
        """A RunError unless a weight update may happen now: the engines awake, and no step running unpaused
        (``mid_stream``: a partial-rollout step, which update_weights pauses itself, may be)."""
        if self._asleep:
            raise RunError(f"{what}: the engines are asleep; call session.wake() first")
        if not mid_stream and self.scheduler is not None and not self.scheduler.idle and self.scheduler.paused is None:
            raise RunError(f"{what}: a step is running; pause it first (session.pause(...)) or {hint}")

    def _check_weights_whole(self, what: str) -> None:
        """A RunError while the engines hold a partial weight update (an update_weights stopped part-way): nothing
        generates from weights that are part old, part new, or differ between engines, until an update_weights
        completes."""
        if self._weights_partial:
            raise RunError(f"{what}: the engines hold a partial weight update (an update_weights stopped part-way: "
                           f"{self._weights_partial}); call update_weights with the whole model first")

    def _check_can_generate(self, what: str) -> None:
        self.check_usable(what)
        self._check_weights_whole(what)

    def _next_version_given(self, version) -> int:
        """``update_weights(version=...)``: an int above the current policy version (versions only go up: token
        ages and ``max_staleness`` count on them); a ConfigValueError naming both otherwise, before anything
        is loaded."""
        current = self.policy_version
        if isinstance(version, bool) or not hasattr(version, "__index__") or version <= current:
            raise ConfigValueError(f"update_weights: version must be an int greater than the current policy "
                                   f"version {current}; got {version!r} (nothing was loaded)")
        return int(version)

    @property
    def _keep_kv(self) -> bool:
        return self.config.kv_on_update == "keep"

    def next_version(self) -> int:
        """A weight update without weights (synchronous; see :meth:`anext_version`)."""
        return self._call(self.anext_version(), "next_version")

    async def anext_version(self) -> int:
        """A weight update without weights: the policy version goes up by one and, unless ``kv_on_update`` is
        ``keep``, the engines' prefix caches are reset, as :meth:`aupdate_weights` does (``pdsr rollout --steps``
        and the benchmarks stand in for a trainer with it). Between steps (a partial-rollout step's end included), or
        while paused; during a running, unpaused step (partial rollout's too: it is not stopped for this), or while
        the engines sleep, a RunError, as :meth:`aupdate_weights` decides. Returns the new version."""
        self.check_usable("next_version")
        if not self._started or self.scheduler is None:
            raise RunError("next_version: start the session first")
        self._check_weights_whole("next_version")
        self._check_between_steps("next_version", "call it between steps (after step() returns)")
        self._check_not_blocked(self.policy_version + 1, "next_version: the policy version", "call it after step() "
                                "returns")
        await self._settle_lagging()
        keep = self._stagger_plan(None, mid_step=False)   # update: staggered
        lagging = {e.name for e in keep.values()}
        if not self._keep_kv:
            failed = await failures(reset_prefix_cache(e) for e in self._live_engines() if e.name not in lagging)
            if failed:
                raise failed[0]
        self.policy_version += 1
        self.scheduler.all_loaded()
        self._stagger(keep, self.policy_version - 1, None)
        return self.policy_version

    # --------------------------------------------------------- pause / sleep
    @property
    def paused(self) -> str | None:
        """The pause mode while paused (``abort``, ``wait``, ``keep``), else None."""
        if self.scheduler is not None and self._between_stream_steps():
            return self._caller_paused   # the stream's stop between steps is not a pause of the caller's
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
        await self._pause(mode, caller=True)

    async def _pause(self, mode: str, *, caller: bool) -> None:
        """:meth:`apause`; ``caller``: the caller's own pause, which a partial-rollout step's end keeps (an update's
        pause of its own is not: the step's end then leaves the next step to start the engines)."""
        if mode not in PAUSE_MODES:
            raise ConfigValueError(f"pause: mode must be one of {', '.join(PAUSE_MODES)}; got {mode!r}")
        if not self._started or self.scheduler is None:
            raise RunError("pause: start the session first")
        sched = self.scheduler
        if self.paused is not None:
            raise RunError(f"pause: already paused (mode {self.paused!r}); call resume() first")
        engines = self._live_engines()
        if mode == "keep":
            lacking = [e.name for e in engines if not hasattr(e, "pause_generation")]
            if lacking:
                raise UnsupportedError(f"pause('keep'): engine(s) {', '.join(lacking)} cannot freeze running "
                                       f"requests (their backend has no pause_generation; the 'vllm' and 'ray' "
                                       f"backends do); use pause('abort') or pause('wait')")
        if self._between_stream_steps():   # partial rollout: a step's end stopped the engines, holding every token
            self._caller_paused = mode
            return
        drained = asyncio.get_running_loop().create_future()
        sched.pause(mode, on_drained=lambda: drained.done() or drained.set_result(None))
        if caller and self._stream is not None:   # a step's end inside this pause keeps it: the next step waits
            self._caller_paused = mode
        if mode == "keep":
            failed = await failures(e.pause_generation("keep", clear_cache=not self._keep_kv) for e in engines)
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
        if sched is not None and self._between_stream_steps():   # the engines stay stopped until the next step
            self._caller_paused = None
            return
        if sched is None or sched.paused is None:
            return
        if self._asleep:
            raise RunError("resume: the engines are asleep; call session.wake() first")
        self._check_weights_whole("resume")
        mode = sched.paused
        self._sleep_paused = False
        self._caller_paused = None
        sched.resume()
        if mode == "keep":
            failed = await failures(e.resume_generation() for e in self._live_engines())
            if failed:
                raise failed[0]

    def _close_weights(self) -> None:
        """At close: stop the later loads of a staggered update and free the shared-memory block."""
        self._cancel_lagging()
        if self._weights_block is not None:
            self._weights_block.close()
            self._weights_block = None

    def _live_engines(self) -> list:
        """The engines the scheduler has not seen die."""
        return self.scheduler.live_engines() if self.scheduler is not None else list(self.engines)


def partial_update_error(exc: Exception, what: str) -> Exception:
    """``exc`` (what stopped an update part-way) as the same kind of error, saying ``what`` the engines hold now and
    that the session refuses to generate."""
    note = f"{what}, and the session refuses to generate until an update_weights completes"
    if isinstance(exc, EngineError):
        return EngineError(exc.engine, f"{exc.message} ({note})", exit_status=exc.exit_status,
                           remote_traceback=exc.remote_traceback)
    if isinstance(exc, DataError):
        return type(exc)(f"{exc} ({note})")
    return RunError(f"update_weights: {type(exc).__name__}: {exc} ({note})")
