"""What a move costs and saves, learnt from the engines' own timings (v3 prices its moves by it).

A move re-prefills the sample's whole context on the target engine, and that prefill stalls every
sample the target runs. Whether the stall is small or large next to a decode step depends on the
model and the hardware: about a third of a step in the simulator's default (GPU-like) profile, more
than two steps on a CPU engine serving SmolLM2-135M. So v3 measures both prices as it runs:

- a decode step's seconds on each engine: the time per token of spans that continue on the engine
  they ran on (no prefill to speak of: the engine's prefix cache holds their context);
- a context token's prefill: how much longer a moved sample waits for its first token on its target
  than the target's continuing spans wait for theirs, per context token. A step that admits other
  work too (more moved samples, new samples' prompts) makes the wait longer than this sample's own
  prefill, so the price is a low quantile of the recent observations, not their mean (the mean read
  3-5x the true price at the end of B=512 batches, when moves and new work arrive together).

Only the spans' own timestamps are read (``submit_time_s``, ``first_token_time_s``, ``end_time_s``),
so the same code runs on simulated and real engines.
"""

from __future__ import annotations

from collections import deque

from pdsr_sdk.dispatch.types import SegmentRecord

_WEIGHT = 0.2      # of a new observation in the running means: recent spans count most, one outlier little
_PRICES_KEPT = 64  # recent prefill observations
_QUANTILE = 0.25   # of them, taken as the price (shared admissions only ever inflate an observation)


def _mix(old: float | None, new: float) -> float:
    return new if old is None else old + _WEIGHT * (new - old)


class MovePrices:
    """Running estimates of each engine's decode step and of the prefill price of a context token."""

    def __init__(self) -> None:
        self.step_s: dict[str, float] = {}          # engine -> seconds per decode step (per token of a span)
        self.first_wait_s: dict[str, float] = {}    # engine -> a continuing span's wait for its first token
        self.prefill_observed: deque[float] = deque(maxlen=_PRICES_KEPT)
        self.prefill_s_per_token: float | None = None

    def observe(self, previous: SegmentRecord | None, span: SegmentRecord, context_tokens: int,
                moved_here: bool) -> None:
        """A span ended. ``previous``: the sample's span before it (None for its first); ``context_tokens``:
        the context the span started from; ``moved_here``: the span is a moved sample's first on its target."""
        if span.end_time_s is None or span.num_tokens < 2:
            return
        engine = span.engine
        continuing = (previous is not None and previous.engine == engine and previous.end_reason == "segment"
                      and previous.end_time_s is not None and span.submit_time_s - previous.end_time_s < 1e-6)
        if continuing:
            self.step_s[engine] = _mix(self.step_s.get(engine),
                                       (span.end_time_s - span.submit_time_s) / span.num_tokens)
            if span.first_token_time_s is not None:
                self.first_wait_s[engine] = _mix(self.first_wait_s.get(engine),
                                                 span.first_token_time_s - span.submit_time_s)
        elif moved_here and span.first_token_time_s is not None and context_tokens > 0:
            usual = self.first_wait_s.get(engine)
            if usual is not None:
                stall = max(0.0, span.first_token_time_s - span.submit_time_s - usual)
                self.prefill_observed.append(stall / context_tokens)
                ranked = sorted(self.prefill_observed)
                self.prefill_s_per_token = ranked[int(_QUANTILE * (len(ranked) - 1))]

    def stall_pays(self, source: str, target: str, context_tokens: int, remaining_tokens: float,
                   share: float) -> bool | None:
        """Whether prefilling ``context_tokens`` on ``target`` costs at most ``share`` of what moving a sample with
        ``remaining_tokens`` still to generate from ``source`` to ``target`` saves (its remaining tokens times the
        difference of their decode steps); None while a price is unmeasured."""
        price = self.prefill_s_per_token
        step_from, step_to = self.step_s.get(source), self.step_s.get(target)
        if price is None or step_from is None or step_to is None:
            return None
        return context_tokens * price <= share * remaining_tokens * max(0.0, step_from - step_to)
