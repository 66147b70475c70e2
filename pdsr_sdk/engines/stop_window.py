"""Stop strings that a segment boundary splits.

vLLM looks for stop strings only in a request's own output text. A sample that pdsr continues in a new segment is a
new request whose prompt holds the response so far, so a stop string that begins before the boundary and ends
after it is never seen by vLLM: the sample would run past its stop. :func:`straddling_stop` finds such a stop in
the first tokens of a continuation, token by token and earliest completion first, as vLLM checks its own text.
Plain token lists in and out; the engine holds a continuation's first tokens back until it has answered.
"""

from __future__ import annotations

from typing import Callable, Sequence

#: tokens of the response before the boundary that are decoded: the stop strings' longest length in characters
#: plus this margin (a token is at least one character, bar a split multi-byte character)
MARGIN_TOKENS = 4


def window_tokens(stops: Sequence[str]) -> int:
    """How many of the response's tokens before a boundary can hold the start of a stop string that crosses it."""
    return max(len(s) for s in stops) + MARGIN_TOKENS


def straddling_stop(decode: Callable[[list[int]], str], before: Sequence[int], new: Sequence[int],
                    stops: Sequence[str]) -> tuple[int | None, bool]:
    """``(keep, done)``. ``keep``: how many of ``new`` to keep, up to and including the token that completes a
    stop string which begins in the text of ``before`` (the response's tokens just before the boundary, at least
    :func:`window_tokens` of them where the response has that many); None if there is none in ``new``.
    ``done``: whether the answer is final (a stop was found, or the new text is as long as the longest stop
    but one, so no stop string can cross the boundary any more); if not, ask again with more tokens. A stop
    string wholly within the new text is vLLM's to find and is not looked for."""
    before = list(before)
    start = len(decode(before))
    longest = max(len(s) for s in stops)
    if longest <= 1:   # a one-character stop cannot cross a boundary
        return None, True
    for i in range(1, len(new) + 1):
        text = decode(before + list(new[:i]))
        if _crossing(text, start, stops) is not None:
            return i, True
        if len(text) - start >= longest - 1:
            return None, True
    return None, False


def _crossing(text: str, start: int, stops: Sequence[str]) -> str | None:
    """The first of ``stops`` that occurs in ``text`` starting before ``start`` (the boundary) and ending after it."""
    return next((s for s in stops if 0 <= text.find(s, max(0, start - len(s) + 1), start + len(s) - 1) < start), None)


class HeldTokens:
    """A continuation's first tokens, held back from the scheduler until :func:`straddling_stop` is done."""

    def __init__(self, decode: Callable[[list[int]], str], before: Sequence[int], stops: Sequence[str]):
        self.decode, self.before, self.stops = decode, list(before), list(stops)
        self.ids: list[int] = []
        self.logprobs: list[float] | None = []
        self.done = False
        #: the stop string the boundary split, once one has ended the response (vLLM's stop_reason for it)
        self.stop: str | None = None

    def feed(self, ids: Sequence[int], logprobs: Sequence[float] | None,
             finished: bool) -> tuple[list[int], list[float] | None, bool]:
        """Called with each output of the request: the tokens to pass on now (none while undecided), their
        log-probs, and whether a split stop string ends in them (the request is then over)."""
        self.ids += list(ids)
        self.logprobs = None if logprobs is None or self.logprobs is None else self.logprobs + list(logprobs)
        keep, self.done = straddling_stop(self.decode, self.before, self.ids, self.stops)
        if not (self.done or finished):
            return [], [], False
        self.done = True
        n = len(self.ids) if keep is None else keep
        if keep is not None:
            self.stop = _crossing(self.decode(self.before + self.ids[:n]), len(self.decode(self.before)), self.stops)
        return self.ids[:n], None if self.logprobs is None else self.logprobs[:n], keep is not None
