"""What the environment adds after a model turn with a template that renders a turn otherwise once a message
follows it, as Qwen3's does (an empty reasoning block on the last assistant turn, none on earlier ones): the new
messages' text after the turn as sampled, never an error (pdsr_sdk.agent.render.environment_ids)."""

from __future__ import annotations

import pytest

from support import requires_torch

pytestmark = requires_torch

#: ChatML where the last message, if it is the model's turn after the last user message, gets an empty reasoning
#: block and earlier turns do not: the behaviour of Qwen3's template for a turn without reasoning
REASONING = ("{% set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
             "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
             "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
             "{% if m['role'] == 'assistant' and loop.last and loop.index0 > ns.last_user %}<think>\n\n</think>\n\n"
             "{% endif %}{{ m['content'] }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONVERSATION = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@pytest.fixture
def tok(tiny_model_dir):
    from pdsr_sdk.rollout.data import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def added(tok, new: list[dict], sampled_end: bool) -> str:
    from pdsr_sdk.agent.render import environment_ids

    sampled = tok("hello", add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if sampled_end else [])
    return tok.decode(environment_ids(tok, CONVERSATION, new, last_turn_ids=sampled), skip_special_tokens=False)


@pytest.mark.parametrize("new, text", [
    ([{"role": "tool", "content": "42"}], "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"),
    ([{"role": "user", "content": "more"}], "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"),
])
def test_a_template_that_renders_an_earlier_turn_otherwise_still_gives_the_new_messages(tok, new, text):
    """It was a DataError on every append (the conversation with the new messages did not start with the
    conversation alone: the turn's empty reasoning block went away), so a Qwen3 agent could not append messages."""
    tok.chat_template = REASONING
    assert added(tok, new, sampled_end=True) == "\n" + text
    assert added(tok, new, sampled_end=False) == "<|im_end|>\n" + text   # a turn cut at its limit: closed by it
    # what the template renders for the whole conversation from the new messages on: the same text
    whole = tok.apply_chat_template(CONVERSATION + new, tokenize=False, add_generation_prompt=True)
    assert whole.endswith("hello<|im_end|>\n" + text)
