"""Hermes calls read as a turn's text grows (:mod:`pdsr_sdk.agent.tool_stream`), the text fed one character more
at a time: what is sent joined is what ``json.dumps(json.loads(...), ensure_ascii=False)`` (as vLLM's tool parsers
write arguments) and ``parse_tool_calls`` make of the whole text, each piece sent only once no later text can change
it."""

from __future__ import annotations

import itertools
import json

import pytest

from pdsr_sdk.agent import parse_tool_calls
from pdsr_sdk.agent.tool_stream import CanonicalJson, HermesCallStream, json_text

VALUES = [
    '{}',
    '{"a": 1}',
    '{ "x" :[1 ,2.50, -0, 1e5, 1E-2, -0.0, 12345678901234567890, true,false , null, NaN, -Infinity, Infinity,'
    ' {}, []] ,"s":"h\\u00e9\\"\\\\\\/\\n\\t\\ud83d\\ude00 \U0001f600 é"}',
    '{"nested": {"a": {"b": [[], [{}], [[1]]]}}, "z": -12.0e+3}',
    '{"k\\u00e9y": "v", "": ""}',
    '\n{\n  "code": "print(\\"hi\\")\\nx = [1, 2]"\n}',
    # non-ASCII keys and values, raw and escaped: CJK, emoji (an escaped surrogate pair is the emoji), control
    # characters (escaped as json.dumps escapes them)
    '{"城市": "北京", "\\u5929\\u6c14": "\\u6674", "emoji": "\U0001f600\\ud83d\\ude00", "\\ud83c\\udf89": ["é"]}',
    '{"ctl": "a\\u0001\\u001f\\u007f\\u2028b", "two": "\\ud83d\\ude00\\ud83d\\ude01"}',
]
#: escaped lone surrogates (an unpaired half, a half before a non-half, two highs then a pair, a low alone): what
#: json.dumps(ensure_ascii=False) writes as itself, which UTF-8 cannot encode, stays escaped
LONE = [
    ('{"a": "x\\ud83dy"}', '{"a": "x\\ud83dy"}'),
    ('{"\\udc00": "\\ud83d\\u00e9"}', '{"\\udc00": "\\ud83dé"}'),
    ('{"a": "\\ud83d\\ud83d\\ude00\\ude00"}', '{"a": "\\ud83d\U0001f600\\ude00"}'),
    ('{"a": ["\\ud83d", "\\udfff"]}', '{"a": ["\\ud83d", "\\udfff"]}'),
]


def fed(text: str) -> tuple[CanonicalJson, list[str]]:
    """The writer after ``text`` came one character at a time, and what each step wrote."""
    writer = CanonicalJson()
    return writer, [writer.feed(text[:i]) for i in range(1, len(text) + 1)]


@pytest.mark.parametrize("text", VALUES)
def test_arguments_are_written_as_json_dumps_writes_them_as_they_come(text):
    want = json.dumps(json.loads(text), ensure_ascii=False)
    assert json_text(json.loads(text)) == want
    writer, steps = fed(text)
    assert writer.done and not writer.broken and "".join(steps) == writer.out == want
    # written as it came: each prefix of the text wrote a prefix of the answer, and a string's characters came
    # before the string closed
    assert all(want.startswith("".join(steps[:i])) for i in range(len(steps)))
    if '"s":"h' in text:
        assert "".join(steps[:text.index('"s":"h') + 7]).endswith('"s": "h')


@pytest.mark.parametrize("text, written", [
    ('{"a": 1, "a": 2}', '{"a": 1, '),     # a repeated key: json.loads keeps the last value
    ('{"a": 01}', '{"a": '),
    ('{"a" 1}', '{"a"'),
    ('{"a": tru}', '{"a": '),
    ('{"a": "x\ny"}', '{"a": "x'),          # a raw newline in a string
    ('{"a": "\\q"}', '{"a": "'),
    ('{"a": 1,}', '{"a": 1, '),
])
def test_text_that_cannot_be_json_stops_the_writing_where_it_breaks(text, written):
    writer, steps = fed(text)
    assert writer.broken and not writer.done and writer.out == "".join(steps) == written
    if text.count('"a"') == 2:
        assert json.dumps(json.loads(text)) == '{"a": 2}'   # not what the text's order writes
    else:
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


