"""Sleep and wake: the part of :class:`~pdsr_sdk.rollout.session.RolloutSession` that frees the engines' memory
between steps for a trainer (vLLM sleep mode)."""

from __future__ import annotations

from pdsr_sdk.errors import RunError, UnsupportedError
from pdsr_sdk.rollout.aio import failures


class SleepWake:
    """:meth:`sleep` / :meth:`wake` (a mixin of :class:`~pdsr_sdk.rollout.session_engines.EngineControl`, whose
    ``_init_engine_control`` sets ``_asleep`` and ``_sleep_paused``)."""

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
        await self._settle_lagging()
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
        failed = await failures(e.sleep(level) for e in engines)
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
        failed = await failures(e.wake_up() for e in self._live_engines())
        self._asleep = False
        if self._sleep_paused:
            self._sleep_paused = False
            self.scheduler.resume()
        if failed:
            raise failed[0]
