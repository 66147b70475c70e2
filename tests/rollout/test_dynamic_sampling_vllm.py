"""On-policy dynamic sampling (``filter_groups`` with ``max_staleness: 0``) in the SDK step on the session's shared
real vLLM engines (tests/conftest.py): a group in flight, not taken, when a step ends is dropped (docs/partial-
rollout.md, "Dynamic sampling (DAPO)"): returned in ``StepResult.dropped`` and counted, its samples stopped where
they were, its prompt not tried again, and the next step runs on. The arithmetic of filtering and launching:
tests/rollout/test_dynamic_sampling.py (fake engines)."""

from __future__ import annotations

import threading

import pytest

from support import WAIT_S, requires_vllm, run_on

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s

#: forced lengths (ignore_eos): "a" and "c" pass the filter and are short; "b" is long and never passes
LENGTHS = {"a": [4, 6], "b": [200, 180], "c": [5, 3]}
#: "b"'s reward waits for this, so that it cannot be judged (and filtered) before its step ends, however fast
RELEASE = threading.Event()


def reward(text, ground_truth, *, prompt_id, sample_index, **info):
    if prompt_id == "b":
        RELEASE.wait(WAIT_S)
        return 1.0
    return float(sample_index)   # 0 and 1: the group passes the zero-variance filter


def test_a_group_not_taken_when_an_on_policy_step_ends_is_dropped_and_not_tried_again(engine_loop, engines,
                                                                                      tiny_model_dir):
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.data import PromptRecord
    from pdsr_sdk.rollout.session import RolloutSession

    def record(pid):
        return PromptRecord(prompt_id=pid, text=pid, token_ids=[11, 12, 13, len(pid)], target_lengths=LENGTHS[pid])

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="baseline", batch_size=1, over_provision=1.0,
                        max_staleness=0, filter_groups={"kind": "zero-variance"}, reward_workers=4,
                        sampling={"n": 2, "max_tokens": 256, "ignore_eos": True})

    async def scenario():
        async with RolloutSession(cfg, engines=engines, reward=reward) as session:
            first = await session.astep([record("a"), record("b")])   # both in flight (ceil(1 x 2))
            RELEASE.set()
            second = await session.astep([record("c")])
            return first, second, session.carried()

    try:
        first, second, carried = run_on(engine_loop, scenario())
    finally:
        RELEASE.set()
    assert [g.prompt_id for g in first.groups] == ["a"] and [g.prompt_id for g in first.dropped] == ["b"]
    assert first.summary["dropped_groups"] == 1 and first.summary["filtered_groups"] == 0
    for s in first.dropped[0].samples:   # stopped where it was (or finished, not taken): its tokens its own
        assert s.num_generated == len(s.token_ids) == len(s.logprobs) <= LENGTHS["b"][s.index]
        assert s.finish_reason in ("dropped", "length") and all(lp <= 0.0 for lp in s.logprobs)
    assert first.summary["dropped_tokens"] == sum(s.num_generated for s in first.dropped[0].samples)
    for out, pid in ((first, "a"), (second, "c")):
        rows = out.table.to_pylist()
        assert sorted((r["prompt_id"], r["response_length"]) for r in rows) == [(pid, n) for n in sorted(LENGTHS[pid])]
        assert [r["reward"] for r in sorted(rows, key=lambda r: r["sample_index"])] == [0.0, 1.0]
    # "b" is not tried again: the second step has only "c", nothing is left in flight
    assert [g.prompt_id for g in second.groups] == ["c"] and not second.dropped and not second.filtered
    assert not carried
