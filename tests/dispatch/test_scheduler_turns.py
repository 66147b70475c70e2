"""Multi-turn samples in the scheduler: parked between turns (no slot held), continued on the engine that holds
their prefix, the environment's tokens masked, with every policy, on fake engines in virtual time."""

from __future__ import annotations

import pytest

from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.dispatch.types import LENGTH, STOP
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.rollout.data import PromptRecord, build_groups
from turn_fakes import TurnEngine, sampled_token, turn_length

TURNS = 3
ENV_IDS = 4


def run_turns(policy, *, env_delay=0.5, seg=None):
    clock = VirtualClock()
    engines = [TurnEngine(f"fast-{i}", "fast", clock) for i in range(2)] + [TurnEngine("heavy-0", "heavy", clock)]
    cls = POLICIES.get(policy)
    fatal, parked_seen = [], []
    holder = {}

    def on_turn_end(sample, reason):
        sched = holder["sched"]
        # parked: no engine runs it, and it holds no slot
        assert sched.engine_of(sample) is None and sample in sched.parked()
        assert all(r["req"].sample is not sample for e in engines for r in e.running.values())
        parked_seen.append((sample.key, sample.segments[-1].engine))
        turns = sum(t.role == "assistant" for t in sample.turns)
        if turns < TURNS:
            env = [900 + turns] * ENV_IDS
            clock.call_later(env_delay * (1 + sample.index), lambda: sched.continue_turn(sample, env))
        else:
            clock.call_later(env_delay, lambda: sched.finish(sample, STOP))

    records = [PromptRecord(f"p{i}", f"prompt {i}", [1, 2, 3 + i]) for i in range(6)]
    groups = build_groups(records, 4, 400)
    for g in groups:
        for s in g.samples:
            s.turns, s.response_mask = [], []
    run = DispatchRun(engines, cls, cls.config_model(), clock, SamplingConfig(n=4, max_tokens=400),
                      seg or SegmentConfig(min_tokens=4, max_tokens=8), on_fatal=fatal.append, on_turn_end=on_turn_end)
    holder["sched"] = run.scheduler
    done = []
    run.start_batch(groups, lambda: done.append(clock.now()))
    clock.run(until=lambda: bool(done) or bool(fatal))
    assert not fatal, fatal
    assert done
    return groups, run, engines, parked_seen


@pytest.mark.parametrize("policy", ["baseline", "lpt", "v1", "v2", "v2.5", "v3"])
def test_turns_are_exact_masked_and_hold_no_slot(policy):
    groups, run, engines, parked = run_turns(policy)
    report = run.finish_batch()
    sampled = 0
    for g in groups:
        for s in g.samples:
            assert s.finish_reason == STOP
            roles = [t.role for t in s.turns]
            assert roles == ["assistant", "environment"] * (TURNS - 1) + ["assistant"]
            # the mask marks the sampled spans, and the ids are the model's then the environment's, in order
            expect_ids, expect_mask = [], []
            for t in s.turns:
                if t.role == "assistant":
                    assert t.num_tokens == turn_length(s) and t.finish_reason == STOP
                    expect_ids += [sampled_token(s.key, len(expect_ids) + i) for i in range(t.num_tokens)]
                    expect_mask += [1] * t.num_tokens
                else:
                    assert t.num_tokens == ENV_IDS and t.end_s >= t.start_s
                    expect_ids += ([900 + len([x for x in s.turns[:s.turns.index(t)] if x.role == "assistant"])]
                                   * ENV_IDS)
                    expect_mask += [0] * ENV_IDS
            assert s.token_ids == expect_ids and s.response_mask == expect_mask
            assert len(s.logprobs) == len(s.token_ids)
            assert all(lp == 0.0 for lp, m in zip(s.logprobs, s.response_mask) if m == 0)
            assert s.env_tokens == ENV_IDS * (TURNS - 1)
            sampled += s.sampled_tokens
    assert report.tokens == sampled   # the environment's tokens are context, not generated
    assert run.scheduler.stats["turns"] == TURNS * sum(len(g.samples) for g in groups)
    assert run.scheduler.idle


def test_next_turn_goes_to_the_engine_that_ran_the_last():
    groups, run, engines, parked = run_turns("baseline")
    for g in groups:
        for s in g.samples:
            turn_engines = []
            for t in s.turns:
                if t.role == "assistant":
                    first = next(seg for seg in s.segments if seg.start_token == t.start_token)
                    turn_engines.append(first.engine)
            assert len(set(turn_engines)) == 1, (s.key, turn_engines)


def test_policy_moves_and_restarts_of_a_parked_sample():
    """A move while parked sends the next turn there; a restart is refused (the agent holds the conversation)."""
    clock = VirtualClock()
    engines = [TurnEngine("fast-0", "fast", clock), TurnEngine("fast-1", "fast", clock)]
    cls = POLICIES.get("baseline")
    holder, fatal = {}, []

    def on_turn_end(sample, reason):
        sched = holder["sched"]
        if len(sample.turns) == 1:
            other = next(e for e in engines if e.name != sample.segments[-1].engine)
            sched.move(sample, engine=other)
            sched.restart(sample)
            clock.call_later(0.1, lambda: sched.continue_turn(sample, [7, 7]))
        else:
            clock.call_later(0.1, lambda: sched.finish(sample, STOP))

    groups = build_groups([PromptRecord("p0", "x", [1, 2])], 2, 100)
    for s in groups[0].samples:
        s.turns, s.response_mask = [], []
    run = DispatchRun(engines, cls, cls.config_model(), clock, SamplingConfig(n=2, max_tokens=100),
                      SegmentConfig(enabled=False), on_fatal=fatal.append, on_turn_end=on_turn_end)
    holder["sched"] = run.scheduler
    done = []
    run.start_batch(groups, lambda: done.append(1))
    clock.run(until=lambda: bool(done) or bool(fatal))
    assert not fatal and done
    for s in groups[0].samples:
        assert s.segments[0].engine != s.segments[-1].engine
        assert s.moves == 1 and s.restarts == 0 and s.wasted_tokens == 0
        assert s.response_mask == [1] * turn_length(s) + [0, 0] + [1] * turn_length(s)
    assert run.scheduler.stats["turn_restarts_refused"] == 2


def test_turn_token_limit_and_budget():
    """continue_turn(max_tokens=k) ends the turn after k tokens (length); the budget counts the environment's."""
    clock = VirtualClock()
    engines = [TurnEngine("fast-0", "fast", clock)]
    cls = POLICIES.get("baseline")
    holder, reasons = {}, []

    def on_turn_end(sample, reason):
        reasons.append(reason)
        sched = holder["sched"]
        if len(reasons) == 1:
            clock.call_later(0.1, lambda: sched.continue_turn(sample, [5] * 3, max_tokens=2))
        else:
            clock.call_later(0.1, lambda: sched.finish(sample, LENGTH))

    groups = build_groups([PromptRecord("p0", "x", [1, 2])], 1, 100)
    s = groups[0].samples[0]
    s.turns, s.response_mask = [], []
    run = DispatchRun(engines, cls, cls.config_model(), clock, SamplingConfig(n=1, max_tokens=100),
                      SegmentConfig(enabled=False), on_turn_end=on_turn_end)
    holder["sched"] = run.scheduler
    done = []
    run.start_batch(groups, lambda: done.append(1))
    clock.run(until=lambda: bool(done))
    assert reasons == [STOP, LENGTH]
    assert s.response_mask == [1] * turn_length(s) + [0] * 3 + [1] * 2
    assert s.finish_reason == LENGTH
