"""Shared policy bases: :class:`Policy` (no-op hooks, from :mod:`pdsr_sdk.dispatch.policy`) and
:class:`ProbeBarrierPolicy` (probe every prompt, then route the batch once)."""

from __future__ import annotations

from pdsr_sdk.dispatch.policy import NoSettings, Policy, probe_duration
from pdsr_sdk.dispatch.types import FAST, Group, Sample

__all__ = ["NoSettings", "Policy", "ProbeBarrierPolicy", "probe_duration"]


class ProbeBarrierPolicy(Policy):
    """Probe every prompt, wait for all probes (or ``cfg.probe_timeout_s``), then route the batch once.

    Subclasses choose where probes run (:meth:`probe_pools`), what happens to a probe still
    running at the timeout (:meth:`on_probe_timeout`; default: it keeps running where it is),
    and how the batch is routed (:meth:`route`, called exactly once per batch, with the
    unfinished probes in ``self.timed_out``).
    """

    #: per-batch state (pending probes, one routing pass): on_batch cannot be called again mid-batch
    streaming = False

    def probe_pools(self) -> tuple[str, ...]:
        return (FAST,)

    def on_batch(self, groups: list[Group]) -> None:
        self.groups = groups
        self.pending: set[Sample] = set(self.submit_probes(groups, self.probe_pools()))
        self.timed_out: list[Sample] = []
        self.routed = False
        self.timer = None
        timeout = getattr(self.cfg, "probe_timeout_s", None)
        if timeout is not None:
            self.timer = self.ctx.clock.call_later(timeout, self._probe_timeout)

    def on_sample_finished(self, sample: Sample) -> None:
        if sample in self.pending:
            self.pending.discard(sample)
            if not self.pending:
                self._route_once()

    def on_probe_timeout(self, probe: Sample) -> None:
        pass

    def route(self) -> None:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def _probe_timeout(self) -> None:
        if self.routed:
            return
        self.timed_out = sorted(self.pending, key=lambda s: s.group.position)
        self.pending.clear()
        for probe in self.timed_out:
            self.ctx.count("probe_timeouts")
            self.on_probe_timeout(probe)
        self._route_once()

    def _route_once(self) -> None:
        if self.routed:
            return
        self.routed = True
        if self.timer is not None:
            self.timer.cancel()
        self.route()

