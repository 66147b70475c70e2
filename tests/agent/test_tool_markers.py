"""Where a tool parser's calls begin (:func:`~pdsr_sdk.agent.tools.tool_call_marker`), which ``pdsr serve``'s streams
send a chat's text up to: for each parser pdsr names a marker for, the installed vLLM's parser reads a turn with a
call as the text before the marker (its content) and the call, and a turn without it as its whole text."""

from __future__ import annotations

import json

import pytest

from pdsr_sdk.agent import parse_tool_calls
from pdsr_sdk.agent.tools import MARKER_ATTRIBUTES, tool_call_marker
from support import requires_vllm

pytestmark = requires_vllm

DS = {t: f"<｜{t}｜>" for t in ("tool▁calls▁begin", "tool▁calls▁end", "tool▁call▁begin", "tool▁call▁end",
                                 "tool▁sep")}
#: a turn's call in each parser's own format, for a call of f with {"x": 1}
CALLS = {
    "hermes": '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
    "qwen3_json": '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
    "longcat": '<longcat_tool_call>{"name": "f", "arguments": {"x": 1}}</longcat_tool_call>',
    "deepseek_v3": (DS["tool▁calls▁begin"] + DS["tool▁call▁begin"] + "function" + DS["tool▁sep"]
                    + 'f\n```json\n{"x": 1}\n```' + DS["tool▁call▁end"] + DS["tool▁calls▁end"]),
    "deepseek_v31": (DS["tool▁calls▁begin"] + DS["tool▁call▁begin"] + "f" + DS["tool▁sep"] + '{"x": 1}'
                     + DS["tool▁call▁end"] + DS["tool▁calls▁end"]),
}
BEFORE = "Sure, let me see.\n "   # content whose end a parser that strips it would change


@pytest.fixture
def tok(tiny_model_dir):
    """The tiny model's tokenizer with DeepSeek's tool tokens as plain tokens (its parsers look them up)."""
    from pdsr_sdk.rollout.data import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    tok.add_tokens(list(DS.values()))
    return tok


def test_every_parser_with_a_marker_is_checked():
    assert set(CALLS) == set(MARKER_ATTRIBUTES) | {"hermes"}


@pytest.mark.parametrize("parser", sorted(CALLS))
def test_a_parsers_content_is_the_text_before_its_marker(tok, parser):
    marker = tool_call_marker(parser, tok)
    text = BEFORE + CALLS[parser] + "\nafter"
    assert marker and text.index(marker) == len(BEFORE)
    content, calls = parse_tool_calls(text, tok, parser)
    assert (content, [(c.name, json.dumps(c.arguments)) for c in calls]) == (BEFORE, [("f", '{"x": 1}')])
    # no marker: no call, the whole text
    assert parse_tool_calls(BEFORE + "no call", tok, parser) == (BEFORE + "no call", [])


@pytest.mark.parametrize("parser", ["llama3_json", "pythonic", "ernie45", "mistral", "no_such_parser"])
def test_a_parser_with_no_marker_or_another_content_rule_has_none(tok, parser):
    """llama3_json and pythonic read a call from the text itself, ernie45 strips the content's newlines."""
    assert tool_call_marker(parser, tok) is None


def test_a_tokenizer_the_parser_refuses_has_no_marker(tiny_model_dir):
    from pdsr_sdk.rollout.data import load_tokenizer

    assert tool_call_marker("deepseek_v3", load_tokenizer(tiny_model_dir)) is None
