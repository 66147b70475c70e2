"""The scheduler's own rules on fake engines in virtual time (no vLLM): budget-aware segment lengths,
engines lost mid-batch, how a sample finishes, the per-batch report, and pausing a running step for a
weight update (``pause(mode)`` / ``resume()`` in every mode, every sample keeping its own tokens). The
policies' dispatch on the same fakes: tests/policies/test_policies.py; the session's ``pause`` on real
engines: tests/rollout/test_rollout_vllm_weights.py."""

from __future__ import annotations

import pytest

from fakes import FakeEngine, assert_complete, by_key, records, run_fakes, token_at
from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.errors import EngineError, PdsrError
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.rollout.data import PromptRecord, build_groups
from workloads import LENGTHS


def test_segments_follow_the_budget_formula():
    # capacity 64 tokens, 4 slots: L = clamp(64 / n_active, 16, 64)
    groups, sched, engines, *_ = run_fakes("baseline", {"assignment": "round_robin"}, fast=1, heavy=1, conc=4)
    lens = [r.max_tokens for e in engines for r in e.submitted]
    assert max(lens) <= 64 and min(lens) >= 1
    assert any(16 <= x < 64 for x in lens)   # several active -> shorter segments


def test_a_dead_engine_requeues_its_samples_on_its_pool():
    def kill_later(clock, engines, sched):
        clock.call_later(0.15, engines[0].kill)

    groups, sched, engines, done, fatal = run_fakes("baseline", {"assignment": "round_robin"}, fast=2, heavy=1,
                                              conc=4, before=kill_later)
    assert not fatal and done
    assert sched.stats["engines_lost"] == 1 and sched.stats["retries"] > 0
    err = sched.engine_errors[0]
    assert err.engine == "fast-0" and err.exit_status == -9 and "boom" in str(err)
    retried = [s for s in by_key(groups).values() if s.retries]
    assert all(seg.engine != "fast-0" for s in retried for seg in s.segments[-1:])
    assert_complete(groups)


def test_losing_the_last_engine_of_a_pool_is_a_clear_error():
    def kill_heavy(clock, engines, sched):
        clock.call_later(0.05, engines[1].kill)

    *_, fatal = run_fakes("v2.5", fast=1, heavy=1, before=kill_heavy)
    assert fatal and isinstance(fatal[0], EngineError)
    assert "heavy-0" in str(fatal[0]) and "pool 'heavy'" in str(fatal[0])


def test_a_sample_placed_on_a_full_engine_waits_on_that_engines_queue():
    clock = VirtualClock()
    engine = FakeEngine("fast-0", "fast", clock, max_concurrency=1)
    cls = POLICIES.get("baseline")
    sched = DispatchRun([engine], cls, cls.config_model(), clock, SamplingConfig(n=2, max_tokens=100),
                        SegmentConfig(min_tokens=16, max_tokens=64)).scheduler
    a, b = build_groups([PromptRecord("p", "p", [1, 2, 3], target_lengths=[5, 5])], 2, 100)[0].samples
    sched.submit(a, engine=engine)
    sched.submit(b, engine=engine)
    assert sched.running(engine) == [a] and sched.queued_on(engine) == [b] and sched.queued("fast") == []
    clock.run(until=lambda: a.finished)   # its slot frees: the queued one launches there
    assert sched.running(engine) == [b] and sched.queued_on(engine) == []


def test_natural_eos_finishes_with_stop_and_max_tokens_with_length():
    natural = {("a", 0): 5, ("a", 1): 500}
    clock = VirtualClock()
    engines = [FakeEngine("fast-0", "fast", clock, lengths=natural),
               FakeEngine("heavy-0", "heavy", clock, lengths=natural)]
    cls = POLICIES.get("baseline")
    dispatch = DispatchRun(engines, cls, cls.config_model(), clock, SamplingConfig(n=2, max_tokens=100),
                           SegmentConfig(min_tokens=16, max_tokens=64))
    groups = build_groups([PromptRecord("a", "a", [1, 2])], 2, 100)
    done = []
    dispatch.start_batch(groups, lambda: done.append(1))
    clock.run(until=lambda: bool(done))
    a0, a1 = groups[0].samples
    assert (a0.finish_reason, a0.num_generated) == ("stop", 5)
    assert (a1.finish_reason, a1.num_generated) == ("length", 100)


