"""What generate() returns (docs/agents.md: TurnResult), against the trajectory row on the fake turn engine
(tests/turn_fakes.py): the sampled ids and their log-probs as the row holds them, text decoded without special
tokens (a sampled end of turn is not in it), the turn's finish reason and its number."""

from __future__ import annotations

from transformers import AutoTokenizer

from pdsr_sdk.agent import AgentDone
from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch
from test_agent_session import PROMPTS, config

SEEN: dict[str, list] = {}


async def recorder(agent):
    key = f"{agent.prompt_id}/{agent.sample_index}"
    SEEN[key] = [await agent.generate()]
    try:
        while True:
            SEEN[key].append(await agent.generate(ids=[7, 8]))
    except AgentDone:
        return 0.0


@requires_torch
def test_each_turn_result_is_the_rows_span(tiny_model_dir):
    SEEN.clear()
    with RolloutSession(config(tiny_model_dir, agent={"max_turns": 3, "turn_max_tokens": 10})) as session:
        out = session.step(PROMPTS, agent=recorder)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    reasons = set()
    for row in out.table.to_pylist():
        model = [t for t in row["turns"] if t["role"] == "assistant"]
        results = SEEN[f"{row['prompt_id']}/{row['sample_index']}"]
        assert len(results) == len(model) == 3
        for k, (got, t) in enumerate(zip(results, model)):
            span = slice(t["start_token"], t["start_token"] + t["num_tokens"])
            ids = row["response_token_ids"][span]
            assert got.token_ids == ids and got.logprobs == row["response_logprobs"][span]
            assert got.text == tok.decode(ids, skip_special_tokens=True)
            assert got.finish_reason == t["finish_reason"] and got.turn == k
            if got.finish_reason == "stop":   # the sampled end of turn: in the ids, not in the text
                assert ids[-1] == tok.convert_tokens_to_ids("<|im_end|>") and "<|im_end|>" not in got.text
                assert tok.decode(ids, skip_special_tokens=False).endswith("<|im_end|>")
            reasons.add(got.finish_reason)
    assert reasons == {"stop", "length"}   # turn_max_tokens 10 cuts the longer turns of the fake engine
