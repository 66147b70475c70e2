"""Pausing a running step for a weight update: the scheduler's ``pause(mode)`` / ``resume()`` on fake
engines (every mode; every sample keeps its own tokens). The session's ``pause`` / ``resume`` and
``sleep`` on real vLLM engines: tests/test_rollout_vllm.py (sharing its engines)."""

from __future__ import annotations

import pytest

from fakes import FakeEngine, token_at
from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.errors import PdsrError
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.rollout.data import PromptRecord, build_groups
from workloads import LENGTHS

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
        assert after[0].engine == before[-1].engine and after[0].start_token == before[-1].start_token + before[-1].num_tokens
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


def test_a_synchronous_step_in_one_thread_is_paused_and_resumed_from_another(tiny_model_dir):
    """The trainer's threads: ``session.step`` blocks one thread, ``pause`` / ``resume`` come from another
    (fake engines on the session's loop; the real engines: tests/test_rollout_vllm.py)."""
    import threading
    import time

    from pdsr_sdk.dispatch.clock import LoopClock
    from pdsr_sdk.errors import RunError, UnsupportedError
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    engines = [FakeEngine("fast-0", "fast", None, max_concurrency=2, token_time=0.01),
               FakeEngine("heavy-0", "heavy", None, max_concurrency=2, token_time=0.01)]
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="baseline",
                        sampling={"n": 3, "max_tokens": 40, "ignore_eos": True}, segments={"min_tokens": 8, "max_tokens": 8})
    with RolloutSession(cfg, engines=engines) as session:
        for e in engines:
            e.clock = LoopClock(session._thread.loop)
        out = {}
        stepping = threading.Thread(target=lambda: out.update(result=session.step(["a", "b"])))
        stepping.start()
        end = time.monotonic() + 30
        while not (session.scheduler.in_flight == 4 and all(s.num_generated for s in session.scheduler.running())):
            assert time.monotonic() < end
            time.sleep(0.005)
        with pytest.raises(UnsupportedError, match=r"pause\('keep'\): engine\(s\) fast-0, heavy-0 cannot freeze"):
            session.pause("keep")
        session.pause("abort")
        assert session.paused == "abort" and session.scheduler.in_flight == 0 and len(session.scheduler.held()) == 4
        with pytest.raises(RunError, match="already paused"):
            session.pause("wait")
        with pytest.raises(UnsupportedError, match=r"fast-0: its backend has no sleep mode"):
            session.sleep()
        session.policy_version = 7            # what update_weights does once the weights are in
        time.sleep(0.1)
        assert stepping.is_alive()
        session.resume()
        stepping.join(30)
        result = out["result"]
    assert len(result.samples) == 6 and all(s.num_generated == 40 == len(s.token_ids) for s in result.samples)
    held = [s for s in result.samples if any(seg.end_reason == "pause" for seg in s.segments)]
    assert len(held) == 4
    assert all(s.segments[-1].policy_version == 7 for s in result.samples)
    assert result.table.num_rows == 6