@pytest.mark.parametrize("text, want", LONE)
def test_a_lone_surrogate_stays_escaped_where_json_dumps_would_write_what_utf8_cannot_encode(text, want):
    with pytest.raises(UnicodeEncodeError):
        json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")
    writer, steps = fed(text)
    assert writer.done and "".join(steps) == writer.out == json_text(json.loads(text)) == want
    assert json.loads(want) == json.loads(text) and want.encode("utf-8")
    assert all(want.startswith("".join(steps[:i])) for i in range(len(steps)))


def test_an_escaped_pairs_first_half_waits_for_what_follows_it():
    writer = CanonicalJson()
    assert writer.feed('{"a": "\\ud83d') == '{"a": "'
    assert writer.feed('{"a": "\\ud83d\\uDE0') == ""     # may still be the pair's second half
    assert writer.feed('{"a": "\\ud83d\\uDE00') == "\U0001f600"
    assert writer.feed('{"a": "\\ud83d\\uDE00\\ud83d\\u') == ""
    assert writer.feed('{"a": "\\ud83d\\uDE00\\ud83d\\u0') == "\\ud83d"   # not a low half: alone
    assert writer.feed('{"a": "\\ud83d\\uDE00\\ud83d\\u00e9"}') == 'é"}' and writer.done


def test_a_number_waits_for_its_end_and_a_key_for_its_quote():
    writer = CanonicalJson()
    assert writer.feed('{"ke') == "{"
    assert writer.feed('{"key": 12') == '"key": '
    assert writer.feed('{"key": 12.5') == ""
    assert writer.feed('{"key": 12.5e1 ') == "125.0"
    assert writer.feed('{"key": 12.5e1 }') == "}" and writer.done


CALC = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7", "digits": [1, 2]}}\n</tool_call>'
CLOCK = '<tool_call>{"arguments": {}, "name": "clock"}</tool_call>'   # its name after its arguments
BAD_JSON = '<tool_call>{"name": "calculator", arguments: {}}</tool_call>'
LATE = '<tool_call>{"name": "late", "arguments": {"x": 1}} and more</tool_call>'   # malformed after its name
CUT = '<tool_call>{"name": "cut", "arguments": {"y": "ab'


def streamed(text: str) -> tuple[HermesCallStream, list[tuple[int, dict]]]:
    """The reader after ``text`` came a character at a time, and each entry it made with the step it came at."""
    ids = itertools.count()
    reader = HermesCallStream(lambda: f"call-{next(ids)}")
    return reader, [(i, e) for i in range(1, len(text) + 1) for e in reader.push(text[:i])]


def joined(entries: list[dict]) -> dict[int, dict]:
    """The calls as a client joins the entries: by index, strings concatenated."""
    calls: dict[int, dict] = {}
    for e in entries:
        call = calls.setdefault(e["index"], {"id": "", "name": "", "arguments": ""})
        call["id"] += e.get("id", "")
        call["name"] += e["function"].get("name", "")
        call["arguments"] += e["function"]["arguments"]
    return calls


