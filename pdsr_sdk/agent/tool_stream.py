"""Hermes tool calls read as a turn's text grows, for ``pdsr serve``'s streams: each call's name once it is known,
then its arguments in fragments, in the OpenAI API's ``delta.tool_calls`` shapes (as vLLM's server streams them).

A call is read as :func:`~pdsr_sdk.agent.tools.parse_tool_calls` reads it once closed (each ``<tool_call>`` on its
own), and what is sent is only what no later text can change:

- the call's first delta (``index``, ``id``, ``type: "function"``, ``function: {name, arguments: ""}``) once its text
  is ``{"name": "<name>", "arguments": {`` (the shape a hermes template asks for; JSON whitespace allowed);
- then its arguments as vLLM's tool parsers write the parsed object (:func:`json_text`: the ``arguments`` a request
  without ``stream`` gets), each value once it is complete (a string's characters as they come), so the fragments
  joined are those arguments (:class:`CanonicalJson`);
- a call of another shape (its arguments first) comes whole once its ``</tool_call>`` closes it, and a malformed
  one not at all (its text is the answer's, as without ``stream``); nor does a call whose name holds a lone
  surrogate (:func:`~pdsr_sdk.agent.tools.is_tool_name`), malformed too.

A call whose first delta went out and that then turns out malformed (its JSON breaks, or the turn ends before its
``</tool_call>``; or its arguments repeat a key, whose last value ``json.loads`` keeps) cannot be taken back: the
stream keeps it as sent (:attr:`HermesCallStream.broken`), as vLLM's does."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from pdsr_sdk.agent.tools import SURROGATE, hermes_call, is_tool_name

START, END = "<tool_call>", "</tool_call>"
#: a hermes call's text up to its arguments' ``{``: then its name is known and its arguments have begun
_HEAD = re.compile(r'[ \t\n\r]*\{[ \t\n\r]*"name"[ \t\n\r]*:[ \t\n\r]*("(?:[^"\\]|\\.)*")[ \t\n\r]*,'
                   r'[ \t\n\r]*"arguments"[ \t\n\r]*:[ \t\n\r]*\{')
_WS = " \t\n\r"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
#: the words Python's json reads as values (NaN and the infinities too)
_WORDS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_HEX = "0123456789abcdefABCDEF"
#: what may follow a high surrogate's escape to make a pair with it: a low surrogate's escape, character by character
_LOW = ("\\", "u", "dD", "cdefCDEF", _HEX, _HEX)


def json_text(value: Any) -> str:
    """``value``'s JSON text as vLLM's tool parsers write a call's arguments (``json.dumps(value,
    ensure_ascii=False)``: characters as themselves, control characters escaped), except that a lone surrogate (an
    unpaired ``\\ud83d`` in the model's text) stays escaped: written as itself it could not be encoded as UTF-8,
    and the response could not be sent."""
    return SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))


def _char(c: str) -> str:
    return json_text(c)[1:-1]


def _partial_end(text: str, tag: str) -> int:
    """The length of ``text``'s longest end that ``tag`` starts with (it may become the tag)."""
    return next((k for k in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:k])), 0)


