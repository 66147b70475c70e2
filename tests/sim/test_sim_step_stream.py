"""The StepStream driven by hand, as a session drives it: consuming at a step's end, version changes in the
middle of steps, and when the policy is told of the staleness bound."""

from __future__ import annotations

import pytest

from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.policies.resolve import resolve_policy
from pdsr_sdk.sim.driver import trace_batches
from pdsr_sdk.sim.engine import SimEngine
from pdsr_sdk.dispatch.types import kept_segments
from pdsr_sdk.dispatch.types import StreamSpec
from sim_cases import recorded, small_cfg, small_trace


def hand_stream(groups: int, over_provision: float, staleness: int | None):
    """A StepStream on simulated engines driven by hand, as a session drives it (v3, steps of 6 groups of
    4): returns the stream, its clock, the step-end times (appended by ``on_step_end``), the trace rows
    taken so far, and the trace's lengths by prompt."""
    from pdsr_sdk.dispatch.steps import StepStream, in_flight
    from pdsr_sdk.sim.batches import build_batch
    from pdsr_sdk.sim.driver import build_engines

    trace = small_trace(groups=groups)
    cfg = small_cfg(policy="v3")
    rows = [g for b in trace_batches(trace, cfg.model_copy(update={"num_batches": None})).batches for g in b]
    clock = VirtualClock()
    cls, settings = resolve_policy("v3", {})
    handlers, ended, taken = [], [], []
    run = DispatchRun(build_engines(cfg, clock, record=False), cls, settings, clock,
                      SamplingConfig(n=4, max_tokens=600, ignore_eos=True), cfg.segments,
                      busy_s=SimEngine.busy_s_at, on_group_done=lambda g: handlers[0].group_done(g))

    def new_groups(count):
        batch = rows[len(taken):len(taken) + count]
        taken.extend(batch)
        return build_batch(batch)

    stream = StepStream(run, step_groups=6, in_flight=in_flight(6, over_provision), steps=None,
                        max_staleness=staleness, group_deadline=None, new_groups=new_groups,
                        on_step_end=lambda: ended.append(clock.now()), check=True)
    handlers.append(stream)
    return stream, clock, ended, taken, recorded(trace)


@pytest.mark.parametrize("over_provision", [0.5, 1.5])
def test_stream_owned_by_hand_consumes_at_step_end_and_the_last_step_drains(over_provision):
    """The StepStream as a session drives it: at a step's end the owner takes the groups (consume), bumps
    the version later (the trainer's update), then refills; the last step tops the groups in flight up to
    B and ends when every one is complete. Every launched group is consumed exactly once, whole, and
    ``groups_launched`` (the progress bar's total of ``pdsr rollout --steps``) counts them. At F = 1.5
    more than B are in flight when the last step starts: it launches none and takes them all."""
    from pdsr_sdk.dispatch.steps import groups_launched

    stream, clock, ended, taken, want = hand_stream(40, over_provision, 1)
    run = stream.run
    stream.start()
    consumed = []
    for step in range(5):
        clock.run(until=lambda: len(ended) > step)
        consumed.append(stream.consume())
        if step < 4:
            run.scheduler.policy_version += 1
            stream.refill(last=step == 3)   # the last step tops up to B and drains
    assert stream.draining and not stream.flying
    ids = [g.prompt_id for step in consumed for g in step]
    assert len(ids) == len(set(ids)) == len(taken) == groups_launched(6, over_provision, 5)
    assert len(taken) == {0.5: 9 + 3 * 6 + 3, 1.5: 15 + 3 * 6}[over_provision]
    assert [len(step) for step in consumed] == {0.5: [6] * 5, 1.5: [6] * 4 + [9]}[over_provision]
    assert {g.prompt_id: sorted(s.num_generated for s in g.samples) for step in consumed for g in step} == \
        {pid: sorted(v) for pid, v in want.items() if pid in set(ids)}
    assert max(r.max_age for r in stream.records) <= 1


@pytest.mark.parametrize("staleness,updates,hold", [(0, 2, False), (1, 1, False), (1, 2, False), (2, 1, False),
                                                    (1, 1, True), (0, 2, True)])