def test_calls_are_sent_as_parse_tool_calls_reads_them_the_name_first(tiny_model_dir):
    from pdsr_sdk.rollout.data import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    text = "Let me look." + CALC + "\n" + BAD_JSON + CLOCK + LATE + CUT
    reader, entries = streamed(text)
    _, calls = parse_tool_calls(text, tok, "hermes")
    got = joined([e for _, e in entries])
    assert [(got[i]["name"], got[i]["arguments"]) for i, _, _ in reader.calls()] == \
        [(c.name, json.dumps(c.arguments, ensure_ascii=False)) for c in calls] == \
        [("calculator", '{"expression": "6*7", "digits": [1, 2]}'), ("clock", "{}")]
    assert [(name, arguments) for _, name, arguments in reader.calls()] == [(c.name, json_text(c.arguments))
                                                                           for c in calls]
    # the calculator's name once its arguments began, its arguments as they came, before its </tool_call>
    first = [(at, e) for at, e in entries if e["index"] == 0]
    assert first[0] == (len("Let me look." + CALC.split("{\"expression")[0]) + 1,   # its arguments' "{"
                        {"index": 0, "id": "call-0", "type": "function",
                         "function": {"name": "calculator", "arguments": ""}})
    assert all(set(e) == {"index", "function"} and set(e["function"]) == {"arguments"} for _, e in first[1:])
    assert len(first) > 5 and first[-1][0] < len("Let me look." + CALC)
    # the clock, whose arguments come first, whole when its call closed; the malformed call not at all
    clock = [(at, e) for at, e in entries if e["index"] == 1]
    end = text.index(CLOCK) + len(CLOCK)
    assert clock == [(end, {"index": 1, "id": "call-1", "type": "function",
                            "function": {"name": "clock", "arguments": "{}"}})]
    # a call sent that turned out malformed, and one the text ended in, stay as sent
    assert reader.broken == [2, 3] and got[2]["arguments"] == '{"x": 1}' and got[3]["arguments"] == '{"y": "ab'
    assert reader.sent == 4 and [got[i]["id"] for i in range(4)] == [f"call-{i}" for i in range(4)]


def test_a_name_with_a_lone_surrogate_is_never_sent(tiny_model_dir):
    """A call named '\\ud83d' (no UTF-8 text holds it) is malformed, so no delta names it: its text stays the
    answer's, as parse_tool_calls leaves it out, and the call after it is the stream's first."""
    from pdsr_sdk.rollout.data import load_tokenizer

    text = 'Hmm.<tool_call>{"name": "\\ud83d", "arguments": {"x": 1}}</tool_call>' + CLOCK
    reader, entries = streamed(text)
    _, calls = parse_tool_calls(text, load_tokenizer(tiny_model_dir), "hermes")
    assert [c.name for c in calls] == ["clock"]
    assert [e for _, e in entries] == [{"index": 0, "id": "call-0", "type": "function",
                                        "function": {"name": "clock", "arguments": "{}"}}]
    assert reader.calls() == [(0, "clock", "{}")] and reader.broken == []


def test_a_tag_split_over_pushes_and_a_string_holding_the_end_tag():
    """A </tool_call> that may be coming is not sent as arguments; one inside a string closes the call there, as
    parse_tool_calls reads it (the call is malformed: sent up to the tag, it stays as sent)."""
    reader, entries = streamed('<tool_call>{"name": "html", "arguments": {"s": "a</tool_call>"}}</tool_call>')
    assert joined([e for _, e in entries])[0]["arguments"] == '{"s": "a'
    assert reader.broken == [0] and reader.calls() == []


def test_non_ascii_arguments_stream_as_the_answer_writes_them(tiny_model_dir):
    """Raw and escaped CJK and emoji, and a lone surrogate, in a call's keys and values: the fragments joined are
    the characters themselves (the lone surrogate escaped), as parse_tool_calls's arguments are written."""
    from pdsr_sdk.rollout.data import load_tokenizer

    text = ('<tool_call>{"name": "翻译", "arguments": {"文本": "你好\\u4e16\\u754c", "\\ud83d\\ude00": '
            '["\U0001f389", "\\ud83d!"]}}</tool_call>')
    reader, entries = streamed(text)
    _, (call,) = parse_tool_calls(text, load_tokenizer(tiny_model_dir), "hermes")
    got = joined([e for _, e in entries])[0]
    assert (got["name"], got["arguments"]) == (call.name, json_text(call.arguments)) == \
        ("翻译", '{"文本": "你好世界", "\U0001f600": ["\U0001f389", "\\ud83d!"]}')
    assert reader.calls() == [(0, "翻译", got["arguments"])] and len(entries) > 5