class CanonicalJson:
    """A JSON value's text as ``json_text(json.loads(text))`` writes it, while ``text`` grows: :meth:`feed` takes
    the text so far and returns what it added to :attr:`out` that no continuation can change (a number once a
    delimiter ends it, a word once whole, an object's key once closed; a string's characters as they come, an escaped
    surrogate pair's first half with its second). ``done``: the value closed; ``broken``: the text can no longer be
    JSON as read (or repeats a key) and nothing more is written."""

    def __init__(self) -> None:
        self.out = ""
        self.done = self.broken = False
        self._pos = 0
        self._in_string = False
        self._stack: list[list[Any]] = []   # [kind ("{" or "["), expecting, the object's keys]
        self._expect = "value"

    def feed(self, text: str) -> str:
        start = len(self.out)
        while self._pos < len(text) and not (self.done or self.broken):
            if not (self._string(text) if self._in_string else self._token(text)):
                break
        return self.out[start:]

    def _string(self, text: str) -> bool:
        """Consume a string value's next character (False: wait for more text)."""
        c = text[self._pos]
        if c == '"':
            self.out += '"'
            self._pos += 1
            self._in_string = False
            self._after_value()
        elif c == "\\":
            got = self._escape(text, self._pos)
            if got is None:
                return False
            char, self._pos = got
            if char:
                self.out += _char(char)
        elif ord(c) < 0x20:
            self.broken = True   # json.loads refuses a control character in a string
        else:
            self.out += _char(c)
            self._pos += 1
        return True

    def _escape(self, text: str, at: int) -> tuple[str, int] | None:
        """(the character, where the text goes on) of the escape at ``at``; None: it is not whole yet; ("", at) and
        broken when it is not one JSON has."""
        if at + 1 >= len(text):
            return None
        e = text[at + 1]
        if e in _ESCAPES:
            return _ESCAPES[e], at + 2
        if e == "u":
            digits = text[at + 2:at + 6]
            if len(digits) < 4:
                return None if all(d in _HEX for d in digits) else self._bad(at)
            if all(d in _HEX for d in digits):
                return self._pair(text, at + 6, int(digits, 16))
        return self._bad(at)

    @staticmethod
    def _pair(text: str, at: int, code: int) -> tuple[str, int] | None:
        """The character of a ``\\uXXXX`` escape (``code``) that ends at ``at``: a high surrogate's with the low
        one's escape right after it is the pair's character, as json.loads reads them; None while the text after
        it may still become that escape."""
        if not 0xD800 <= code <= 0xDBFF:
            return chr(code), at
        low = text[at:at + 6]
        if not all(c in allowed for c, allowed in zip(low, _LOW)):
            return chr(code), at   # a lone surrogate (json_text escapes it)
        if len(low) < 6:
            return None
        return chr(0x10000 + ((code - 0xD800) << 10) + int(low[2:], 16) - 0xDC00), at + 6

    def _bad(self, at: int) -> tuple[str, int]:
        self.broken = True
        return "", at

    def _token(self, text: str) -> bool:
        """Consume the next token outside a string (False: wait for more text)."""
        while self._pos < len(text) and text[self._pos] in _WS:
            self._pos += 1
        if self._pos == len(text):
            return False
        c, expect = text[self._pos], self._expect
        if expect == "colon":
            return self._punct(c == ":", ": ", "value")
        if expect == "comma_or_end":
            kind = self._stack[-1][0]
            if c == ",":
                return self._punct(True, ", ", "key" if kind == "{" else "value")
            return self._close(c == ("}" if kind == "{" else "]"))
        if expect in ("key", "key_or_end"):
            if expect == "key_or_end" and c == "}":
                return self._close(True)
            return self._key(text) if c == '"' else self._punct(False, "", "")
        if expect == "value_or_end" and c == "]":
            return self._close(True)
        return self._value(text, c)

    def _punct(self, ok: bool, out: str, expect: str) -> bool:
        if not ok:
            self.broken = True
            return True
        self.out += out
        self._pos += 1
        self._expect = expect
        return True

    def _close(self, ok: bool) -> bool:
        if not ok:
            self.broken = True
            return True
        self.out += "}" if self._stack.pop()[0] == "{" else "]"
        self._pos += 1
        self._after_value()
        return True

    def _key(self, text: str) -> bool:
        end = self._pos + 1
        while end < len(text) and text[end] != '"':
            end += 2 if text[end] == "\\" else 1
        if end >= len(text):
            return False
        try:
            key = json.loads(text[self._pos:end + 1])
        except json.JSONDecodeError:
            self.broken = True
            return True
        keys = self._stack[-1][2]
        if key in keys:
            self.broken = True   # json.loads keeps the last value, where the first stood: not this text's order
            return True
        keys.add(key)
        self.out += json_text(key)
        self._pos = end + 1
        self._expect = "colon"
        return True

    def _value(self, text: str, c: str) -> bool:
        if c in "{[":
            self._stack.append([c, "", set()])
            self.out += c
            self._pos += 1
            self._expect = "key_or_end" if c == "{" else "value_or_end"
            return True
        if c == '"':
            self.out += '"'
            self._pos += 1
            self._in_string = True
            return True
        rest = text[self._pos:self._pos + 9]
        for word in _WORDS:
            if rest.startswith(word):
                self.out += json.dumps(json.loads(word))
                self._pos += len(word)
                self._after_value()
                return True
            if word.startswith(rest):
                return False
        end = self._pos
        while end < len(text) and text[end] in "0123456789+-.eE":
            end += 1
        if end == len(text):
            return False   # more digits may come
        number = text[self._pos:end]
        if end == self._pos or not _NUMBER.fullmatch(number):
            self.broken = True
            return True
        self.out += json.dumps(json.loads(number))
        self._pos = end
        self._after_value()
        return True

    def _after_value(self) -> None:
        if not self._stack:
            self.done = True
        else:
            self._expect = "comma_or_end"


