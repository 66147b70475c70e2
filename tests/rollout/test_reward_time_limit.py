"""``reward_time_limit_s``: a reward call that runs past it is its own sample's reward error, on threads and in
worker processes, counted from the call's start (not its wait in the queue); the session goes on. Fake engines
(fakes:LoopEngine), the tiny model's tokenizer."""

from __future__ import annotations

import threading
import time

import pytest

from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.reward_runner import time_limit_error
from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch

PROMPTS = [{"id": f"q{i}", "prompt": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(4)]


def hangs(text, ground_truth, *, prompt_id, sample_index, **info):
    """Never returns on one sample; one that swallows ``Exception`` too (a reward's own broad ``except``)."""
    if (prompt_id, sample_index) == ("q1", 0):
        while True:
            try:
                threading.Event().wait(3600)
            except Exception:  # noqa: BLE001 - the point: a reward that catches everything it can
                pass
    return 1.0


def verifies_then_hangs(text, ground_truth, *, prompt_id, sample_index, **info):
    """verl's math_verify reward's way: math-verify's own timeout (``signal.alarm``, set then cancelled), then, on
    one sample, a hang."""
    from math_verify import parse, verify

    right = verify(parse("$4$"), parse("$4$"))
    if (prompt_id, sample_index) == ("q1", 0):
        hangs(text, ground_truth, prompt_id=prompt_id, sample_index=sample_index)
    return float(right)


def slow(text, ground_truth, **info):
    """Every call takes 0.5 s: twelve in a row on one worker wait 5.5 s in the queue, each within the limit."""
    time.sleep(0.5)
    return 1.0


def config(tiny_model_dir, **kw) -> RolloutConfig:
    return RolloutConfig(model=str(tiny_model_dir), policy="baseline", batch_size=len(PROMPTS),
                         sampling={"n": 3, "max_tokens": 4},
                         engines=[{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine",
                                   "max_model_len": 256}], **kw)


@requires_torch
@pytest.mark.parametrize("executor", ["thread", "process"])
def test_a_reward_past_its_time_limit_fails_its_own_sample_only(tiny_model_dir, executor):
    cfg = config(tiny_model_dir, reward="test_reward_time_limit:hangs", reward_executor=executor,
                 reward_time_limit_s=1.0)
    with RolloutSession(cfg) as session:
        first = session.step(PROMPTS)
        second = session.step(PROMPTS)   # the session goes on: a thread in the held one's place, the worker freed
    for step in (first, second):
        rows = step.table.to_pylist()
        failed = [r for r in rows if r["reward_error"] is not None]
        assert [(r["prompt_id"], r["sample_index"], r["reward"], r["reward_error"]) for r in failed] == \
               [("q1", 0, None, time_limit_error(1.0))]
        assert sorted(r["reward"] for r in rows if r["reward_error"] is None) == [1.0] * 11
        assert step.summary["reward_errors"] == 1


@requires_torch
def test_a_reward_using_math_verify_timeouts_keeps_its_time_limit(tiny_model_dir):
    """math-verify's timeout sets and cancels ``signal.alarm``, the timer a worker process's limit used to run on:
    the reward's first check cancelled the limit, and the hang after it ran on forever."""
    pytest.importorskip("math_verify")
    cfg = config(tiny_model_dir, reward="test_reward_time_limit:verifies_then_hangs", reward_executor="process",
                 reward_time_limit_s=1.0)
    with RolloutSession(cfg) as session:
        rows = session.step(PROMPTS).table.to_pylist()
    failed = [(r["prompt_id"], r["sample_index"], r["reward_error"]) for r in rows if r["reward_error"] is not None]
    assert failed == [("q1", 0, time_limit_error(1.0))]
    assert sorted(r["reward"] for r in rows if r["reward_error"] is None) == [1.0] * 11


@requires_torch
@pytest.mark.parametrize("executor", ["thread", "process"])
def test_the_time_limit_counts_from_the_calls_start(tiny_model_dir, executor):
    cfg = config(tiny_model_dir, reward="test_reward_time_limit:slow", reward_executor=executor,
                 reward_workers=1, reward_time_limit_s=5.0)
    with RolloutSession(cfg) as session:
        rows = session.step(PROMPTS).table.to_pylist()
    assert len(rows) == 12 and {r["reward_error"] for r in rows} == {None} and {r["reward"] for r in rows} == {1.0}


def test_the_time_limit_is_a_positive_number_of_seconds():
    assert RolloutConfig().reward_time_limit_s is None
    with pytest.raises(ValueError, match="reward_time_limit_s"):
        RolloutConfig(reward_time_limit_s=0)


@requires_torch
def test_pdsr_rollout_reward_time_limit_flag(tmp_path, tiny_model_dir):
    import pyarrow.parquet as pq

    from cli_checks import fake_rollout, invoke, write_jsonl

    prompts = write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    out = tmp_path / "o.parquet"
    r = invoke(*fake_rollout(tmp_path, tiny_model_dir), "--data", prompts, "--out", out,
               "--reward", "test_reward_time_limit:hangs", "--reward-time-limit", "1")
    assert r.exit_code == 0, r.output
    rows = pq.read_table(out).to_pylist()
    assert [(x["prompt_id"], x["sample_index"], x["reward_error"]) for x in rows if x["reward_error"]] == \
           [("q1", 0, time_limit_error(1.0))]


def test_a_late_signal_from_an_earlier_calls_watchdog_fails_no_later_call():
    """A watchdog that fires as its call returns sends its signal anyway; arriving in the next call (here: sent
    from inside it), it must not end that call, which its own watchdog has not timed out."""
    import os
    import signal

    from pdsr_sdk.rollout import reward_runner

    def stale(text, ground_truth, **info):
        os.kill(os.getpid(), getattr(signal, reward_runner.LIMIT_SIGNAL))
        time.sleep(0.05)   # the handler runs here
        return 1.0

    previous = signal.getsignal(getattr(signal, reward_runner.LIMIT_SIGNAL))
    try:
        scored = reward_runner._score_limited(stale, "4", "4", {}, 30.0)
    finally:
        signal.signal(getattr(signal, reward_runner.LIMIT_SIGNAL), previous)
    assert (scored.reward, scored.error) == (1.0, None)
