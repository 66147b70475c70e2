"""Agent functions that misuse the API (fake turn engine, tests/turn_fakes.py): each gets an error naming its
sample or the argument that gave it, and none holds up the step."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from pdsr_sdk.agent import AgentDone
from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch
from test_agent_session import PROMPTS, config


async def retries_after_done(agent):
    """Catches AgentDone and calls generate() again, as a retry loop would: for 4 s of wall time at most (so a run
    that cannot stop it ends), then returns a reward."""
    await agent.generate()
    began, refused = time.monotonic(), 0
    while time.monotonic() - began < 4:
        try:
            await agent.generate(ids=[7])
        except AgentDone:
            refused += 1
    return {"score": 1.0, "refused": refused}


@requires_torch
def test_an_agent_retrying_after_agent_done_fails_at_its_timeout(tiny_model_dir):
    """generate() raised AgentDone without yielding to the event loop, so an agent that retried after it held the
    loop: env_timeout_s could not fire and the run hung (here: 4 s a sample, one after another, then each scored
    1.0)."""
    with RolloutSession(config(tiny_model_dir, agent={"max_turns": 1, "env_timeout_s": 0.5})) as session:
        out = session.step(PROMPTS[:1], agent=retries_after_done)
    for row in out.table.to_pylist():
        assert row["finish_reason"] == "failed" and row["reward"] is None
        assert "agent.env_timeout_s (0.5 s)" in row["error"] and "AgentDone" in row["error"]
    assert out.summary["agent_failed"] == 4


async def numpy_rewards(agent):
    """The reward as numpy computes it (np.mean of float32 scores, an int64 count), or not a number."""
    await agent.generate()
    return [np.float32(0.25), {"score": np.int64(1), "n": np.int64(2)}, "1.0", np.array([1.0, 2.0])][agent.sample_index]


@requires_torch
def test_an_agent_may_return_a_numpy_number(tiny_model_dir):
    """A reward function's numpy score was taken (float()), an agent's was refused: 'the agent returned
    np.float32(0.25); expected None ..., a finite number, or a dict with 'score'', its sample failed. A numpy
    field beside the score was written as its text ('2')."""
    with RolloutSession(config(tiny_model_dir)) as session:
        out = session.step(PROMPTS[:1], agent=numpy_rewards)
    rows = {row["sample_index"]: row for row in out.table.to_pylist()}
    assert (rows[0]["reward"], rows[0]["error"]) == (0.25, None)
    assert (rows[1]["reward"], rows[1]["reward_extra"], rows[1]["error"]) == (1.0, {"n": 2}, None)
    for k, got in ((2, "'1.0'"), (3, "array([1., 2.])")):
        assert rows[k]["finish_reason"] == "failed" and rows[k]["error"].startswith(f"the agent returned {got}; ")


async def names_its_tool(agent):
    await agent.generate()
    if agent.sample_index == 3:
        agent.append(tool_name="calc")   # neither messages nor ids
    name = {"calc": 1} if agent.sample_index == 0 else "calc"
    agent.append([{"role": "tool", "content": "1"}], tool_name=name)
    await agent.generate(max_tokens=2)


@requires_torch
def test_a_tool_name_that_is_not_text_fails_its_sample(tiny_model_dir):
    """A tool_name that was not a string went into the trajectory's turns, and writing the step's rows stopped the
    whole step with pyarrow's 'ArrowTypeError: Expected bytes, got a 'dict' object'."""
    with RolloutSession(config(tiny_model_dir)) as session:
        out = session.step(PROMPTS[:1], agent=names_its_tool)
    rows = {row["sample_index"]: row for row in out.table.to_pylist()}
    assert rows[0]["finish_reason"] == "failed"
    assert rows[0]["error"] == ("the agent raised AgentError: sample q0/0: append: tool_name must be a string (or "
                                "None), got dict {'calc': 1}")
    # this one named no sample
    assert rows[3]["error"] == "the agent raised AgentError: sample q0/3: append: give messages or ids (one of them)"
    for k in (1, 2):
        assert rows[k]["error"] is None and [t["tool_name"] for t in rows[k]["turns"]] == [None, "calc", None]


async def odd_fields(agent):
    await agent.generate()
    return [{"score": 1.0, (1, 2): 3}, {"score": 1.0, "tool": object}, {"score": 1.0, "n": 2}, None][agent.sample_index]


@requires_torch
def test_a_returned_dict_whose_fields_are_not_json_fails_its_sample(tiny_model_dir):
    """Fields json.dumps cannot write (a tuple key) stopped the whole step where the rewards were gathered:
    'TypeError: keys must be str, int, float, bool or None, not tuple' from json's encoder."""
    with RolloutSession(config(tiny_model_dir)) as session:
        out = session.step(PROMPTS[:1], agent=odd_fields)
    rows = {row["sample_index"]: row for row in out.table.to_pylist()}
    assert rows[0]["finish_reason"] == "failed" and rows[0]["error"] == (
        "the agent returned a dict whose other fields cannot be written as JSON (reward_extra): keys must be str, "
        "int, float, bool or None, not tuple")
    # the rows' fields differ, so each row's reward_extra is JSON text; a value JSON lacks is str()'s
    assert (rows[1]["reward"], json.loads(rows[1]["reward_extra"])) == (1.0, {"tool": "<class 'object'>"})
    assert (rows[2]["reward"], json.loads(rows[2]["reward_extra"])) == (1.0, {"n": 2})


@pytest.mark.parametrize("got, says", [
    ({"score": None}, "the agent returned a dict whose 'score' is None; expected a finite number (return None, not "
                      "a dict, for the reward function to score the trajectory)"),
    ({"score": "1", "n": 2}, "the agent returned a dict whose 'score' is '1'; expected a finite number"),
    (float("nan"), "the agent returned nan; expected None (the reward function scores the trajectory)"),
])
def test_a_returned_score_that_is_not_a_number_is_named(got, says):
    """{'score': None} read 'the agent returned None; expected None (the reward function scores the trajectory),
    ...': the dict's None was reported as what the agent returned, which the message itself allows."""
    from pdsr_sdk.agent.runner import AgentRunner

    runner = AgentRunner.__new__(AgentRunner)   # _record reads only the outcomes it fills
    runner.outcomes = {}
    with pytest.raises(ValueError) as caught:
        runner._record(object(), got)
    assert str(caught.value).startswith(says)
