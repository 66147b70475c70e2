"""``next_version`` (a weight update without weights) is taken when ``update_weights`` would be: between steps (a
partial-rollout step's end included, as ``pdsr rollout --steps`` and bench/partial.py call it) or while paused; a
running, unpaused step refuses it with a RunError and goes on (fake engines on the session's loop)."""

from __future__ import annotations

import threading
import time

import pytest

from fakes import FakeEngine
from support import WAIT_S
from pdsr_sdk.errors import RunError


def session_on_fakes(tiny_model_dir, max_tokens: int, **kw):
    from pdsr_sdk.dispatch.clock import LoopClock
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    engines = [FakeEngine("fast-0", "fast", None, max_concurrency=2, token_time=0.01),
               FakeEngine("heavy-0", "heavy", None, max_concurrency=2, token_time=0.01)]
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="baseline", batch_size=2,
                        sampling={"n": 2, "max_tokens": max_tokens, "ignore_eos": True},
                        segments={"min_tokens": 8, "max_tokens": 8}, **kw)
    session = RolloutSession(cfg, engines=engines)
    session.__enter__()
    for e in engines:
        e.clock = LoopClock(session._thread.loop)
    return session


def wait_running(session, stepping) -> None:
    """Until the step's samples are generating (each takes seconds: the check that follows runs well within)."""
    end = time.monotonic() + WAIT_S
    while not (session.scheduler.in_flight and all(s.num_generated for s in session.scheduler.running())):
        assert time.monotonic() < end and stepping.is_alive()
        time.sleep(0.005)


def test_a_running_step_refuses_next_version_until_paused(tiny_model_dir):
    """Mid-step: a RunError saying so (the version stays, the step goes on); after pause('abort') it bumps the
    version, and the held samples' segments after resume carry it; between steps it is taken."""
    session = session_on_fakes(tiny_model_dir, 200)
    try:
        out = {}
        stepping = threading.Thread(target=lambda: out.update(result=session.step(["a", "b"])))
        stepping.start()
        wait_running(session, stepping)
        with pytest.raises(RunError, match=r"next_version: a step is running; pause it first "
                                           r"\(session\.pause\(\.\.\.\)\) or call it between steps"):
            session.next_version()
        assert session.policy_version == 0 and stepping.is_alive()
        session.pause("abort")
        assert session.next_version() == 1
        session.resume()
        stepping.join(WAIT_S)
        assert session.next_version() == 2
    finally:
        session.__exit__(None, None, None)
    result = out["result"]
    assert len(result.samples) == 4 and all(len(s.token_ids) == 200 for s in result.samples)
    held = [s for s in result.samples if any(seg.end_reason == "pause" for seg in s.segments)]
    assert held and all(s.segments[-1].policy_version == 1 for s in held)
    assert {s.segments[0].policy_version for s in result.samples} == {0}


def test_partial_rollout_takes_next_version_at_each_step_end_and_refuses_it_mid_step(tiny_model_dir):
    """Partial rollout (over_provision): next_version after each step() returns, as the CLI's --steps loop does,
    and the carried samples go on under the new version; while a step runs, unpaused, a RunError."""
    session = session_on_fakes(tiny_model_dir, 400, over_provision=1.0, step_groups=2)
    try:
        prompts = iter(list("abcdefgh"))   # 4 groups of 2 in flight on 4 slots: 2 are carried
        first = session.step(prompts)
        assert session.next_version() == 1
        out = {}
        stepping = threading.Thread(target=lambda: out.update(result=session.step(())))
        stepping.start()
        wait_running(session, stepping)
        with pytest.raises(RunError, match="next_version: a step is running"):
            session.next_version()
        stepping.join(WAIT_S)
        assert session.next_version() == 2
        last = session.step((), last=True)
    finally:
        session.__exit__(None, None, None)
    assert len(first.groups) == len(out["result"].groups) == 2
    versions = {seg.policy_version for g in (*out["result"].groups, *last.groups) for s in g.samples
                for seg in s.segments}
    assert {1, 2} <= versions
