"""v3's tail lane: in a stream under a staleness bound the longest samples move once to a heavy engine; the
lane stays off without a bound and within a batch."""

from __future__ import annotations

import numpy as np

from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import run_policy, trace_batches
from pdsr_sdk.traces import LengthTrace, synth_trace
from v3_cases import EQUAL


def stream(lane, trace=None, settings=None, **kw):
    from pdsr_sdk.sim.steps import run_steps

    trace = trace if trace is not None else synth_trace(groups=400, n=8, seed=7, runaway_frac=0.01)
    # replayed restarts: a restarted runaway runs away again, so 'auto' keeps its lane (a fresh draw would
    # soon turn it off: tests/policies/test_runaway_recurrence.py)
    kw = {"fast": 3, "heavy": 1, "max_staleness": 1, "profiles": {"fast": EQUAL, "heavy": EQUAL},
          "restart_lengths": "replay"} | kw
    cfg = SimulateConfig(policy="v3", batch_size=32, steps=8, over_provision=0.25, timeline=False, references=False,
                         policy_settings={"v3": {"lane": {"mode": lane}, **(settings or {})}}, **kw)
    return run_steps(trace, cfg, "v3", 0.25, keep_groups=True)


def test_in_a_stream_under_a_staleness_bound_the_tail_moves_once_to_the_heavy_lane():
    run = stream("auto", settings={"disable": ["migration"]})   # before the lane opens, migration moves the tail
    # groups launched after the first step (step 0 starts on empty engines: no stream yet, no lane)
    moved = [s for g in run.groups if run.launched_at[g.prompt_id] > 0 for s in g.samples if s.moves]
    assert moved, "a stream with free slots puts its tail on the lane"
    for s in moved:
        assert s.moves <= 1 + s.restarts
        assert s.segments[-1].pool == "heavy" and s.segments[-1].end_reason != "moved"
    never = stream("never")    # moves then go to the least crowded engine, of either pool
    ends = [s.segments[-1].pool for g in never.groups if never.launched_at[g.prompt_id] > 0
            for s in g.samples if s.moves]
    assert "fast" in ends


def lane_ends(run):
    """Engines where samples moved onto the lane (launched after the first step) ended."""
    return {s.segments[-1].engine for g in run.groups if run.launched_at[g.prompt_id] > 0
            for s in g.samples if s.moves and s.segments[-1].pool == "heavy"}


def test_a_stream_that_fills_every_slot_keeps_its_lane_to_one_heavy_engine():
    # 5 engines of 16 slots against 40 groups x 8 in flight: every slot is taken, so a second lane engine
    # would be capacity the stream needs (the first heavy engine by name is the lane)
    small = dict(max_num_seqs=16, kv_cache_tokens=262144)
    run = stream("always", fast=3, heavy=2, profiles={"fast": small, "heavy": small})
    ends = lane_ends(run)
    assert ends and len(ends) == 1
    roomy = stream("always", fast=3, heavy=2)     # 256 slots each: room to spare, both heavy engines
    assert len(lane_ends(roomy)) == 2


def test_only_the_longest_go_to_the_lane_and_restarted_siblings_stay_put():
    rng = np.random.default_rng(3)
    lengths = rng.integers(80, 121, size=(400, 8))
    # the runaways (0.3%, below the lane's 99.5th percentile): a staleness bound of 1 catches them
    lengths[rng.random((400, 8)) < 0.003] = 3000
    trace = LengthTrace.from_matrix(lengths, prompt_lens=[16] * 400)
    run = stream("auto", trace, {"lengths": {"history": 256}})   # (a full history: the lane trusts it)
    samples = [s for g in run.groups for s in g.samples]
    moved = [s for s in samples if s.moves]
    # the runaways, and the 0.5% of ordinary samples the 99.5th percentile leaves above it
    assert any(s.max_tokens == 3000 for s in moved)
    assert all(s.max_tokens >= np.quantile(lengths[lengths < 3000], 0.9) for s in moved)
    restarted_short = [s for s in samples if s.restarts and s.max_tokens < 3000]
    assert restarted_short and not any(s.moves for s in restarted_short)


def placements(run):
    return [(g.prompt_id, s.index, [(seg.engine, seg.num_tokens) for seg in s.segments]) for g in run.groups
            for s in g.samples]


def test_the_lane_is_on_in_a_stream_exactly_when_a_staleness_bound_is_set():
    # without a bound a slow tail just carries over and the lane's capacity would cost ~2%
    # (docs/notes/partial-rollout.md)
    assert placements(stream("auto", max_staleness=None)) == placements(stream("never", max_staleness=None))
    bound = stream("auto")
    assert bound.policy_facts["tail_lane"] and bound.policy_facts["lane_engines"] == ["heavy-0"]
    assert placements(bound) != placements(stream("never"))
    # (it differs from 'always' until restarts show whether they repeat runaways:
    # tests/policies/test_runaway_recurrence.py)


def test_the_lane_stays_off_within_a_batch():
    trace = synth_trace(groups=64, n=8, seed=5, runaway_frac=0.02)
    cfg = SimulateConfig(policy="v3", fast=3, heavy=1, batch_size=32, timeline=False,
                         profiles={"fast": EQUAL, "heavy": EQUAL}, references=False)
    run = run_policy(trace_batches(trace, cfg), cfg, "v3")
    assert all(b.policy["tail_lane"] is False for b in run.batches)
