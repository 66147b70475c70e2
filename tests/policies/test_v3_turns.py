"""v3 with multi-turn samples: a parked sample's room goes to other samples while its environment works, and its next
turn runs where its prefix is cached."""

from __future__ import annotations

import numpy as np
import pytest

from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import run_policy, trace_batches
from pdsr_sdk.traces import LengthTrace, synth_trace
from pdsr_sdk.traces.trace import SampleTurns

UNIT = dict(kv_cache_tokens=65536, c0_s=1.0, c1_s_per_seq=0.0, c2_s_per_token=0.0, prefill_s_per_token=0.0)


def turn_trace(turns):
    lengths = [[sum(k + e for k, e, _ in t)] for t in turns]
    return LengthTrace.from_matrix(np.array(lengths), prompt_ids=[f"g{i}" for i in range(len(turns))],
                                   prompt_lens=np.full(len(turns), 4), turns=SampleTurns.from_lists(turns))


@pytest.mark.parametrize("policy", ["baseline", "v3"])
def test_the_room_of_a_parked_sample_goes_to_waiting_work(policy):
    """One engine, one slot, unit cost: A = 2 tokens, 3 s of environment, 2 tokens; B = 3 tokens. B runs while A's
    environment works, so both end by 7 s (B at 5, A at 7); were A's room kept, B would end at 10."""
    trace = turn_trace([[(2, 1, 3.0), (2, 0, 0.0)], [(3, 0, 0.0)]])
    cfg = SimulateConfig(policy=policy, fast=1, heavy=0, batch_size=2, timeline=False, segments={"enabled": False},
                         profiles={"fast": dict(UNIT, max_num_seqs=1)})
    run = run_policy(trace_batches(trace, cfg), cfg, policy, keep_groups=True)
    a, b = (s for g in run.groups for s in g.samples)
    assert (a.finish_time_s, b.finish_time_s) == (pytest.approx(7.0), pytest.approx(5.0))


def test_v3_books_only_what_runs_or_queues_and_keeps_each_sample_on_its_engine():
    """Slots bind (v3 deals from its ranked pool): at every turn's end v3's books hold, per engine, exactly the samples
    running or queued there (a parked one is not booked), and every turn of a sample runs on one engine."""
    trace = synth_trace(groups=16, n=4, seed=7, median_length=80, max_length=400, turns_min=2, turns_max=6,
                        env_delay_min_s=0.2, env_delay_max_s=2.0)
    cfg = SimulateConfig(policy="v3", fast=3, heavy=0, batch_size=16, timeline=False,
                         profiles={"fast": dict(max_num_seqs=6)}, segments={"min_tokens": 16, "max_tokens": 64})
    from pdsr_sdk.sim import driver

    checks = []
    original = driver.TurnReplay.on_turn_end

    def checked(self, sample, reason):
        sched = self.scheduler
        book = sched.policy.ledger
        for e in sched.live_engines():
            queued = sched.queued_on(e)
            booked = {s for s, name in book.engine_of.items() if name == e.name}
            assert booked == set(sched.running(e)) | set(queued)
            assert book.assigned[e.name] == len(booked)
        assert sample not in book.engine_of
        checks.append(sample)
        original(self, sample, reason)

    driver.TurnReplay.on_turn_end = checked
    try:
        run = run_policy(trace_batches(trace, cfg), cfg, "v3", keep_groups=True)
    finally:
        driver.TurnReplay.on_turn_end = original
    assert len(checks) == int(np.diff(trace.turns.offsets).sum())
    waited = 0
    for g in run.groups:
        for s in g.samples:
            assert len({seg.engine for seg in s.segments}) == 1 and s.moves == 0
            waited += sum(1 for t in s.turns if t.role == "assistant")
    assert waited == len(checks)
    assert run.stats["moves"] == 0
