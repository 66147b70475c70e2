"""``Scheduler.lag`` on fake engines in virtual time: samples held by a pause finish under an older version on the
engine given, which takes no other work until they end, then reports itself drained; ``lag_loaded`` opens it again.
A lagging engine that dies hands its samples on as any dead engine does. The simulator's staggered update on top:
tests/sim/test_sim_staggered.py; the session's: tests/rollout/test_rollout_vllm_stagger.py."""

from __future__ import annotations

import pytest

from fakes import FakeEngine
from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.errors import PdsrError
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.rollout.data import PromptRecord, build_groups


def setup(lengths=(300, 300)):
    clock = VirtualClock()
    engines = [FakeEngine(f"fast-{i}", "fast", clock, max_concurrency=4) for i in range(2)]
    cls = POLICIES.get("baseline")
    sched = DispatchRun(engines, cls, cls.config_model(), clock, SamplingConfig(n=2, max_tokens=400),
                        SegmentConfig(min_tokens=16, max_tokens=64)).scheduler
    group = build_groups([PromptRecord("p", "p", [1, 2, 3], target_lengths=list(lengths))], 2, 400)[0]
    return clock, engines, sched, group


def held_after_a_while(clock, engines, sched, group):
    a, b = group.samples
    sched.submit(a, engine=engines[0])
    sched.submit(b, engine=engines[1])
    clock.run(until=lambda: a.num_generated >= 50 and b.num_generated >= 50)
    drained = []
    sched.pause("abort", on_drained=lambda: drained.append(True))
    clock.run(until=lambda: drained)
    assert {s.key for s in sched.held()} == {a.key, b.key}
    sched.policy_version = 1
    return a, b


def test_lagged_samples_finish_under_the_old_version_on_their_engine_which_takes_nothing_else():
    clock, engines, sched, group = setup()
    a, b = held_after_a_while(clock, engines, sched, group)
    drained = []
    sched.lag({a: engines[0], b: engines[0]}, 0, on_drained=drained.append)   # b moves to fast-0
    assert sched.lagging() == {"fast-0": 0} and sched.stats["lagged_samples"] == 2
    before = {s.key: len(s.segments) for s in (a, b)}
    sched.resume()
    other = build_groups([PromptRecord("q", "q", [4, 5], target_lengths=[40, 40])], 2, 400)[0]
    for s in other.samples:
        sched.submit(s, engine=engines[0])   # placed on the lagging engine: it goes to its pool instead
    clock.run(until=lambda: a.finished and b.finished and all(s.finished for s in other.samples))
    for s in (a, b):
        after = s.segments[before[s.key]:]   # the segments run after the update
        assert after and all(seg.engine == "fast-0" and seg.policy_version == 0 for seg in after)
        assert s.num_generated == 300
    assert all(seg.engine == "fast-1" and seg.policy_version == 1 for s in other.samples for seg in s.segments)
    assert drained == [engines[0]] and sched.lagging() == {"fast-0": 0}   # loads are the caller's
    sched.lag_loaded(engines[0])
    assert sched.lagging() == {}
    late = build_groups([PromptRecord("r", "r", [6], target_lengths=[20, 20])], 2, 400)[0]
    for s in late.samples:
        sched.submit(s, engine=engines[0])
    clock.run(until=lambda: all(s.finished for s in late.samples))
    assert all(seg.engine == "fast-0" and seg.policy_version == 1 for s in late.samples for seg in s.segments)


def test_a_lagging_engine_that_dies_hands_its_samples_on_under_the_current_version():
    clock, engines, sched, group = setup()
    a, b = held_after_a_while(clock, engines, sched, group)
    drained = []
    sched.lag({a: engines[0]}, 0, on_drained=drained.append)
    sched.resume()
    clock.run(until=lambda: a.num_generated >= 120)
    engines[0].kill()
    clock.run(until=lambda: a.finished and b.finished)
    assert a.num_generated == 300 and a.segments[-1].engine == "fast-1" and a.segments[-1].policy_version == 1
    assert drained == [] and sched.lagging() == {}


def test_lag_is_refused_outside_a_pause_or_for_a_version_not_older():
    clock, engines, sched, group = setup()
    a, _ = group.samples
    with pytest.raises(PdsrError, match="pause the scheduler first"):
        sched.lag({a: engines[0]}, 0, on_drained=lambda e: None)
    a, b = held_after_a_while(clock, engines, sched, group)
    with pytest.raises(PdsrError, match="version 1 is not older than the current 1"):
        sched.lag({a: engines[0]}, 1, on_drained=lambda e: None)
