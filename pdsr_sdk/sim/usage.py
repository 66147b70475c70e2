"""Where a simulated multi-step run's engine time went, engine by engine (``pdsr simulate --steps``).

A step's time against its work bound (``vs_work_bound``) says how much is lost, not where: an engine
kept light for long samples (v3's tail lane), the slots that empty while a step waits for its last
groups, the prefill that every weight update forces on the samples it carries. These counters say
where: per engine the tokens it generated (every one: kept by a consumed group, carried at the end, or
thrown away by a restart, so they add up to the run's tokens + wasted + dropped), the sequences it ran
per decode step on average, and the share of its busy time spent prefilling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineUse:
    """One simulated engine over a multi-step run."""

    name: str
    pool: str
    max_seqs: int
    #: tokens it generated (kept, carried or thrown away) and the decode steps it ran
    tokens: int
    decode_steps: int
    #: seconds a step was running on it, of which prefill_s prefilling (prefill_tokens at its profile's price)
    busy_s: float
    prefill_tokens: int
    prefill_s: float
    preemptions: int
    #: the policy made it a tail lane (v3: it admits little new work while it holds a long sample)
    lane: bool = False
    #: its running sequences over time (a step function: occupancy_n[k] from occupancy_t[k] on); empty
    #: unless the run recorded it (a timeline was asked for)
    occupancy_t: list[float] = field(default_factory=list, repr=False)
    occupancy_n: list[int] = field(default_factory=list, repr=False)

    @property
    def tokens_per_step(self) -> float:
        """The mean batch it ran: tokens over decode steps."""
        return self.tokens / self.decode_steps if self.decode_steps else 0.0

    def row(self, horizon_s: float, total_tokens: int) -> dict[str, Any]:
        """One table row: its share of the run's tokens and of the run's time busy, and its prefill share."""
        return {"engine": self.name, "pool": self.pool, "lane": "yes" if self.lane else "",
                "tokens": self.tokens, "token_share": self.tokens / total_tokens if total_tokens else 0.0,
                "seqs_per_step": self.tokens_per_step,
                "busy": self.busy_s / horizon_s if horizon_s > 0 else 0.0,
                "prefill": self.prefill_s / self.busy_s if self.busy_s > 0 else 0.0,
                "preemptions": self.preemptions}


def engine_use(engines, now: float, lanes: set[str], *, occupancy: bool) -> list[EngineUse]:
    """The counters of simulated ``engines`` (:class:`~pdsr_sdk.sim.engine.SimEngine`) at virtual time ``now``;
    ``lanes``: the names of those the policy made a tail lane."""
    return [EngineUse(name=e.name, pool=e.pool, max_seqs=e.max_concurrency, tokens=e.tokens, decode_steps=e.steps,
                      busy_s=e.busy_s_at(now),
                      prefill_tokens=e.prefill_tokens,
                      prefill_s=e.prefill_tokens * e.profile.prefill_s_per_token, preemptions=e.preemptions,
                      lane=e.name in lanes,
                      occupancy_t=list(e.occupancy_t) if occupancy else [],
                      occupancy_n=list(e.occupancy_n) if occupancy else [])
            for e in engines]
