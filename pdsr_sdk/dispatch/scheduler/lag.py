"""A staggered weight update: engines that keep the older weights after an update until the samples they finish
under them have ended, taking no other work meanwhile; then they load the current weights (the caller's part)."""

from __future__ import annotations

from collections import Counter
from typing import Callable, Mapping

from pdsr_sdk.dispatch.protocols import Engine
from pdsr_sdk.dispatch.scheduler.launch import Launcher
from pdsr_sdk.dispatch.types import Sample
from pdsr_sdk.errors import PdsrError


class Lagging(Launcher):
    """:meth:`lag`, :meth:`lag_loaded` and :meth:`lagging` (state set by :meth:`_init_lag`; the slot table
    holds which sample lags where, ``_lag_of``, and each engine's ``lag_version``)."""

    def _init_lag(self) -> None:
        self._lag_left: Counter[str] = Counter()   # per lagging engine, its samples not finished
        self._on_lag_drained: Callable[[Engine], None] = lambda e: None

    def lag(self, keep: Mapping[Sample, Engine], version: int, on_drained: Callable[[Engine], None]) -> None:
        """While paused (after an update, before :meth:`resume`): each held sample of ``keep`` goes on under
        ``version`` on the engine given, which still holds that version's weights and takes no other work
        until all the samples it was given have finished (or been dropped); then ``on_drained(engine)`` is
        called, and the caller loads the current weights into it and calls :meth:`lag_loaded`. Its segments
        are stamped with ``version``: such a sample's tokens are one version, never partial."""
        if self.paused is None:
            raise PdsrError("lag: pause the scheduler first (samples go on under older weights from a pause)")
        if version >= self.policy_version:
            raise PdsrError(f"lag: version {version} is not older than the current {self.policy_version}")
        for sample, engine in keep.items():
            self._check_own(engine, f"lagged sample {sample.key} on")
            if sample not in self._held:
                raise PdsrError(f"lag: sample {sample.key} is not held by the pause")
        self._on_lag_drained = on_drained
        for engine in {e.name: e for e in keep.values()}.values():
            self.usage[engine.name].lag_version = version
            # work a policy placed on it before the pause goes back to its pool: it holds other weights now
            queued = self._engine_queues[engine.name]
            while queued:
                item = queued.pop()
                del self._where[item.sample]
                self._enqueue(item.sample, engine.pool, None, item.cap, True, turn=item.turn)
        for sample, engine in keep.items():
            self._lag_of[sample] = engine
            self._lag_left[engine.name] += 1
        self.stats["lagged_samples"] += len(keep)

    def lag_loaded(self, engine: Engine) -> None:
        """``engine`` holds the current weights now: it takes any work. Samples it was given that have not
        finished go on under the current version (across the update: partial)."""
        self._check_own(engine, "said it loaded")
        usage = self.usage[engine.name]
        if usage.lag_version is None:
            return
        usage.lag_version = None
        self._lag_left.pop(engine.name, None)
        for sample in [s for s, e in self._lag_of.items() if e is engine]:
            del self._lag_of[sample]
        self._room_changed(engine)
        self._pump()

    def all_loaded(self) -> None:
        """An update reached every live engine, those lagging included: each takes any work again
        (:meth:`lag_loaded`)."""
        for name in self.lagging():
            self.lag_loaded(self._by_name[name])

    def lagging(self) -> dict[str, int]:
        """The engines that hold older weights: name -> the version they hold."""
        return {name: u.lag_version for name, u in self.usage.items() if u.lag_version is not None and not u.dead}

    def _lag_finished(self, sample: Sample) -> None:
        engine = self._lag_of.pop(sample)
        self._lag_left[engine.name] -= 1
        if self._lag_left[engine.name] == 0:
            del self._lag_left[engine.name]
            self._on_lag_drained(engine)
