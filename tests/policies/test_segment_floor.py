"""A policy's ``segment_floor`` raises the scheduler's budget-aware segment length, never past ``L_max``; v3 asks
for long segments in a stream under a staleness bound while its tail lane is off, and for none otherwise."""

from __future__ import annotations

import pytest

from fakes import FakeEngine, token_at
from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.dispatch.segments import next_segment_len
from pdsr_sdk.policies.baseline import BaselinePolicy
from pdsr_sdk.rollout.data import PromptRecord, build_groups
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.steps import run_steps
from pdsr_sdk.traces import synth_trace
from workloads import LENGTHS

CAPACITY, L_MIN, L_MAX = 48, 8, 40


class _Floored(BaselinePolicy):
    """Baseline, asking for at least ``FLOOR`` tokens a segment for sample 0 of each group."""

    name = "floored"
    FLOOR = 0

    def segment_floor(self, sample, engine):
        return self.FLOOR if sample.index == 0 else 0


def _requests(floor):
    """One batch of LENGTHS on two fake engines of 3 slots; every request submitted, with the running count
    on its engine at the time (the scheduler's n_active), and the groups."""
    clock = VirtualClock()
    engines = [FakeEngine(f"fast-{i}", "fast", clock, max_concurrency=3, segment_capacity_tokens=CAPACITY)
               for i in range(2)]
    seen = []
    for e in engines:
        submit = e.submit

        def spy(req, e=e, submit=submit):
            seen.append((req, len(e.running) + 1, req.sample.num_generated))
            submit(req)
        e.submit = spy
    cls = type("Floored", (_Floored,), {"FLOOR": floor})
    fatal = []
    run = DispatchRun(engines, cls, cls.config_model(), clock, SamplingConfig(n=4, max_tokens=1000),
                      SegmentConfig(min_tokens=L_MIN, max_tokens=L_MAX), on_fatal=fatal.append)
    records = [PromptRecord(pid, pid, [1, 2, 3 + i], target_lengths=list(ls)) for i, (pid, ls) in
               enumerate(LENGTHS.items())]
    groups = build_groups(records, 4, 1000)
    done = []
    run.start_batch(groups, lambda: done.append(True))
    clock.run(until=lambda: bool(done) or bool(fatal))
    assert not fatal and done
    return seen, groups


@pytest.mark.parametrize("floor", [0, 24, 1000])
def test_a_policys_segment_floor_raises_the_budget_aware_length_up_to_l_max(floor):
    seen, groups = _requests(floor)
    for req, n_active, generated in seen:
        budget = next_segment_len(CAPACITY, n_active, L_MIN, L_MAX)
        want = max(budget, min(floor, L_MAX)) if req.sample.index == 0 else budget
        assert req.max_tokens == min(want, req.sample.max_tokens - generated), (req.request_id, n_active)
    # the segments change, the samples do not: each holds its own tokens, in full
    for g in groups:
        for s in g.samples:
            want = LENGTHS[g.prompt_id][s.index]
            assert s.finished and s.num_generated == want
            assert s.token_ids == [token_at(g.prompt_id, s.index, i) for i in range(want)]
    first = [len(s.segments) for g in groups for s in g.samples if s.index == 0]
    if floor >= L_MAX:   # capped at L_max: as few segments as L_max allows
        assert first == [-(-LENGTHS[g.prompt_id][0] // L_MAX) for g in groups]


def _stream(lane, staleness):
    trace = synth_trace(groups=400, n=8, seed=7, runaway_frac=0.01)
    equal = dict(max_num_seqs=256, kv_cache_tokens=262144)
    cfg = SimulateConfig(policy="v3", batch_size=32, steps=6, over_provision=0.25, timeline=False, references=False,
                         fast=3, heavy=1, max_staleness=staleness, profiles={"fast": equal, "heavy": equal},
                         policy_settings={"v3": {"lane": {"mode": lane}}})
    return run_steps(trace, cfg, "v3", 0.25, keep_groups=True)


def _segment_ends(run):
    """Token counts of the segments that ended for their length alone (not the sample's end, a pause or a move)."""
    return [seg.num_tokens for g in run.groups for s in g.samples for seg in s.segments if seg.end_reason == "segment"]


def test_v3_asks_for_long_segments_in_a_stream_under_a_bound_only_while_its_lane_is_off():
    floor = 512   # v3's lane.segment_tokens
    off = _segment_ends(_stream("never", 2))
    assert off and min(off) >= floor
    # the lane moves runaways at segment ends: with it on, and without a bound (the drain's moves), the
    # budget-aware length alone (8192 / running: 64-128 tokens on these engines)
    for lane, staleness in (("always", 2), ("never", None)):
        ends = _segment_ends(_stream(lane, staleness))
        assert ends and min(ends) < floor, (lane, staleness)