def test_dispatch_run_reports_each_batch_with_every_stat_key_and_the_policys_facts():
    from pdsr_sdk.dispatch.run import STAT_KEYS

    clock = VirtualClock()
    engines = [FakeEngine("fast-0", "fast", clock), FakeEngine("heavy-0", "heavy", clock)]
    cls = POLICIES.get("v2.5")
    dispatch = DispatchRun(engines, cls, cls.config_model(offload_fraction=0.4), clock,
                           SamplingConfig(n=4, max_tokens=1000), SegmentConfig(min_tokens=16, max_tokens=64))
    reports = []
    for _ in range(2):
        groups = build_groups(records(), 4, 1000)
        done = []
        dispatch.start_batch(groups, lambda: done.append(clock.now()))
        clock.run(until=lambda: bool(done))
        reports.append(dispatch.finish_batch())
    first, second = reports
    assert [r.batch_index for r in reports] == [0, 1]
    assert all(g.batch_index == 1 for g in second.groups)
    assert second.start_s == first.end_s and second.end_s == done[0]
    assert second.makespan_s == second.end_s - second.start_s > 0
    assert second.tokens == sum(sum(ls) for ls in LENGTHS.values())
    assert set(STAT_KEYS) <= set(second.stats) and second.stats["breaks"] == 2 and second.stats["steals"] == 0
    assert second.policy == {"l_cut": 60, "fast_cap": 90}
    assert set(second.engine_busy_s) == {"fast-0", "heavy-0"}
    assert 0 < second.engine_busy_s["fast-0"] <= second.makespan_s
    with pytest.raises(RuntimeError, match="no finished batch"):
        dispatch.finish_batch()


PAUSE_AT, RESUME_AT = 0.3, 0.8


def fake_run(policy, mode, *, pause_at=PAUSE_AT, resume_at=RESUME_AT):
    """One batch of LENGTHS on fake engines (1 fast, 1 heavy, 3 slots each); paused at ``pause_at``,
    policy version 1 and resumed at ``resume_at``. Returns what the test checks."""
    clock = VirtualClock()
    engines = [FakeEngine("fast-0", "fast", clock, max_concurrency=3), FakeEngine("heavy-0", "heavy", clock,
                                                                                  max_concurrency=3)]
    cls = POLICIES.get(policy)
    fatal = []
    dispatch = DispatchRun(engines, cls, cls.config_model(), clock, SamplingConfig(n=4, max_tokens=1000),
                           SegmentConfig(min_tokens=16, max_tokens=64), on_fatal=fatal.append)
    sched = dispatch.scheduler
    records = [PromptRecord(pid, pid, [1, 2, 3 + i], target_lengths=list(ls)) for i, (pid, ls) in
               enumerate(LENGTHS.items())]
    groups = build_groups(records, 4, 1000)
    seen = {}

    def pause():
        seen["running"] = set(sched.running())
        seen["finished"] = {s for g in groups for s in g.samples if s.finished}
        seen["submitted"] = sum(len(e.submitted) for e in engines)
        sched.pause(mode, on_drained=lambda: seen.setdefault("drained", clock.now()))
        # asked again while the aborts are on their way (as a step that ends before the engines restart)
        sched.when_drained(lambda: seen.setdefault("drained_again", (clock.now(), sched.in_flight)))

    def resume():
        seen["in_flight"] = sched.in_flight
        seen["held"] = set(sched.held())
        seen["submitted_while_paused"] = [r for e in engines for r in e.submitted[:]][seen["submitted"]:]
        sched.policy_version = 1
        sched.resume()

    clock.call_later(pause_at, pause)
    clock.call_later(resume_at, resume)
    done = []
    dispatch.start_batch(groups, lambda: done.append(clock.now()))
    clock.run(until=lambda: bool(done) or bool(fatal))
    assert not fatal and done
    return groups, sched, seen


def assert_every_sample_whole(groups):
    for g in groups:
        assert len(g.samples) == 4
        for s in g.samples:
            want = LENGTHS[g.prompt_id][s.index]
            assert s.finished and s.num_generated == want, s.key
            assert s.token_ids == [token_at(g.prompt_id, s.index, i) for i in range(want)], s.key
            assert len(s.logprobs) == want
            assert sum(seg.num_tokens for seg in s.segments) - s.wasted_tokens == want
            starts = [seg.start_token for seg in s.segments]
            assert starts == sorted(starts)


