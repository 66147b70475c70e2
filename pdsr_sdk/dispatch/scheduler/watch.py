"""What keeps a policy's mistake from hanging a run or surfacing deep inside the scheduler.

- An exception a policy's hook raises becomes a :class:`~pdsr_sdk.errors.RunError` naming the policy, the hook
  and the line that raised (the original is its ``__cause__``): a user's own policy is debugged from the message.
- The timers a policy sets on ``ctx.clock`` run guarded the same way (on an asyncio loop an exception in a timer
  callback is only logged, and the step would wait for good), and are counted, so that the scheduler knows when
  nothing is left that could ever call the policy again.
- A run with nothing running, queued, held or parked, no timer pending and no pause, while samples it was given
  are unfinished, can never finish: the policy never submitted them (or dropped them). On real engines it would
  wait forever; the scheduler ends it with an error naming the policy and the samples.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any, Callable

from pdsr_sdk.errors import RunError

if TYPE_CHECKING:
    from pdsr_sdk.dispatch.protocols import Clock
    from pdsr_sdk.dispatch.types import Sample


def policy_label(policy: Any) -> str:
    """``'name' (module:Class)``: how errors name a policy instance (or class)."""
    cls = policy if isinstance(policy, type) else type(policy)
    path = f"{cls.__module__}:{cls.__qualname__}"
    name = getattr(cls, "name", "") or ""
    return f"{name!r} ({path})" if name and name != path else repr(path)


def hook_error(policy: Any, hook: str, exc: BaseException, *, refused: bool = False) -> RunError:
    """The RunError for ``exc`` raised by ``policy``'s ``hook``, naming both and where it was raised; ``refused``:
    ``exc`` is the scheduler refusing a command the hook gave (its message says what), named at the hook's line."""
    frames: list[traceback.FrameSummary] = list(traceback.extract_tb(exc.__traceback__))
    if refused:   # the line in the policy that gave the command, not the scheduler's check
        frames = [f for f in frames if "/pdsr_sdk/dispatch/scheduler/" not in f.filename.replace("\\", "/")] or frames
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    what = str(exc) if refused else f"{type(exc).__name__}: {exc}"
    err = RunError(f"policy {policy_label(policy)} in {hook}{where}: {what}" if refused else
                   f"policy {policy_label(policy)} raised in {hook}{where}: {what}")
    err.__cause__ = exc
    return err


def stalled_error(policy: Any, left: list[Sample]) -> RunError:
    """The RunError for a run that can never finish: ``left`` are unfinished and nothing will run them."""
    never = [s for s in left if s.submit_time_s is None]
    keys = ", ".join(s.key for s in left[:8]) + (", ..." if len(left) > 8 else "")
    return RunError(
        f"policy {policy_label(policy)} left {len(left)} sample(s) unfinished with nothing running, queued or "
        f"waiting on a timer, so they can never finish: {keys} ({len(never)} of them never submitted). A policy "
        f"must eventually submit (ctx.submit) or finish (ctx.finish) every sample of the groups on_batch gives it")


class _Timer:
    """A timer set through :class:`WatchedClock`: cancelling it stops counting it as pending."""

    __slots__ = ("clock", "inner", "live")

    def __init__(self, clock: WatchedClock) -> None:
        self.clock = clock
        self.inner: Any = None
        self.live = True

    def cancel(self) -> None:
        if self.live:
            self.live = False
            self.clock.pending -= 1
        self.inner.cancel()


class WatchedClock:
    """The scheduler's clock as the policy sees it (``ctx.clock``): the run's clock, with each ``call_later``
    callback run through ``on_fire(callback)`` (the scheduler guards it and then checks for a stall) and counted
    in :attr:`pending` until it fires or is cancelled."""

    def __init__(self, clock: Clock, on_fire: Callable[[Callable[[], None]], None]) -> None:
        self.inner = clock
        self.now = clock.now   # the run reads the time very often: no extra call
        self.pending = 0
        self._on_fire = on_fire

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(self)

        def fire() -> None:
            if not timer.live:
                return
            timer.live = False
            self.pending -= 1
            self._on_fire(callback)

        self.pending += 1
        timer.inner = self.inner.call_later(delay, fire)
        return timer
