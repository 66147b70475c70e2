"""A streamed choice's text deltas (:class:`~pdsr_sdk.rollout.serve_deltas.TextDeltas`) against the tokenizer's
decode of the whole response: characters split over byte tokens, tokens that never complete a character, and
text held back while it may be a stop string's start."""

from __future__ import annotations

import random

import pytest

from support import requires_torch

pytestmark = requires_torch


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from pdsr_sdk.rollout.data import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def deltas_of(tok, ids, stops=(), sizes=(1,)):
    from pdsr_sdk.rollout.serve_deltas import TextDeltas

    d, out, i, rng = TextDeltas(tok, stops), [], 0, random.Random(len(ids))
    while i < len(ids):
        k = rng.choice(sizes)
        out.append(d.push(ids[i:i + k]))
        i += k
    return out


def test_multi_byte_characters_come_whole_and_join_to_the_decoded_text(tok):
    text = "héllo 世界 🎉, naïve café."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > len(text)   # the tiny tokenizer splits these characters over byte tokens
    out = deltas_of(tok, ids)
    assert "".join(out) == tok.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in d for d in out) and "🎉" in out and "" in out   # held until the character is whole


def test_any_tokens_in_any_steps_join_to_the_start_of_the_decoded_text(tok):
    """Random ids (special tokens, bytes that never make a character) pushed 1-4 at a time: what the deltas say
    is always the start of the whole decode (the stream's last chunk sends the rest)."""
    rng = random.Random(7)
    for _ in range(200):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 40))]
        joined = "".join(deltas_of(tok, ids, sizes=(1, 2, 3, 4)))
        assert tok.decode(ids, skip_special_tokens=True).startswith(joined)


@pytest.mark.parametrize("text, stops, expect", [
    ("The answer is 42</answer> and more", ["</answer>"], "The answer is 42"),
    ("a </ans", ["</answer>"], "a "),                        # may still become the stop string: held
    ("a </and more", ["</answer>"], "a </and more"),          # it did not: released
    ("x STOP y </answer>", ["</answer>", "STOP"], "x "),      # the first stop string in the text
])
def test_text_that_may_be_a_stop_string_is_held_back(tok, text, stops, expect):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    out = deltas_of(tok, ids, stops)
    assert "".join(out) == expect
    assert not any(s in "".join(out) for s in stops)