@pytest.mark.parametrize("policy", ["baseline", "v2", "v3"])
def test_abort_holds_running_samples_with_their_tokens_and_continues_them_after_resume(policy):
    groups, sched, seen = fake_run(policy, "abort")
    assert_every_sample_whole(groups)
    assert seen["in_flight"] == 0 and seen["drained"] == pytest.approx(PAUSE_AT)
    assert seen["drained_again"] == (seen["drained"], 0)
    assert seen["held"] and seen["held"] <= seen["running"]
    assert not seen["submitted_while_paused"]
    for s in seen["held"]:
        cut = [i for i, seg in enumerate(s.segments) if seg.end_reason == "pause"]
        assert len(cut) == 1, s.key
        before, after = s.segments[:cut[0] + 1], s.segments[cut[0] + 1:]
        assert {seg.policy_version for seg in before} == {0} and {seg.policy_version for seg in after} == {1}
        assert (after[0].engine == before[-1].engine
                and after[0].start_token == before[-1].start_token + before[-1].num_tokens)
    # nothing was generated while paused
    for g in groups:
        for s in g.samples:
            for seg in s.segments:
                if seg.num_tokens and seg.first_token_time_s is not None:
                    assert not (PAUSE_AT + 1e-9 < seg.first_token_time_s < RESUME_AT - 1e-9), s.key
    assert sched.idle and sched.paused is None


@pytest.mark.parametrize("policy", ["baseline", "v3"])
def test_wait_lets_running_samples_finish_and_starts_nothing_new(policy):
    groups, sched, seen = fake_run(policy, "wait", resume_at=5.0)
    assert_every_sample_whole(groups)
    assert PAUSE_AT < seen["drained"] < 5.0 and seen["in_flight"] == 0 and not seen["held"]
    assert seen["drained_again"] == (seen["drained"], 0)
    # only continuations of samples that were running when the pause came
    assert {r.sample for r in seen["submitted_while_paused"]} <= seen["running"]
    running = seen["running"]
    assert all(s.finished and s.finish_time_s <= seen["drained"] for s in running)
    for g in groups:
        for s in g.samples:
            if s not in running and s not in seen["finished"]:
                assert {seg.policy_version for seg in s.segments} == {1}, s.key


def test_keep_leaves_requests_running_and_splits_their_segments_at_the_version_change():
    groups, sched, seen = fake_run("baseline", "keep", resume_at=PAUSE_AT + 0.05)
    assert_every_sample_whole(groups)
    assert seen["in_flight"] == len(seen["running"]) > 0 and "drained" not in seen and "drained_again" not in seen
    # the fake engine reports a segment's tokens at its end: a segment running at the resume has none
    # reported yet and is stamped with the new version as a whole (real engines: tests below)
    for s in seen["running"]:
        versions = [seg.policy_version for seg in s.segments]
        assert versions == sorted(versions) and versions[-1] == 1, s.key
        assert not [seg for seg in s.segments if seg.end_reason == "pause"]


def test_pause_misuse_is_named():
    clock = VirtualClock()
    engines = [FakeEngine("fast-0", "fast", clock), FakeEngine("heavy-0", "heavy", clock)]
    cls = POLICIES.get("baseline")
    sched = DispatchRun(engines, cls, cls.config_model(), clock, SamplingConfig(n=2, max_tokens=10),
                        SegmentConfig()).scheduler
    with pytest.raises(PdsrError, match="pause mode must be one of abort, wait, keep; got 'stop'"):
        sched.pause("stop")
    called = []
    sched.pause("wait", on_drained=lambda: called.append(1))
    assert called == [1]      # nothing ran
    with pytest.raises(PdsrError, match="already paused"):
        sched.pause("abort")
    sched.when_drained(lambda: called.append(2))
    assert called == [1, 2]   # still nothing runs: at once
    sched.resume()
    sched.resume()            # not paused: nothing
    assert sched.paused is None
    with pytest.raises(PdsrError, match="when_drained: not paused"):
        sched.when_drained(lambda: None)
