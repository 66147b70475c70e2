"""Several messages appended before one model turn (two tool calls in a turn, a tool's result and a user's nudge):
the trajectory holds what the chat template renders for the whole conversation, one assistant header after the
last message (fake turn engine)."""

from __future__ import annotations

from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch
from test_agent_session import PROMPTS, config

RESULTS = [{"role": "tool", "content": "42"}, {"role": "tool", "content": "43"}]
NUDGE = [{"role": "user", "content": "And so?"}]


async def two_tool_calls(agent):
    """Two tool results appended one by one and a user's message with the next turn (one block), then ids and a
    message."""
    await agent.generate()
    first = agent.append(RESULTS[:1], tool_name="calc")
    both = agent.append(RESULTS[1:], tool_name="calc")
    assert agent.ids[-len(both):] == both and len(both) > len(first)   # the second call's ids are the block's
    await agent.generate(NUDGE)
    agent.append(ids=[7, 8])
    agent.append(NUDGE)
    await agent.generate()
    return 1.0


@requires_torch
def test_messages_appended_one_by_one_are_the_templates_rendering_of_them_all(tiny_model_dir):
    """The second of two appends before a turn was rendered after the first one's assistant header: the model went
    on from "<|im_start|>assistant\\n<|im_start|>tool\\n43...", a context the template never renders."""
    with RolloutSession(config(tiny_model_dir)) as session:
        out = session.step(PROMPTS[:1], agent=two_tool_calls)
        tok = session.tokenizer
    for s in out.samples:
        assert s.error is None and [t.role for t in s.turns] == ["assistant", "environment"] * 2 + ["assistant"]
        spans = [s.token_ids[t.start_token:t.start_token + t.num_tokens] for t in s.turns]
        first_turn = tok.decode(spans[0], skip_special_tokens=False)
        assert first_turn.endswith("<|im_end|>")   # the fake model ends its turns with <|im_end|>
        # independent reference: the template's rendering of the whole conversation up to the second turn
        conversation = [*s.group.messages, {"role": "assistant", "content": first_turn[:-len("<|im_end|>")]},
                        *RESULTS, *NUDGE]
        whole = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        assert tok.decode(s.group.prompt_token_ids + spans[0] + spans[1], skip_special_tokens=False) == whole
        # ids, then a message: the ids as they are, then the message after them (the ids stand for the closing)
        assert spans[3][:2] == [7, 8]
        assert tok.decode(spans[3][2:], skip_special_tokens=False) == \
            "<|im_start|>user\nAnd so?<|im_end|>\n<|im_start|>assistant\n"


async def two_tools(agent):
    """Two tools' results appended before one turn, a third append of the first tool again."""
    await agent.generate()
    agent.append(RESULTS[:1], tool_name="calc")
    agent.append(RESULTS[1:], tool_name="search")
    agent.append(NUDGE, tool_name="calc")
    await agent.generate()
    return 1.0


@requires_torch
def test_a_span_of_several_tools_names_each_once(tiny_model_dir):
    """The span's tool_name was the last append's ('search' lost 'calc'); it names each tool once, in order."""
    with RolloutSession(config(tiny_model_dir)) as session:
        out = session.step(PROMPTS[:1], agent=two_tools)
    for row in out.table.to_pylist():
        assert row["error"] is None and [t["tool_name"] for t in row["turns"]] == [None, "calc,search", None]
