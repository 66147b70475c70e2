"""Shared policy bases: :class:`Policy` (no-op hooks, from :mod:`pdsr_sdk.dispatch.policy`) and
:class:`ProbeBarrierPolicy` (probe every prompt, then route the batch once; a stream's refill is a batch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pdsr_sdk.dispatch.policy import NoSettings, Policy, probe_duration
from pdsr_sdk.dispatch.types import FAST, Group, Sample

__all__ = ["NoSettings", "Policy", "ProbeBarrierPolicy", "probe_duration"]


@dataclass(eq=False)
class ProbeWave:
    """The groups of one ``on_batch`` call: their probes still out, and whether they were routed."""

    groups: list[Group]
    pending: set[Sample]
    timed_out: list[Sample] = field(default_factory=list)
    routed: bool = False
    timer: Any = None


class ProbeBarrierPolicy(Policy):
    """Probe every prompt, wait for all probes (or ``cfg.probe_timeout_s``), then route the batch once.

    Subclasses choose where probes run (:meth:`probe_pools`), what happens to a probe still
    running at the timeout (:meth:`on_probe_timeout`; default: it keeps running where it is),
    and how the batch is routed (:meth:`route`, called exactly once per batch, with the batch's
    groups in ``self.groups`` and its unfinished probes in ``self.timed_out``).

    Each ``on_batch`` call is a *wave* with its own probes, barrier and routing pass, so groups may
    arrive while earlier ones run (a multi-step stream's refill is a wave). A group whose probe
    finished before it arrived (carried from disk) needs no probe.
    """

    streaming = True

    def __init__(self, config: Any, ctx: Any):
        super().__init__(config, ctx)
        self.wave_of: dict[Sample, ProbeWave] = {}   # probe -> its wave, until it finishes or times out
        self.groups: list[Group] = []                # the wave being routed (for route)
        self.timed_out: list[Sample] = []

    def probe_pools(self) -> tuple[str, ...]:
        return (FAST,)

    def on_batch(self, groups: list[Group]) -> None:
        unknown = [g for g in groups if not g.samples[0].finished]
        wave = ProbeWave(groups, set(self.submit_probes(unknown, self.probe_pools()) if unknown else ()))
        for probe in wave.pending:
            self.wave_of[probe] = wave
        timeout = getattr(self.cfg, "probe_timeout_s", None)
        if timeout is not None and wave.pending:
            wave.timer = self.ctx.clock.call_later(timeout, lambda: self._probe_timeout(wave))
        if not wave.pending:
            self._route_once(wave)

    def on_sample_finished(self, sample: Sample) -> None:
        wave = self.wave_of.pop(sample, None)
        if wave is not None:
            wave.pending.discard(sample)
            if not wave.pending:
                self._route_once(wave)

    def on_probe_timeout(self, probe: Sample) -> None:
        pass

    def route(self) -> None:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def _probe_timeout(self, wave: ProbeWave) -> None:
        if wave.routed:
            return
        wave.timed_out = sorted(wave.pending, key=lambda s: s.group.position)
        for probe in wave.pending:
            self.wave_of.pop(probe, None)
        wave.pending.clear()
        for probe in wave.timed_out:
            self.ctx.count("probe_timeouts")
            self.on_probe_timeout(probe)
        self._route_once(wave)

    def _route_once(self, wave: ProbeWave) -> None:
        if wave.routed:
            return
        wave.routed = True
        if wave.timer is not None:
            wave.timer.cancel()
        self.groups, self.timed_out = wave.groups, wave.timed_out
        self.route()
