"""MovePrices: a decode step's and a prefill token's seconds, read off spans' timestamps."""

from __future__ import annotations

import pytest

from pdsr_sdk.dispatch.types import SegmentRecord
from pdsr_sdk.policies.move_prices import MovePrices


def span(engine: str, submit: float, end: float, tokens: int, first: float | None = None,
         reason: str = "segment") -> SegmentRecord:
    return SegmentRecord(pool="fast", engine=engine, start_token=0, num_tokens=tokens, submit_time_s=submit,
                         first_token_time_s=first, end_time_s=end, end_reason=reason)


def test_a_continuing_span_times_its_engines_step_and_first_token_wait():
    prices = MovePrices()
    prev = span("e0", 0.0, 1.0, 100)
    prices.observe(prev, span("e0", 1.0, 3.0, 100, first=1.03), 500, moved_here=False)
    assert prices.step_s == {"e0": pytest.approx(0.02)}
    assert prices.first_wait_s == {"e0": pytest.approx(0.03)}
    # a span after a gap, or after one on another engine, is no continuation: it times nothing
    prices.observe(prev, span("e0", 1.5, 9.0, 100, first=1.6), 500, moved_here=False)
    prices.observe(span("e1", 0.0, 1.0, 100), span("e0", 1.0, 9.0, 100, first=1.1), 500, moved_here=False)
    assert prices.step_s == {"e0": pytest.approx(0.02)}
    # later spans move the estimate part of the way (recent spans count most)
    prices.observe(prev, span("e0", 1.0, 2.0, 100, first=1.01), 500, moved_here=False)
    assert 0.01 < prices.step_s["e0"] < 0.02


def test_a_moved_samples_extra_wait_for_its_first_token_prices_the_prefill():
    prices = MovePrices()
    moved = span("e0", 10.0, 14.0, 100, first=10.53)
    assert prices.stall_pays("e1", "e0", 1000, 100, 0.5) is None   # nothing measured yet
    prices.observe(span("e1", 9.0, 10.0, 50), moved, 1000, moved_here=True)
    assert prices.prefill_s_per_token is None                  # no continuing span's wait on e0 to compare with
    prices.observe(span("e0", 0.0, 1.0, 100), span("e0", 1.0, 3.0, 100, first=1.03), 500, moved_here=False)
    prices.observe(span("e1", 9.0, 10.0, 50), moved, 1000, moved_here=True)
    assert prices.prefill_s_per_token == pytest.approx(0.5e-3)  # (0.53 - 0.03) s over 1,000 context tokens
    assert prices.stall_pays("e1", "e0", 1000, 100, 0.5) is None   # e1's step is unmeasured
    prices.observe(span("e1", 0.0, 1.0, 100), span("e1", 1.0, 5.0, 100), 500, moved_here=False)
    assert prices.step_s["e1"] == pytest.approx(0.04)
    # 1,000 tokens stall e0 for 0.5 s; 100 tokens moved from e1's 0.04 s steps to e0's 0.02 s save 2 s
    assert prices.stall_pays("e1", "e0", 1000, 100, 0.25) is True
    assert prices.stall_pays("e1", "e0", 1000, 100, 0.24) is False
    assert prices.stall_pays("e0", "e1", 10, 100, 1.0) is False     # onto a slower engine nothing is saved


def test_a_step_shared_with_other_admissions_does_not_inflate_the_price():
    """An arrival admitted together with other work waits for their prefill too: only ever longer. The price is
    a low quantile of the observations, so a few such waits leave it at the clean one."""
    prices = MovePrices()
    prices.observe(span("e0", 0.0, 1.0, 100), span("e0", 1.0, 3.0, 100, first=1.0), 500, moved_here=False)
    clean = [span("e0", 10.0, 14.0, 100, first=10.2)] * 6       # 0.2 s for 1,000 tokens
    shared = [span("e0", 10.0, 14.0, 100, first=11.0)] * 2      # 1.0 s: four moves' prefill in one step
    for s in shared + clean:
        prices.observe(span("e1", 9.0, 10.0, 50), s, 1000, moved_here=True)
    assert prices.prefill_s_per_token == pytest.approx(0.2e-3)
