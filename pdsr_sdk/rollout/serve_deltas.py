"""A streamed choice's text as its tokens arrive (``pdsr serve``, :mod:`pdsr_sdk.rollout.serve_stream`): each delta
is text that no later token can change, so the deltas joined are the start of the text the whole response decodes
to (:meth:`~pdsr_sdk.rollout.serve.ChatServer.text_of`), which the stream's last chunk completes.

Two things hold text back, as vLLM's server does: a token that ends inside a character (a byte-level tokenizer
splits a multi-byte character over tokens; the decoded text then ends in U+FFFD until the rest arrives), and text
that is, or could be the start of, a stop string (the engine ends the response there, and the answer's text ends
before it); a stream with a tool parser holds a tool call's tag so too (the text from it on is the calls':
:func:`close_calls` ends those a hermes stream sent as they were written)."""

from __future__ import annotations

from typing import Any, Sequence

from pdsr_sdk.agent.tool_stream import START, HermesCallStream
from pdsr_sdk.agent.tools import tool_call_marker
from pdsr_sdk.rollout.serve_error import ServeError


class TextDeltas:
    """One choice's text so far. :meth:`push` takes its new token ids and returns the text now stable.

    Decoding only a window of the last tokens keeps each step's cost small on a long response: the window starts
    one delta back (``_start``), so a tokenizer that renders a token by its neighbours (a leading space) decodes it
    as in the whole; the window's text past what its first tokens (up to ``_read``) decoded to is new."""

    def __init__(self, tokenizer: Any, stops: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.ids: list[int] = []
        self.text = ""        # the stable decoded text, stop strings included
        self.sent = 0         # characters of ``text`` returned so far
        self._start = 0       # the window's first token
        self._read = 0        # tokens whose text is in ``text``
        self._head = ""       # the text of ids[_start:_read]

    def push(self, token_ids: Sequence[int]) -> str:
        """Add ``token_ids``; the text they made stable (may be empty)."""
        self.ids.extend(token_ids)
        window = self.tokenizer.decode(self.ids[self._start:], skip_special_tokens=True)
        if len(window) > len(self._head) and window.startswith(self._head) and not window.endswith("\ufffd"):
            self.text += window[len(self._head):]
            self._start, self._read = self._read, len(self.ids)
            self._head = self.tokenizer.decode(self.ids[self._start:], skip_special_tokens=True)
        end = max(self.sent, self._safe_end())
        out, self.sent = self.text[self.sent:end], end
        return out

    def _safe_end(self) -> int:
        """Where the text that no stop string can claim ends: before the first stop string in it, else before its
        longest end that a stop string starts with."""
        text = self.text
        found = [at for at in (text.find(s) for s in self.stops) if at >= 0]
        if found:
            return min(found)
        end = len(text)
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:k]):
                    end = min(end, len(text) - k)
                    break
        return end


def text_holds(tokenizer: Any, tool_parser: str | None, chat: bool, stops: list[str]) -> tuple[bool, list[str]]:
    """Whether a choice's text streams as it comes, and the strings it is held back before (``stops``, and where the
    tool parser's calls begin, :func:`~pdsr_sdk.agent.tools.tool_call_marker`: the text from it on is the calls').
    A parser with no such marker, or a tokenizer that drops it from the text as a special token, holds a chat's
    whole text to its end."""
    if not chat or not tool_parser:
        return True, stops
    marker = tool_call_marker(tool_parser, tokenizer)
    if marker and tokenizer.decode(tokenizer(marker, add_special_tokens=False)["input_ids"],
                                   skip_special_tokens=True) == marker:
        return True, stops + [marker]
    return False, stops


def close_calls(deltas: TextDeltas, calls: HermesCallStream, ids: list[int], index: int, answer: dict[str, Any]
                ) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """A choice's streamed hermes calls at its end, given its last ``ids`` and its ``answer`` (its choice without
    ``stream``): (its whole content, the last ``delta.tool_calls`` entries, its finish). A call already streamed
    that is no call of the answer (:class:`~pdsr_sdk.agent.tool_stream.HermesCallStream`) stays as sent: the
    content ends where the calls began, and a finish ``stop`` is ``tool_calls``, as vLLM's stream's."""
    message = answer["message"]
    deltas.push(ids)
    last = calls.push(deltas.text)
    want = [(call["function"]["name"], call["function"]["arguments"]) for call in message.get("tool_calls") or []]
    got = [(name, arguments) for _, name, arguments in calls.calls()]
    if got != want:
        raise ServeError(500, f"choice {index}: the calls streamed ({got}) are not the answer's ({want}); the "
                              f"tokenizer decodes these tokens otherwise with special tokens than without")
    content = message.get("content") or ""
    if calls.sent and not want:
        content = deltas.text[:deltas.text.find(START)]
    if calls.sent and answer["finish_reason"] == "stop":
        answer = {**answer, "finish_reason": "tool_calls"}
    return content, [last] if last else [], answer
