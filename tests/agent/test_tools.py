"""Tool calls parsed by vLLM's hermes parser, and the example's calculator tool."""

from __future__ import annotations

import sys

import pytest

from support import ROOT, requires_vllm

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@requires_vllm
def test_hermes_calls_parse_and_malformed_ones_do_not_count(tiny_model_dir):
    from pdsr_sdk.agent import ToolCall, parse_tool_calls, tool_parser_names
    from pdsr_sdk.errors import ConfigValueError
    from pdsr_sdk.rollout.data import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    text = ('Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
            '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call><|im_end|>')
    content, calls = parse_tool_calls(text, tok)
    assert content == "Let me compute. "
    assert calls == [ToolCall("calculator", {"expression": "2+3"}), ToolCall("search", {"q": "x"})]
    assert parse_tool_calls("no call here", tok) == ("no call here", [])
    assert parse_tool_calls('<tool_call>{"name": calculator</tool_call>', tok)[1] == []
    assert "hermes" in tool_parser_names()
    with pytest.raises(ConfigValueError, match="not in the installed vLLM"):
        parse_tool_calls(text, tok, "no-such-parser")


CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'


@pytest.mark.parametrize("text, content, names", [
    # a malformed call beside a well-formed one: verl's agent loop runs the well-formed one (vLLM's parser ran none)
    ("a " + CALC + '<tool_call>{"name": calc</tool_call>', "a ", ["calculator"]),
    ('<tool_call>{"arguments": {}}</tool_call>' + CALC, None, ["calculator"]),
    (CALC + '<tool_call>{"name": "search", "arguments": "q"}</tool_call>', None, ["calculator"]),
    # a call the turn's token limit cut before </tool_call> is no call (vLLM's parser took it)
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}', None, []),
    ('x <tool_call>{"name": "calculator", "arguments": "2+3"}</tool_call>', None, []),
    ("line\n<tool_call>\n" + CALC[11:-12] + "\n</tool_call>", "line\n", ["calculator"]),
    # a name holding a lone surrogate escape is malformed (no UTF-8 text holds it); an escaped pair is its character
    ('<tool_call>{"name": "\\ud83d", "arguments": {"expression": "2+3"}}</tool_call>', None, []),
    ('a <tool_call>{"name": "calc\\udc00", "arguments": {}}</tool_call>' + CALC, "a ", ["calculator"]),
    ('<tool_call>{"name": "\\ud83d\\ude00", "arguments": {"expression": "2+3"}}</tool_call>', None, ["\U0001f600"]),
])
def test_hermes_takes_each_well_formed_call_as_verl_does(tiny_model_dir, text, content, names):
    """Each closed <tool_call> is read on its own, as verl's hermes parser reads it: a malformed one (not JSON, no
    name or one with a lone surrogate, arguments not an object) is left out and the others count; an unclosed one is not
    a call."""
    from pdsr_sdk.agent import parse_tool_calls
    from pdsr_sdk.rollout.data import load_tokenizer

    got_content, calls = parse_tool_calls(text, load_tokenizer(tiny_model_dir))
    assert [c.name for c in calls] == names
    assert got_content == (content if calls else text)
    assert all(c.arguments == {"expression": "2+3"} for c in calls)


@requires_vllm
def test_a_name_with_a_lone_surrogate_is_no_call_with_vllms_parsers_either(tiny_model_dir):
    """vLLM's own parsers take such a name as it reads (qwen3_json: '\\ud83d'); parse_tool_calls leaves that call
    out as it does with hermes, so that an agent or pdsr serve never gets a name UTF-8 cannot carry."""
    from pdsr_sdk.agent import parse_tool_calls
    from pdsr_sdk.agent.tools import _parser
    from pdsr_sdk.rollout.data import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    text = 'a <tool_call>{"name": "\\ud83d", "arguments": {}}</tool_call>\n' + CALC
    names = [c.function.name for c in _parser("qwen3_json", tok).extract_tool_calls(text, None).tool_calls]
    assert names == ["\ud83d", "calculator"]   # what vLLM's parser makes of it, the case this guards against
    assert [c.name for c in parse_tool_calls(text, tok, "qwen3_json")[1]] == ["calculator"]


@pytest.mark.parametrize("expression, expect", [
    ("2+3", "5"), ("12*7+3", "87"), ("(1+2)**3", "27"), ("7/2", "3.5"), ("-4 % 3", "2"),
    ("1/0", "error: division by zero"), ("__import__('os')", "error: only numbers and + - * / % ** ( )"),
    ("2**1000", "error: exponent too large"), (None, "error: only numbers and + - * / % ** ( )"),
    ("2+", "error: invalid syntax (<unknown>, line 1)"),
    # each of these raised out of the tool (OverflowError, TypeError), failing the sample, or ran for minutes
    ("2**64", "18446744073709551616"), ("(9**64)**6", "error: result too large"),
    ("1e300*1e300", "error: result too large"),
    ("(((9**64)**64)**64)**64", "error: result too large"), ("(-8)**0.5", "error: not a real number"),
])
def test_calculator(expression, expect):
    from examples.agent_tools import calculate

    assert calculate(expression) == expect
