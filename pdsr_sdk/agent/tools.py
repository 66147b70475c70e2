"""Tool calls in a model turn's text, parsed by the chat template's convention with vLLM's own tool parsers.

``hermes`` (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) is the convention of ChatML models
(Qwen, SmolLM2, Hermes); any parser name the installed vLLM registers works (``tool_parser_names()``).
Only well-formed calls count: a malformed one (a name holding a lone surrogate escape, ``"\\ud83d"``, too) is not a
call, and the turn's other calls still are.

``hermes`` is read here, call by call, as verl's agent loop reads it: vLLM's hermes parser drops every call of a
turn when one is malformed, and takes a ``<tool_call>`` the turn's token limit cut before its ``</tool_call>``.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pdsr_sdk.errors import ConfigValueError


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def truncate_tool_response(text: str, max_chars: int, side: str) -> str:
    """``text`` cut to ``max_chars`` characters when longer, as verl's agent loop cuts a tool's response: ``side``
    'left' keeps the start, 'right' the end, 'middle' half of each; a mark says where it was cut."""
    if len(text) <= max_chars:
        return text
    if side == "left":
        return text[:max_chars] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-max_chars:]
    half = max_chars // 2
    return text[:half] + "...(truncated)..." + (text[-half:] if half else "")


def tool_parser_names() -> list[str]:
    """The tool parsers the installed vLLM has."""
    from vllm.tool_parsers import ToolParserManager

    return sorted(ToolParserManager.list_registered())


def check_tool_parser(name: str | None, setting: str = "tool_parser") -> None:
    """A tool parser the installed vLLM lacks is a ConfigValueError naming ``setting`` (the flag or argument that gave
    it), raised before a server starts, not when a chat request's answer is parsed. ``hermes`` is pdsr's own: no
    vLLM."""
    if name is None or name == "hermes":
        return
    try:
        names = tool_parser_names()
    except ImportError:
        raise ConfigValueError(f"{setting} {name!r}: a parser other than hermes is the installed vLLM's, and vLLM's "
                          f"tool parsers cannot be imported here (is vLLM installed?)") from None
    if name not in names:
        raise ConfigValueError(f"{setting} {name!r}: not a tool parser of the installed vLLM; it has: "
                               f"{', '.join(names)}")


@lru_cache(maxsize=8)
def _parser(name: str, tokenizer: Any) -> Any:
    from vllm.tool_parsers import ToolParserManager

    try:
        cls = ToolParserManager.get_tool_parser(name)
    except KeyError:
        raise ConfigValueError(f"tool parser {name!r} is not in the installed vLLM; it has: "
                               f"{', '.join(tool_parser_names())}") from None
    return cls(tokenizer)


#: the parsers whose answer's content is the turn's text before a marker (its whole text without one), and the
#: parser's attribute naming that marker (tests/agent/test_tool_markers.py checks each with the installed vLLM)
MARKER_ATTRIBUTES = {"qwen3_json": "tool_call_start_token", "longcat": "tool_call_start_token",
                     "deepseek_v3": "tool_calls_start_token", "deepseek_v31": "tool_calls_start_token"}


def tool_call_marker(parser: str, tokenizer: Any) -> str | None:
    """Where a turn's tool calls begin for ``parser``: the text before it is the answer's content. None where pdsr
    knows no such place: a parser with no marker (llama3_json, pythonic: a call is the text itself), one whose
    content is not the text before its marker (ernie45, dots, functiongemma strip it), one not checked, or one the
    tokenizer cannot build (its marker is not in the vocabulary)."""
    if parser == "hermes":
        return "<tool_call>"
    attribute = MARKER_ATTRIBUTES.get(parser)
    if attribute is None:
        return None
    try:
        marker = getattr(_parser(parser, tokenizer), attribute, None)
    except Exception:   # noqa: BLE001 - vLLM's parsers refuse a tokenizer without their tokens in several ways
        return None
    return marker if isinstance(marker, str) and marker else None


#: one closed hermes call; its body is a JSON object {"name": ..., "arguments": {...}}
HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


#: a surrogate code point: in text json.loads read, a lone half of a pair (``"\\ud83d"``), which no UTF-8 text holds
SURROGATE = re.compile("[\ud800-\udfff]")


def is_tool_name(name: object) -> bool:
    """Whether ``name`` may be a call's name: text without a lone surrogate. One with it is a malformed call, as
    no answer (UTF-8 JSON) could carry it and no agent could look its tool up."""
    return isinstance(name, str) and not SURROGATE.search(name)


def hermes_call(body: str) -> ToolCall | None:
    """The call a closed hermes ``<tool_call>``'s ``body`` (its text between the tags) is; None when malformed."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if isinstance(call, dict) and is_tool_name(call.get("name")) and isinstance(call.get("arguments"), dict):
        return ToolCall(call["name"], call["arguments"])
    return None


def _hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    calls = [call for call in map(hermes_call, HERMES_CALL.findall(text)) if call is not None]
    if not calls:
        return text, []
    return text[:text.find("<tool_call>")] or None, calls


def parse_tool_calls(text: str, tokenizer: Any, parser: str = "hermes") -> tuple[str | None, list[ToolCall]]:
    """(the text before the calls, the well-formed calls) of one model turn's ``text`` (decoded with special
    tokens, as vLLM's parsers expect), parsed by vLLM's ``parser``; ``hermes`` here, each closed call on its own
    (see the module). With no call, the text is the whole ``text``."""
    if parser == "hermes":
        return _hermes(text)
    quiet = logging.getLogger("vllm.tool_parsers")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)   # a malformed call is the model's business, not an error to log
    try:
        got = _parser(parser, tokenizer).extract_tool_calls(text, None)
    finally:
        quiet.setLevel(level)
    if not got.tools_called:
        return got.content, []
    calls = []
    for call in got.tool_calls:
        if not is_tool_name(call.function.name):
            continue
        try:
            args = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError:
            continue
        if isinstance(args, dict):
            calls.append(ToolCall(call.function.name, args))
    return got.content, calls
