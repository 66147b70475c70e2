"""Pausing the scheduler (a trainer updating weights in the middle of a step) and resuming it."""

from __future__ import annotations

from typing import Callable

from pdsr_sdk.dispatch.protocols import Engine
from pdsr_sdk.dispatch.scheduler.lag import Lagging
from pdsr_sdk.dispatch.scheduler.slots import Run
from pdsr_sdk.dispatch.types import Sample, SegmentRecord
from pdsr_sdk.errors import PdsrError

#: how :meth:`Pausing.pause` treats running samples
PAUSE_MODES = ("abort", "wait", "keep")


class Pausing(Lagging):
    """:meth:`pause` and :meth:`resume`, and the samples a pause holds (set by :meth:`_init_pause`)."""

    def _init_pause(self) -> None:
        #: the pause mode while paused (``abort``, ``wait``, ``keep``), else None; see :meth:`pause`
        self.paused = None
        self._held: dict[Sample, Run] = {}             # samples a pause stopped, by the run that was stopped
        self._drained: list[Callable[[], None]] = []    # called once nothing runs any more while paused

    def pause(self, mode: str, on_drained: Callable[[], None] | None = None) -> None:
        """Stop launching work until :meth:`resume`; samples keep every token.

        - ``abort``: every running segment is aborted; its sample keeps its tokens and log-probs and
          waits, held, to continue on the same engine at :meth:`resume` (a new segment, stamped with
          the policy version current then).
        - ``wait``: running samples go on (segment after segment) until they finish or a policy sends
          them back to a queue; nothing new starts.
        - ``keep``: running requests stay on their engines (the caller freezes them there); nothing
          new starts; at :meth:`resume` each running sample's segment is split where the policy version
          changed.

        ``on_drained()`` runs once no request runs (at once if none does); with ``keep`` the requests
        stay, so it is not called.
        """
        if mode not in PAUSE_MODES:
            raise PdsrError(f"pause mode must be one of {', '.join(PAUSE_MODES)}; got {mode!r}")
        if self.paused is not None:
            raise PdsrError(f"already paused (mode {self.paused!r}); resume first")
        self.paused = mode
        if mode == "abort":
            for run in list(self._runs.values()):
                if run.intent is None:
                    run.intent = ("pause",)
                    run.engine.abort(run.request_id)
        if on_drained is not None:
            self.when_drained(on_drained)

    def when_drained(self, on_drained: Callable[[], None]) -> None:
        """While paused: ``on_drained()`` once no request runs (at once if none does); never under ``keep``,
        whose requests stay."""
        if self.paused is None:
            raise PdsrError("when_drained: not paused")
        if not self._runs:
            on_drained()
        elif self.paused != "keep":
            self._drained.append(on_drained)

    def resume(self) -> None:
        """End a pause: held samples continue where they stopped (as at a segment's end: the policy
        hears ``on_segment_end``), running ones (``keep``) get a new segment if the policy version
        changed, and queued work launches."""
        if self.paused is None:
            return
        self.paused = None
        self._drained.clear()
        now = self.clock.now()
        for run in list(self._runs.values()):
            self._split_segment(run.sample, now)
        held, self._held = self._held, {}
        for run in held.values():
            self.guarded(self._continue_held, run)
        self._dirty_engines.update(e.name for e in self.live_engines())
        self._dirty_pools.update(self._pool_queues)
        self._grown_pools.update(p for p, q in self._pool_queues.items() if q)
        self._pump()

    def held(self) -> list[Sample]:
        """Samples a pause stopped (``abort``), waiting for :meth:`resume`."""
        return list(self._held)

    def held_on(self) -> list[tuple[Sample, Engine]]:
        """Samples a pause stopped, each with the engine it ran on (where it continues at :meth:`resume`)."""
        return [(s, run.engine) for s, run in self._held.items()]

    def _split_segment(self, sample: Sample, now: float) -> None:
        seg = sample.segments[-1]
        if seg.policy_version == self.policy_version:
            return
        if seg.num_tokens == 0:
            seg.policy_version = self.policy_version
            return
        seg.end_time_s = now
        seg.end_reason = "pause"
        sample.segments.append(SegmentRecord(pool=seg.pool, engine=seg.engine, start_token=sample.num_generated,
                                             policy_version=self.policy_version, submit_time_s=now))

    def _continue_held(self, run: Run) -> None:
        sample, engine = run.sample, run.engine
        if sample.finished or sample in self._where or sample in self._run_of:
            return
        usage, lag = self.usage[engine.name], self._lag_of.get(sample)
        moved = lag is not None and lag is not engine          # it finishes where its older weights are
        stranded = lag is None and usage.lag_version is not None   # its engine keeps older weights than its tokens'
        if usage.dead or moved or stranded:   # _enqueue sends it where it may run
            self._enqueue(sample, run.stolen_from or engine.pool, None, sample.cap, True)
            return
        self._next_segment(run, mark=False)

    def _check_drained(self) -> None:
        if self._drained and not self._runs:
            callbacks, self._drained = self._drained, []
            for fn in callbacks:
                fn()
