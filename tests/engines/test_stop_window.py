"""Stop strings split by a segment boundary (pdsr_sdk.engines.stop_window) against a brute-force search of the
whole text: random vocabularies of short pieces over a small alphabet, so that stops often cross the boundary."""

from __future__ import annotations

import random

import pytest

from pdsr_sdk.engines.stop_window import HeldTokens, straddling_stop, window_tokens


def brute_force(pieces, before, new, stops):
    """Every character position of the joined text: the first new token by whose end a stop string that starts
    in ``before``'s text is complete; or, without one, whether the new text is long enough to rule one out."""
    start = sum(len(pieces[t]) for t in before)
    text = "".join(pieces[t] for t in list(before) + list(new))
    ends = [at + len(s) for s in stops for at in range(len(text))
            if text.startswith(s, at) and at < start < at + len(s)]
    reach = start
    for i, t in enumerate(new, 1):
        reach += len(pieces[t])
        if any(e <= reach for e in ends):
            return i, True
    return None, reach - start >= max(len(s) for s in stops) - 1


@pytest.mark.parametrize("seed", range(300))
def test_straddling_stop_matches_a_search_of_the_whole_text(seed):
    rng = random.Random(seed)
    alphabet = "ab</>"
    pieces = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3))) for _ in range(12)]
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 3))]
    before = [rng.randrange(12) for _ in range(rng.randint(0, 8))]
    new = [rng.randrange(12) for _ in range(rng.randint(0, 8))]
    decode = lambda ids: "".join(pieces[t] for t in ids)   # noqa: E731
    assert straddling_stop(decode, before, new, stops) == brute_force(pieces, before, new, stops)


def test_held_tokens_pass_on_what_vllm_would_have_kept():
    pieces = {1: "x", 2: "</", 3: "an", 4: "s", 5: "wer>", 6: "y"}
    decode = lambda ids: "".join(pieces[t] for t in ids)   # noqa: E731
    stops = ["</answer>"]
    assert window_tokens(stops) == len("</answer>") + 4
    # the boundary falls after '</an': held until 'wer>' completes the stop, then cut after it
    held = HeldTokens(decode, [1, 2, 3], stops)
    assert held.feed([4], [-0.5], False) == ([], [], False) and not held.done
    assert held.feed([5, 6], [-0.25, -1.0], False) == ([4, 5], [-0.5, -0.25], True) and held.done
    # no stop across the boundary: everything passes on once the new text is long enough to rule one out
    held = HeldTokens(decode, [1, 1], stops)
    assert held.feed([6, 6, 6], [-1.0] * 3, False) == ([], [], False)
    assert held.feed([6, 6, 6, 6, 6], [-1.0] * 5, False) == ([6] * 8, [-1.0] * 8, False) and held.done
    # the request ends before that: what came is passed on
    held = HeldTokens(decode, [2], stops)
    assert held.feed([6], [-2.0], True) == ([6], [-2.0], False)
