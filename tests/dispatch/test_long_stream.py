"""A step stream over many steps on fake engines (tests/fakes.py, virtual time), as a session drives it (consume at
each step's end, a new policy version, refill): what it keeps stays the size of the work in flight, however many
steps a run of days has had."""

from __future__ import annotations

import random

import pytest

from fakes import FakeEngine
from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.dispatch.steps import StepStream, in_flight
from pdsr_sdk.policies.resolve import resolve_policy
from pdsr_sdk.rollout.data import PromptRecord, build_groups

LONG = 1500   # one sample in 49 runs this long: it outlives max_staleness steps and is restarted for staleness
B, N = 4, 4


def run_stream(policy: str, steps: int, *, seed: int = 0, settings: dict | None = None, **stream_kw):
    """``steps`` steps of B = 4 groups of 4 at over_provision 0.25 and max_staleness 2 through ``policy`` on three
    fake engines; returns the stream and the total of its steps' staleness restarts."""
    rng = random.Random(seed)
    clock = VirtualClock()
    engines = [FakeEngine(f"fast-{i}", "fast", clock, max_concurrency=4) for i in range(2)]
    engines.append(FakeEngine("heavy-0", "heavy", clock, max_concurrency=4))
    cls, policy_settings = resolve_policy(policy, settings or {})
    fatal: list = []
    streams: list[StepStream] = []
    run = DispatchRun(engines, cls, policy_settings, clock, SamplingConfig(n=N, max_tokens=LONG),
                      SegmentConfig(min_tokens=16, max_tokens=64), on_fatal=fatal.append,
                      on_group_done=lambda g: streams[0].group_done(g))
    count = iter(range(10**9))

    def new_groups(k: int):
        records = []
        for _ in range(k):
            i = next(count)
            lengths = [rng.choice([5, 10, 20, 40, 80, 200] * 8 + [LONG]) for _ in range(N)]
            records.append(PromptRecord(f"q{i}", f"p{i}", [1, 2, 3 + i % 50], target_lengths=lengths))
        return build_groups(records, N, LONG)

    ended: list = []
    stream = StepStream(run, step_groups=B, in_flight=in_flight(B, 0.25), steps=None, max_staleness=2,
                        group_deadline=None, new_groups=new_groups, on_step_end=lambda: ended.append(True),
                        **stream_kw)
    streams.append(stream)
    stream.start()
    stale_restarts = 0
    for step in range(steps):
        clock.run(until=lambda: len(ended) > step or bool(fatal))
        assert not fatal, fatal
        stream.consume()
        stale_restarts += stream.records[-1].stale_restarts
        run.scheduler.policy_version += 1   # the trainer's update
        stream.refill()
        for e in engines:
            e.submitted.clear()   # the fake's own record of requests
    return stream, stale_restarts


@pytest.mark.parametrize("policy", ["baseline", "v3"])
def test_staleness_restarts_are_forgotten_when_their_group_leaves(policy):
    """The stream kept, by sample id, every sample it had restarted for staleness, after its group was consumed:
    one entry per such restart, for good (about a hundred after 300 steps here), and a new sample at a freed sample's
    address could be taken for one restarted already (refused a second restart as 'a bug'). Only samples of groups in
    flight are asked about; those are all it keeps now."""
    stream, stale_restarts = run_stream(policy, 300)
    assert stale_restarts > 30   # the long samples were restarted for staleness, time and again
    flying = {id(s) for g, _ in stream.flying.values() for s in g.samples}
    assert set(stream.restarted) <= flying
    assert len(stream.restarted) <= len(flying) <= in_flight(B, 0.25) * N
    assert set(stream.watch) <= set(stream.flying)


def test_a_stream_that_keeps_no_records_holds_the_last_step_only():
    """A session's stream kept every step's StepRecord and two dict entries per prompt (the step it was launched in,
    the step it was consumed in), which only the simulator's report reads: for good, over days of steps. With
    ``keep_records=False`` (the session's) it holds the last step's record, as long as it ran, and no prompt's
    steps; by default (the simulator's) it holds them all."""
    kept, _ = run_stream("baseline", 60)
    assert [r.index for r in kept.records] == list(range(60))
    assert len(kept.consumed_at) == 60 * B and len(kept.launched_at) >= 60 * B
    short, _ = run_stream("baseline", 60, keep_records=False)
    assert len(short.records) == 1 and short.records[-1] == kept.records[-1]
    assert not short.consumed_at and not short.launched_at


def test_v3_forgets_the_samples_it_refreshed_once_their_group_is_consumed():
    """v3 with ``step_end.refresh_ratio`` regenerates each finished sample of a carried group at most once, and
    kept every such sample (its tokens too) in a set for good. Only carried groups' samples are looked at: the set
    now holds those alone."""
    stream, _ = run_stream("v3", 150, settings={"step_end": {"refresh_ratio": 0.5}})
    assert sum(r.refreshed for r in stream.records) > 30   # finished samples were refreshed, time and again
    refreshed = stream.run.policy.step_end.refreshed
    assert refreshed <= {s for g, _ in stream.flying.values() for s in g.samples}