@dataclass
class _Region:
    """One ``<tool_call>``: where its text starts in the turn's, and what of it was sent."""

    body: int
    closed: bool = False
    index: int | None = None          # its index among the stream's calls, once its first delta went out
    name: str = ""
    args: CanonicalJson | None = None
    at: int = 0                       # where its arguments start in its text
    ok: bool = False                  # a well-formed call, sent whole
    arguments: str = ""               # then: its arguments, as sent joined
    seek: int = 0                     # where its </tool_call> may begin


class HermesCallStream:
    """A chat choice's hermes calls as its text grows. :meth:`push` takes the turn's text so far (text no later token
    changes) and returns the ``delta.tool_calls`` entries it made; ``new_id()``: a call's id."""

    def __init__(self, new_id: Callable[[], str]):
        self.new_id = new_id
        self.regions: list[_Region] = []
        self.sent = 0          # the calls whose first delta went out
        self._from = 0         # where the next <tool_call> is looked for

    @property
    def broken(self) -> list[int]:
        """The indexes of the calls sent that are not well-formed calls (as yet: an open one too)."""
        return [r.index for r in self.regions if r.index is not None and not r.ok]

    def calls(self) -> list[tuple[int, str, str]]:
        """(its index in the stream, name, arguments) of each well-formed closed call, in the turn's order."""
        return [(r.index, r.name, r.arguments) for r in self.regions if r.ok and r.index is not None]

    def push(self, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            r = self.regions[-1] if self.regions and not self.regions[-1].closed else None
            if r is None:
                at = text.find(START, self._from)
                if at < 0:
                    self._from = max(self._from, len(text) - len(START) + 1)   # a long turn is not searched again
                    return out
                self.regions.append(_Region(at + len(START)))
                continue
            end = text.find(END, max(r.body, r.seek))
            if end < 0:
                r.seek = len(text) - len(END) + 1
                body = text[r.body:]
                out += self._grow(r, body[:len(body) - _partial_end(body, END)])
                return out
            out += self._grow(r, text[r.body:end])
            out += self._closed(r, text[r.body:end])
            self._from = end + len(END)

    def _grow(self, r: _Region, body: str) -> list[dict[str, Any]]:
        out = []
        if r.index is None:
            head = _HEAD.match(body)
            try:
                name = json.loads(head.group(1)) if head else None
            except json.JSONDecodeError:
                name = None
            if not is_tool_name(name):
                return []   # not text, or a lone surrogate in it: malformed once closed too (its text the content)
            r.index, r.name, r.args, r.at = self.sent, name, CanonicalJson(), head.end() - 1
            self.sent += 1
            out.append({"index": r.index, "id": self.new_id(), "type": "function",
                        "function": {"name": name, "arguments": ""}})
        assert r.args is not None
        more = r.args.feed(body[r.at:])
        if more:
            out.append({"index": r.index, "function": {"arguments": more}})
        return out

    def _closed(self, r: _Region, body: str) -> list[dict[str, Any]]:
        r.closed = True
        call = hermes_call(body)
        if call is None:
            return []
        arguments = json_text(call.arguments)
        if r.index is None:
            r.index, r.ok, r.name, r.arguments = self.sent, True, call.name, arguments
            self.sent += 1
            return [{"index": r.index, "id": self.new_id(), "type": "function",
                     "function": {"name": call.name, "arguments": arguments}}]
        assert r.args is not None
        if call.name != r.name or not arguments.startswith(r.args.out):
            return []   # sent otherwise than it reads now (a repeated key): it stays as sent
        r.ok, r.arguments = True, arguments
        rest = arguments[len(r.args.out):]
        return [{"index": r.index, "function": {"arguments": rest}}] if rest else []
