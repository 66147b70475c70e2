"""What the environment adds after a model turn (pdsr_sdk.agent.render.environment_ids) with the tiny model's ChatML
template, and with templates that do not render the turn's decoded text as it is: the rest of the turn's closing
the model did not sample, then the new messages, whatever the turn's text was."""

from __future__ import annotations

import pytest

from support import requires_torch

pytestmark = requires_torch

#: the tiny model's ChatML template with its content trimmed, as Llama 3's template trims it (`| trim`)
TRIMMING = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOL = [{"role": "tool", "content": "42"}]
AFTER = "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def tok(tiny_model_dir):
    from pdsr_sdk.rollout.data import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def added(tok, content: str, sampled: list[int]) -> str:
    from pdsr_sdk.agent.render import environment_ids

    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]
    return tok.decode(environment_ids(tok, conversation, TOOL, last_turn_ids=sampled), skip_special_tokens=False)


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_a_turn_that_sampled_its_end_gets_the_templates_newline(tok):
    assert added(tok, "hello", ids(tok, "hello") + [tok.eos_token_id]) == "\n" + AFTER


def test_an_empty_turn_gets_the_templates_newline_too(tok):
    """The model sampled <|im_end|> at once: its decoded text is empty, the newline after it is still template."""
    assert added(tok, "", [tok.eos_token_id]) == "\n" + AFTER


def test_a_turn_cut_at_its_limit_is_closed_by_the_environment(tok):
    assert added(tok, "hello", ids(tok, "hello")) == "<|im_end|>\n" + AFTER


def test_a_trimming_template_closes_a_cut_turn_that_ends_in_whitespace(tok):
    """The template renders "hello" for the decoded "hello ": the turn is still closed before the tool's message."""
    tok.chat_template = TRIMMING
    assert added(tok, "hello ", ids(tok, "hello ")) == "<|im_end|>\n" + AFTER
    assert added(tok, "hello \n", ids(tok, "hello \n") + [tok.eos_token_id]) == "\n" + AFTER


#: ChatML that describes its tools in a system message first, as Qwen's template does
TOOLS = ("{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}"
         "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CALCULATOR = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}


def test_tools_in_chat_template_kwargs_reach_the_prompt_and_an_agents_messages(tok, tmp_path):
    """verl's tool_config_path gives the template its tools' schemas; pdsr's data.chat_template_kwargs {'tools':
    [...]} does: the prompt describes them, and a tool's message after a turn is the template's own rendering of
    the whole conversation past that turn."""
    import json

    from pdsr_sdk.agent.render import environment_ids
    from pdsr_sdk.rollout.config import DataConfig
    from pdsr_sdk.rollout.data import load_prompts

    tok.chat_template = TOOLS
    kwargs = {"tools": [CALCULATOR]}
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "What is 6*7?"}) + "\n")
    [record] = load_prompts(DataConfig(chat_template_kwargs=kwargs), tok, path=path)
    assert record.text == ("<|im_start|>system\nTools: calculator <|im_end|>\n<|im_start|>user\nWhat is "
                           "6*7?<|im_end|>\n<|im_start|>assistant\n")
    conversation = [{"role": "user", "content": "What is 6*7?"}, {"role": "assistant", "content": "call"}]
    whole = tok.apply_chat_template(conversation + TOOL, tools=[CALCULATOR], tokenize=False, add_generation_prompt=True)
    got = environment_ids(tok, conversation, TOOL, last_turn_ids=ids(tok, "call") + [tok.eos_token_id],
                          template_kwargs=kwargs)
    assert record.text + "call<|im_end|>" + tok.decode(got) == whole
