"""A plug-in author's policy that gets something wrong ends the run with an error naming the policy, the hook and
the line, never a hang or a traceback from deep inside the scheduler: a sample never submitted, a hook or a timer
callback that raises, a command the scheduler refuses, an engine that is not the run's. On fake engines, in
virtual time and on an asyncio loop's wall clock as real engines run (tests/fakes.py)."""

from __future__ import annotations

import asyncio
import re

import pytest

from fakes import FakeEngine, assert_complete, records, run_fakes
from pdsr_sdk.dispatch.clock import LoopClock
from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.errors import RunError
from pdsr_sdk.policies.base import Policy
from pdsr_sdk.rollout.data import build_groups
from support import WAIT_S
from workloads import LENGTHS

HERE = __name__


class Forgets(Policy):
    """Never submits sample 1 of a group."""

    name = "forgets"

    def on_batch(self, groups):
        for g in groups:
            for s in g.samples:
                if s.index != 1:
                    self.ctx.submit(s, "fast")


class RaisesWhenFinished(Policy):
    name = "raises-finished"

    def on_batch(self, groups):
        for g in groups:
            for s in g.samples:
                self.ctx.submit(s, "fast")

    def on_sample_finished(self, sample):
        {}["missing"]   # the policy's bug: line named in the error


class RaisesAtSegmentEnd(RaisesWhenFinished):
    name = "raises-segment"

    def on_sample_finished(self, sample):
        pass

    def on_segment_end(self, sample, engine):
        raise ValueError("bad segment")


class TimerRaises(Policy):
    name = "timer-raises"

    def on_batch(self, groups):
        def later():
            raise ZeroDivisionError("in my timer")

        self.ctx.clock.call_later(0.05, later)


class TimerSubmits(Policy):
    """Submits everything from a timer, nothing running meanwhile: legitimate, no stall."""

    name = "timer-submits"

    def on_batch(self, groups):
        def later():
            for g in groups:
                for s in g.samples:
                    self.ctx.submit(s, "fast")

        self.ctx.clock.call_later(0.05, later)


class CancelledTimer(Policy):
    """Sets a timer and cancels it, submitting nothing: the cancelled timer must not keep the run waiting."""

    name = "cancelled-timer"

    def on_batch(self, groups):
        self.ctx.clock.call_later(5.0, lambda: None).cancel()


class SubmitsTwice(Policy):
    name = "submits-twice"

    def on_batch(self, groups):
        s = groups[0].samples[0]
        self.ctx.submit(s, "fast")
        self.ctx.submit(s, "fast")


class ForeignEngine(Policy):
    name = "foreign-engine"

    def on_batch(self, groups):
        other = FakeEngine("fast-9", "fast", None)
        self.ctx.submit(groups[0].samples[0], engine=other)


class ForeignSlots(Policy):
    name = "foreign-slots"

    def on_batch(self, groups):
        self.ctx.free_slots(FakeEngine("fast-9", "fast", None))


class ForeignSteal(Policy):
    name = "foreign-steal"

    def on_batch(self, groups):
        self.ctx.steal(FakeEngine("fast-9", "fast", None), "heavy", 1)


class ForeignReroute(Policy):
    name = "foreign-reroute"

    def on_batch(self, groups):
        self.ctx.reroute(groups[0].samples[0], FakeEngine("fast-9", "fast", None))


def test_a_sample_never_submitted_is_an_error_naming_the_policy_and_the_samples():
    """The run used to sit with nothing to do (in the simulator the clock ran out: 'stalled'; on real engines
    the step waited for good)."""
    groups, sched, engines, done, fatal = run_fakes(f"{HERE}:Forgets", fast=1, heavy=1)
    assert not done and len(fatal) == 1 and isinstance(fatal[0], RunError)
    msg = str(fatal[0])
    assert f"policy 'forgets' ({HERE}:Forgets) left 5 sample(s) unfinished" in msg
    assert "p0/1, p1/1, p2/1, p3/1, p4/1 (5 of them never submitted)" in msg
    assert "submit (ctx.submit) or finish (ctx.finish) every sample" in msg
    # everything it did submit ran to its end first
    assert all(s.finished for g in groups for s in g.samples if s.index != 1)


@pytest.mark.parametrize("cls, hook, cause", [
    ("RaisesWhenFinished", "on_sample_finished", KeyError),
    ("RaisesAtSegmentEnd", "on_segment_end", ValueError),
    ("TimerRaises", "a callback it set with ctx.clock.call_later", ZeroDivisionError),
])
def test_a_hook_or_timer_that_raises_is_a_run_error_naming_the_policy_hook_and_line(cls, hook, cause):
    *_, done, fatal = run_fakes(f"{HERE}:{cls}", fast=1, heavy=1)
    assert not done and fatal and isinstance(fatal[0], RunError), fatal
    msg = str(fatal[0])
    assert msg.startswith("policy ") and f"({HERE}:{cls}) raised in {hook} (at {__file__}:" in msg, msg
    assert f"{cause.__name__}: " in msg and isinstance(fatal[0].__cause__, cause)


