"""The draft lookup of speculative method ``group`` (:mod:`pdsr_sdk.engines.group_drafter`): arrays in, a draft out.

A row's context ends in an n-gram; the draft is the up to ``k`` tokens that followed the same n-gram in a corpus of
token sequences (a group's finished siblings' responses). The longest n-gram wins, from ``max_n`` down to
``min_n``; among matches of that length, the one whose continuation starts nearest ``position`` (the row's own
response length: responses to one prompt tend to say the same things in the same places), then the first
sequence, then the earliest place in it (vLLM's ngram also takes the earliest of its longest matches). A match's
n-gram and continuation lie inside one sequence. :func:`find_draft_naive` is the loop twin the tests hold it to.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

_EMPTY = np.empty(0, dtype=np.int64)


def match_lengths(seq: np.ndarray, tail: np.ndarray, max_n: int) -> np.ndarray:
    """For each place ``e`` in ``1 .. len(seq) - 1`` where a continuation could start (index ``e - 1``), how many of
    ``tail``'s last tokens (at most ``max_n``) ``seq[:e]`` ends with."""
    size = len(seq) - 1
    if size <= 0:
        return np.zeros(0, dtype=np.int64)
    lengths = np.zeros(size, dtype=np.int64)
    alive = np.ones(size, dtype=bool)
    for j in range(min(max_n, len(tail))):
        # seq[q - j] == tail[-1 - j] for the n-gram ending at q = e - 1; q < j runs off the sequence's start
        eq = np.zeros(size, dtype=bool)
        eq[j:] = seq[:size - j] == tail[-1 - j]
        alive &= eq
        if not alive.any():
            break
        lengths += alive
    return lengths


def find_draft(context: np.ndarray, corpus: Sequence[np.ndarray], min_n: int, max_n: int, k: int,
               position: int | None = None) -> np.ndarray:
    """The up to ``k`` tokens that followed the longest (``min_n`` to ``max_n`` tokens) n-gram ending ``context``
    where it occurs in ``corpus`` (see the module's docstring for ties); empty where none does."""
    match = best_match(context, corpus, min_n, max_n, position) if k > 0 else None
    if match is None:
        return _EMPTY
    _, s, start = match
    return np.asarray(corpus[s][start:start + k])


def best_match(context: np.ndarray, corpus: Sequence[np.ndarray], min_n: int, max_n: int,
               position: int | None = None) -> tuple[int, int, int] | None:
    """:func:`find_draft`'s match: (n-gram length, sequence, where its continuation starts), None if none."""
    if len(context) < min_n or not corpus:
        return None
    tail = np.asarray(context[-max_n:])
    best: tuple[int, int, int, int] | None = None   # (-length, distance, sequence, start): smallest wins
    for s, seq in enumerate(corpus):
        lengths = match_lengths(seq, tail, max_n)
        if not len(lengths):
            continue
        top = int(lengths.max())
        if top < min_n or (best is not None and -top > best[0]):
            continue
        starts = np.flatnonzero(lengths == top) + 1
        if position is None:
            i = 0
        else:
            i = int(np.argmin(np.abs(starts - position)))   # argmin: the first (earliest) of equal distances
        distance = 0 if position is None else abs(int(starts[i]) - position)
        cand = (-top, distance, s, int(starts[i]))
        if best is None or cand < best:
            best = cand
    if best is None:
        return None
    return -best[0], best[2], best[3]


def find_draft_naive(context: Sequence[int], corpus: Sequence[Sequence[int]], min_n: int, max_n: int, k: int,
                     position: int | None = None) -> list[int]:
    """:func:`find_draft` as plain loops: every sequence, every place, the n-gram counted back token by token."""
    if k <= 0 or len(context) < min_n:
        return []
    best = None
    for s, seq in enumerate(corpus):
        for start in range(1, len(seq)):
            n = 0
            while n < max_n and n < len(context) and start - 1 - n >= 0 and seq[start - 1 - n] == context[-1 - n]:
                n += 1
            if n < min_n:
                continue
            key = (-n, 0 if position is None else abs(start - position), s, start)
            if best is None or key < best:
                best = key
    if best is None:
        return []
    return list(corpus[best[2]][best[3]:best[3] + k])


def vote_draft(context: np.ndarray, corpus: Sequence[np.ndarray], min_n: int, max_n: int, k: int,
               share: float = 0.5, corpus_min_n: int | None = None) -> tuple[np.ndarray, int]:
    """A draft voted by every place the context's longest n-gram (``max_n`` down to ``min_n`` tokens) occurs, in
    ``corpus`` and in the context itself (before its own last n-gram): the draft grows token by token with the
    token most of the places still agreeing with it continue with, while that token has at least ``share`` of
    them (ties: the earliest such place's token). A place in ``corpus`` counts only where at least
    ``corpus_min_n`` tokens match (default ``min_n``). Returns (the draft, the n-gram length; 0 and empty where
    nothing matches). One place alone drafts its continuation, as :func:`find_draft` does."""
    if k <= 0 or len(context) < min_n:
        return _EMPTY, 0
    tail = np.asarray(context[-max_n:])
    seqs = list(corpus) + [np.asarray(context)]
    floors = [max(min_n, corpus_min_n or min_n)] * len(corpus) + [min_n]
    found: list[tuple[np.ndarray, np.ndarray]] = []   # (sequence, continuation starts) at the best length
    best = 0
    for seq, floor in zip(seqs, floors):
        lengths = match_lengths(seq, tail, max_n)
        if not len(lengths):
            continue
        top = int(lengths.max())
        if top < floor or top < best:
            continue
        if top > best:
            best, found = top, []
        found.append((seq, np.flatnonzero(lengths == top) + 1))
    if not found:
        return _EMPTY, 0
    conts = [seq[s:s + k] for seq, starts in found for s in starts]
    draft: list[int] = []
    for d in range(k):
        alive = [c for c in conts if len(c) > d]
        if not alive:
            break
        tokens = np.fromiter((c[d] for c in alive), dtype=np.int64, count=len(alive))
        values, first, count = np.unique(tokens, return_index=True, return_counts=True)
        top = count.max()
        pick = values[first[count == top].min() == first][0] if (count == top).sum() > 1 else values[count.argmax()]
        if top < share * len(alive):
            break
        draft.append(int(pick))
        conts = [c for c in alive if c[d] == pick]
    return np.asarray(draft, dtype=np.int64), best
