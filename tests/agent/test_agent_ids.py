"""Token ids an agent appends (``agent.append(ids=...)``, ``generate(ids=...)``): ids of the vocabulary go into the
trajectory as they are, anything else fails its own sample with an error naming it (fake turn engine)."""

from __future__ import annotations

import numpy as np

from pdsr_sdk.rollout.preflight import model_vocab_size
from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch
from test_agent_session import PROMPTS, config

#: case -> what its agent appends (0, 6, 7: ids of the vocabulary; 5: one past it)
APPENDS = {0: [np.int64(7), 8], 1: [7, -1], 2: "7 8", 3: [7.0], 4: [True], 5: None}


def case(prompt_id: str, index: int) -> int:
    return 4 * int(prompt_id[1:]) + index   # two prompts of 4 samples: cases 0-7


async def appending_agent(agent):
    await agent.generate()
    k = case(agent.prompt_id, agent.sample_index)
    ids = APPENDS.get(k, [np.int64(7), 8]) if k != 5 else [agent.info["extra_info"]["vocab"]]
    await agent.generate(ids=ids, max_tokens=3)
    return 1.0


@requires_torch
def test_ids_out_of_the_vocabulary_fail_their_sample_only(tiny_model_dir):
    """A negative id stopped the whole step (an OverflowError from the tokenizer, deep in the row's decode), one past
    the vocabulary went to the engine (vLLM refuses it), and a float or a string's characters became ids."""
    vocab = model_vocab_size(tiny_model_dir)
    with RolloutSession(config(tiny_model_dir)) as session:
        vocab = max(vocab or 0, len(session.tokenizer))   # as vLLM takes it
        out = session.step([{**p, "extra_info": {"vocab": vocab}} for p in PROMPTS[:2]], agent=appending_agent)
    rows = {case(r["prompt_id"], r["sample_index"]): r for r in out.table.to_pylist()}
    for ok in (rows[0], rows[6], rows[7]):
        env = ok["turns"][1]
        assert ok["error"] is None and ok["reward"] == 1.0
        assert ok["response_token_ids"][env["start_token"]:env["start_token"] + env["num_tokens"]] == [7, 8]
    expect = {1: "ids[1] = -1", 2: "takes a list of token ids, got str '7 8'", 3: "ids[0] = 7.0", 4: "ids[0] = True",
              5: f"ids[0] = {vocab}"}
    for k, what in expect.items():
        row = rows[k]
        assert row["finish_reason"] == "failed" and row["reward"] is None, row
        assert what in row["error"] and "AgentError" in row["error"], row["error"]
        if k != 2:
            assert f"(ints 0 to {vocab - 1})" in row["error"]
        assert [t["role"] for t in row["turns"]] == ["assistant"]   # nothing of it reached the trajectory
    assert out.summary["agent_failed"] == 5
