"""The trainer of a simulated multi-step run (``trainer_s``, ``weight_update_s``, ``pipeline``, ``kv_on_update``):
when its weight updates land and what the engines do meanwhile, as a :class:`~pdsr_sdk.rollout.session.RolloutSession`
and its trainer drive them. Each update resets the engines' prefix caches (``recompute``) or keeps them (``keep``:
stopped samples go on from their cached KV, and requests are salted by the version of their oldest kept token).

- Synchronous (``pipeline`` off): a step's end stops the engines keeping every token (``pause("abort")``, as the
  session's step end does); the trainer trains ``trainer_s``, the engines load for ``weight_update_s``, and the
  next step starts under the new version (refill, resume).
- Pipelined: the next step starts at once (the session's step end stops the engines and the next ``step`` call
  resumes them) while the trainer trains on the ended step; its update lands ``trainer_s`` later, in the middle
  of that step: the engines stop keeping every token, load, and go on under the new version
  (``StepStream.version_changed`` restarts what became too stale). No step ends before the update for its
  predecessor (``hold_until``, a session's ``step(wait_for_update=True)``), so token ages count at the weights
  the trainer trains with.

Every update adds one to the policy version: the update for step k (0-based) makes version k + 1 (counted from
the stream's first version), which is what the next step waits for. So a step sees exactly one update and ends
after it, and no update can make a sample already restarted for staleness too stale again (its group is due at
the last step end before the next version would make it so, and the only update of the following step comes
after that end): the wait for the step's end that a session's ``update_weights`` needs for that
(``StepStream.blocked_by``) never arises here, and would be an error. With every time zero and no pipelining
(the default) this is the session's step end with an instant trainer.
"""

from __future__ import annotations

from collections.abc import Callable

from pdsr_sdk.dispatch.protocols import Engine
from pdsr_sdk.dispatch.steps import StepStream
from pdsr_sdk.dispatch.steps.stagger import plan_stagger
from pdsr_sdk.errors import PdsrError


class SimTrainer:
    """Drives a :class:`StepStream` whose ``on_step_end`` is :meth:`step_end`."""

    def __init__(self, stream: StepStream, *, trainer_s: float, weight_update_s: float, pipeline: bool,
                 keep_kv: bool = False, staggered: bool = False):
        self.stream = stream
        self.sched = stream.sched
        self.clock = stream.clock
        self.trainer_s = trainer_s
        self.update_s = weight_update_s
        self.pipeline = pipeline
        self.keep_kv = keep_kv
        if staggered and pipeline:
            raise PdsrError("a staggered update needs the engines stopped at the step's end (pipeline off)")
        self.staggered = staggered
        # as a session does: KV kept across updates is shared only by requests started under the same weights
        self.sched.salt_by_version = keep_kv
        self.base = self.sched.policy_version

    def step_end(self) -> None:
        """A step's groups are chosen (inside the scheduler): stop the engines, keeping every token."""
        self._stop(lambda: self._later(0.0, self._after_end))

    def _after_end(self) -> None:
        """The ended step's engines are stopped: train (and load) before the next step, or alongside it."""
        if self.pipeline:
            self._start_next()
            self._later(self.trainer_s, self._trainer_done)
        else:
            self._later(self.trainer_s + self.update_s, self._sync_update)

    def _sync_update(self) -> None:
        self._bump()
        self._start_next()

    def _start_next(self) -> None:
        """Consume the ended step and start the next one (its samples run at once unless it ended in refill:
        its B groups were complete already)."""
        s = self.stream
        s.consume()
        if s.done:
            return
        if self.pipeline:
            s.hold_until = self.base + s.t
        s.refill()
        if not s.closing:
            self.sched.resume()

    def _trainer_done(self) -> None:
        """Pipelined: the trainer's update for the previous step is ready; the running step waits for it."""
        s = self.stream
        if s.done:
            return
        blocked = s.blocked_by(self.sched.policy_version + 1)
        if s.closing or blocked:
            raise PdsrError(f"step {s.t + 1}: the trainer's update came after the step's end or would restart "
                            f"{len(blocked)} sample(s) a second time (the hold should prevent both; a bug)")
        self._stop(lambda: self._later(self.update_s, self._loaded))

    def _loaded(self) -> None:
        self._bump()   # restarts what is too stale now; the step may end
        if not self.stream.closing:
            self.sched.resume()

    def _bump(self) -> None:
        sched = self.sched
        sched.policy_version += 1
        lagging = self._stagger(sched.policy_version - 1) if self.staggered else set()
        if not self.keep_kv:   # kv_on_update: recompute (the engines' caches hold the old weights' KV)
            for engine in sched.engines:
                if engine.name not in lagging:   # those keep the old weights, and their KV, until they load
                    engine.reset_prefix_cache()
        self.stream.version_changed()   # between steps (closing) it does nothing: refill restarts instead

    def _stagger(self, ended: int) -> set[str]:
        """A staggered update: the stopped samples whose tokens are all of the ended version finish under it on
        the fewest engines (:func:`plan_stagger`), which load once those end; returns their names. Engines still
        finishing samples of the version before load now, with the others."""
        sched = self.sched
        sched.all_loaded()
        keep = plan_stagger(sched.held_on(), ended)
        if keep:
            sched.lag(keep, ended, on_drained=self._lag_drained)
        return set(sched.lagging())

    def _lag_drained(self, engine: Engine) -> None:
        """An engine's samples under the old weights have all ended: it loads the current ones."""
        version = self.sched.lagging()[engine.name]

        def loaded() -> None:
            if self.sched.lagging().get(engine.name) == version:   # not loaded at an update meanwhile
                if not self.keep_kv:
                    engine.reset_prefix_cache()
                self.sched.lag_loaded(engine)

        self._later(self.update_s, loaded)

    def _stop(self, then: Callable[[], None]) -> None:
        if self.sched.paused is None:
            self.sched.pause("abort", on_drained=then)
        else:   # a step that ended in refill: its engines never restarted
            self.sched.when_drained(then)

    def _later(self, delay: float, fn: Callable[[], None]) -> None:
        self.clock.call_later(delay, lambda: self.sched.guarded(fn))