@pytest.mark.parametrize("cls, says", [
    ("SubmitsTwice", "policy submitted sample p0/0 twice (it is already queued or running)"),
    ("ForeignEngine", "policy placed sample p0/0 on engine 'fast-9', which is not one of this run's engines "
                      "(fast-0, heavy-0); pass an engine from ctx.pools()"),
    ("ForeignSlots", "policy asked for the free slots of engine 'fast-9', which is not one of this run's engines "
                     "(fast-0, heavy-0); pass an engine from ctx.pools()"),
    ("ForeignSteal", "policy stole work for engine 'fast-9', which is not one of this run's engines "
                     "(fast-0, heavy-0); pass an engine from ctx.pools()"),
    ("ForeignReroute", "policy rerouted sample p0/0 to engine 'fast-9', which is not one of this run's engines "
                       "(fast-0, heavy-0); pass an engine from ctx.pools()"),
])
def test_a_command_the_scheduler_refuses_names_the_policy_and_the_hook(cls, says):
    *_, fatal = run_fakes(f"{HERE}:{cls}", fast=1, heavy=1)
    assert fatal and isinstance(fatal[0], RunError)
    msg = str(fatal[0])
    assert f"({HERE}:{cls}) in on_batch (at {__file__}:" in msg and msg.endswith(says), msg


@pytest.mark.parametrize("policy", [f"{HERE}:TimerSubmits", "baseline", "lpt", "v2.5", "v3"])
def test_work_that_waits_on_a_policys_timer_or_probes_is_no_stall(policy):
    groups, sched, engines, done, fatal = run_fakes(policy, fast=1, heavy=1)
    assert not fatal and done
    assert_complete(groups)


def test_a_cancelled_timer_does_not_hide_a_stall():
    *_, done, fatal = run_fakes(f"{HERE}:CancelledTimer", fast=1, heavy=1)
    assert not done and fatal and "left 20 sample(s) unfinished" in str(fatal[0])


@pytest.mark.parametrize("cls, says", [
    ("Forgets", "left 5 sample(s) unfinished"),
    ("TimerRaises", "raised in a callback it set with ctx.clock.call_later"),
    ("TimerSubmits", None),
])
def test_on_a_wall_clock_a_stuck_policy_ends_the_batch_instead_of_hanging(cls, says):
    """Real engines run on an asyncio loop: a policy that never submitted a sample left the step waiting for
    good, and an exception in its timer callback was only logged by asyncio (the step waited too)."""
    from pdsr_sdk.policies import POLICIES

    async def scenario():
        clock = LoopClock()
        engines = [FakeEngine("fast-0", "fast", clock, max_concurrency=4, token_time=0.0001),
                   FakeEngine("heavy-0", "heavy", clock, max_concurrency=4, token_time=0.0001)]
        policy = POLICIES.get(f"{HERE}:{cls}")
        ended: asyncio.Future = asyncio.get_running_loop().create_future()

        def end(what):
            if not ended.done():
                ended.set_result(what)

        run = DispatchRun(engines, policy, policy.config_model(), clock, SamplingConfig(n=4, max_tokens=1000),
                          SegmentConfig(min_tokens=16, max_tokens=64), on_fatal=end)
        groups = build_groups(records(LENGTHS), 4, 1000)
        run.start_batch(groups, lambda: end("done"))
        return await asyncio.wait_for(ended, WAIT_S), groups

    what, groups = asyncio.run(scenario())
    if says is None:
        assert what == "done"
        assert_complete(groups)
    else:
        assert isinstance(what, RunError) and says in str(what), what


class ReportsAList(Policy):
    name = "reports-a-list"
    streaming = True

    def on_batch(self, groups):
        for g in groups:
            for s in g.samples:
                self.ctx.submit(s, "fast")

    def batch_report(self):
        return [("affinity", 1)]


class ReportRaises(ReportsAList):
    name = "report-raises"

    def batch_report(self):
        return {"share": 1 / 0}


class StepEndReturnsNone(ReportsAList):
    name = "step-end-none"

    def batch_report(self):
        return {}

    def on_step_end(self, carried):
        pass   # forgot the return: [] means nothing to regenerate


@pytest.mark.parametrize("cls, says", [
    ("ReportsAList", "batch_report returned list [('affinity', 1)]; it returns a dict of the batch's facts"),
    ("ReportRaises", "batch_report (at"),
])
def test_a_batch_report_that_is_not_a_dict_or_raises_names_the_policy(cls, says):
    """It used to be a ValueError from dict() (or the bare exception) out of the run's report."""
    from pdsr_sdk.dispatch.clock import VirtualClock
    from pdsr_sdk.policies import POLICIES

    clock = VirtualClock()
    policy = POLICIES.get(f"{HERE}:{cls}")
    run = DispatchRun([FakeEngine("fast-0", "fast", clock)], policy, policy.config_model(), clock,
                      SamplingConfig(n=4, max_tokens=1000), SegmentConfig(min_tokens=16, max_tokens=64))
    run.start_batch(build_groups(records(LENGTHS), 4, 1000))
    clock.run(until=lambda: run.batch_done)
    with pytest.raises(RunError, match=rf"policy '[a-z-]+' \({HERE}:{cls}\)(: | raised in ){re.escape(says)}"):
        run.finish_batch()


def test_an_on_step_end_that_returns_none_names_the_policy_and_the_hook():
    """It used to be "TypeError: 'NoneType' object is not iterable" from inside the step stream."""
    from pdsr_sdk.sim.steps import run_steps
    from sim_cases import hand_trace, unit_cfg

    with pytest.raises(RunError, match=rf"policy 'step-end-none' \({HERE}:StepEndReturnsNone\): on_step_end returned "
                                       rf"NoneType None; it returns a list of samples to generate again \(\[\] for "
                                       rf"none\)"):
        run_steps(hand_trace([25] + [10] * 8), unit_cfg(over_provision=1.0), f"{HERE}:StepEndReturnsNone", 1.0)
