"""The trainer's threads: ``RolloutSession.step`` blocks one thread while ``pause`` / ``resume`` come from
another (fake engines on the session's loop), and a step that loses an engine. The scheduler's pause modes:
tests/dispatch/test_scheduler.py; the session's pause on real vLLM engines:
tests/rollout/test_rollout_vllm_weights.py."""

from __future__ import annotations

import pytest

from fakes import FakeEngine
from support import WAIT_S


def test_a_synchronous_step_in_one_thread_is_paused_and_resumed_from_another(tiny_model_dir):
    """The trainer's threads: ``session.step`` blocks one thread, ``pause`` / ``resume`` come from another
    (fake engines on the session's loop; the real engines: tests/rollout/test_rollout_vllm_weights.py)."""
    import threading
    import time

    from pdsr_sdk.dispatch.clock import LoopClock
    from pdsr_sdk.errors import RunError, UnsupportedError
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    engines = [FakeEngine("fast-0", "fast", None, max_concurrency=2, token_time=0.01),
               FakeEngine("heavy-0", "heavy", None, max_concurrency=2, token_time=0.01)]
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="baseline",
                        sampling={"n": 3, "max_tokens": 40, "ignore_eos": True},
                        segments={"min_tokens": 8, "max_tokens": 8})
    with RolloutSession(cfg, engines=engines) as session:
        for e in engines:
            e.clock = LoopClock(session._thread.loop)
        out = {}
        stepping = threading.Thread(target=lambda: out.update(result=session.step(["a", "b"])))
        stepping.start()
        end = time.monotonic() + WAIT_S
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
        stepping.join(WAIT_S)
        result = out["result"]
    assert len(result.samples) == 6 and all(s.num_generated == 40 == len(s.token_ids) for s in result.samples)
    held = [s for s in result.samples if any(seg.end_reason == "pause" for seg in s.segments)]
    assert len(held) == 4
    assert all(s.segments[-1].policy_version == 7 for s in result.samples)
    assert result.table.num_rows == 6


def test_a_step_that_lost_an_engine_names_it_in_its_summary(tiny_model_dir):
    """An engine lost mid-step (a Ray actor killed): the step still completes on the pool's other engine, and
    its summary counts the loss and carries the error (``engine_errors``, as the run summary does); the next
    step's summary has neither."""
    from pdsr_sdk.dispatch.clock import LoopClock
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    engines = [FakeEngine(name, "fast", None, max_concurrency=2, token_time=0.01) for name in ("fast-0", "fast-1")]
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="baseline",
                        sampling={"n": 2, "max_tokens": 24, "ignore_eos": True},
                        segments={"min_tokens": 8, "max_tokens": 8})
    with RolloutSession(cfg, engines=engines) as session:
        for e in engines:
            e.clock = LoopClock(session._thread.loop)

        def kill_fast_1(sample):
            if not engines[1].dead and engines[1].running:
                engines[1].kill()

        session.hooks.on_sample_done.append(kill_fast_1)
        first = session.step(["a", "b", "c", "d"])
        second = session.step(["e", "f"])
    assert first.summary["engines_lost"] == 1 and first.summary["retries"] >= 1
    [error] = first.summary["engine_errors"]
    assert error.startswith("engine 'fast-1': killed by the test")
    assert len(first.samples) == 8 and all(s.num_generated == 24 for s in first.samples)
    assert second.summary["engines_lost"] == 0 and second.summary["engine_errors"] == []
    assert len(second.samples) == 4 and {seg.engine for s in second.samples for seg in s.segments} == {"fast-0"}