def test_stream_takes_version_changes_in_the_middle_of_steps(staleness, updates, hold):
    """A pipelined trainer: it trains on step k while step k + 1 generates, so its version changes come in
    the middle of a step (one or two a step), and the owner refills at once at each step's end (no change
    there). The stream restarts what a change makes too stale, counts token ages from the version at each
    step's end, and names (``blocked_by``) a change that would make a sample restarted once too stale
    again: that change waits for the step's end, which consumes its group (with more changes a step than
    S, a later one finds an earlier one's restarts). Every launched group is consumed once, whole, with its
    kept tokens (``check``), and no consumed token is older than S versions at its step's end. ``hold``
    (``hold_until``, a session's ``wait_for_update``): no step ends before the change that follows its
    predecessor's end, so each ends one version above its start, unless a change had to wait for the
    step's end (``release_hold``)."""
    stream, clock, ended, taken, want = hand_stream(48, 0.5, staleness)
    sched = stream.sched
    changes = {"mid_step": 0, "waited": 0}
    released = set()   # steps whose hold was released
    waiting = []

    def update():   # the trainer finished an update
        if waiting:               # it waits for the step's end; no further update until then
            return
        if stream.closing:        # the step ended first: the change goes in between steps
            waiting.append(True)
        elif stream.blocked_by(sched.policy_version + 1):
            changes["waited"] += 1
            waiting.append(True)
            if stream.hold_until is not None:   # else the step would wait for this change forever
                released.add(stream.t)
                stream.release_hold()
        else:
            sched.policy_version += 1
            stream.version_changed()
            changes["mid_step"] += 1

    stream.start()
    consumed, versions = [], []
    for step in range(6):
        clock.run(until=lambda: len(ended) > step)
        versions.append((stream.step_version, stream.end_version))
        consumed.append(stream.consume())
        if waiting:
            waiting.clear()
            sched.policy_version += 1
        if step < 5:
            stream.hold_until = stream.end_version + 1 if hold else None
            stream.refill(last=step == 4)
            for u in range(updates):   # a step takes 1-4 s; held, the trainer is often slower than that
                clock.call_later((2.0 if hold else 0.4) * (u + 1), update)
    assert stream.draining and not stream.flying
    ids = [g.prompt_id for step in consumed for g in step]
    assert len(ids) == len(set(ids)) == len(taken)
    assert {g.prompt_id: sorted(s.num_generated for s in g.samples) for step in consumed for g in step} == \
        {pid: sorted(v) for pid, v in want.items() if pid in set(ids)}
    # more changes a step than S: a sample restarted at one is too stale by a later one, which waits
    assert changes["mid_step"] >= 2 and (changes["waited"] > 0) == (updates > staleness), changes
    for record, (start, end) in zip(stream.records, versions):
        assert max(record.ages, default=0) <= staleness and record.max_age <= staleness
    assert any(end == start + 1 for start, end in versions)
    if hold:
        assert all(end > versions[t - 1][1] for t, (_, end) in enumerate(versions) if t and t not in released), \
            versions
    for step in consumed:
        for g in step:
            for s in g.samples:
                assert all(seg.policy_version <= sched.policy_version for seg in kept_segments(s))
    if staleness == 0:
        assert sum(r.stale_restarts for r in stream.records) > 0
    else:
        assert sum(r.partial_tokens for r in stream.records) > 0


@pytest.mark.parametrize("over_provision,told", [(0.0, None), (0.5, 1)])
def test_the_policy_hears_of_the_staleness_bound_only_where_groups_carry_over(over_provision, told):
    """With B groups in flight (F = 0) every step consumes all of them, so nothing is carried and no bound can
    bind: the policy is not told of it (v3 would otherwise keep a tail lane, whose capacity at B = 512 on the
    seed-002-like trace cost 35% of a step: 1.348x baseline's on-policy step, 0.974x without). The stream
    itself still restarts by the bound (an update in the middle of a step can age tokens at F = 0 too)."""
    stream, *_ = hand_stream(20, over_provision, 1)
    assert stream.sched.max_staleness is None and stream.sched.stream is None   # told with the groups
    stream.start()
    assert stream.sched.max_staleness == told and stream.s == 1
    # told through the dispatch API, with the groups: a description of the stream, not an attribute set from outside
    assert stream.sched.stream == StreamSpec(step_groups=6, in_flight=6 if told is None else 9, max_staleness=told)
    with pytest.raises(AttributeError):
        stream.sched.max_staleness = 2
