"""group_match.vote_draft: the draft voted by every place the context's longest n-gram occurs, against a loop twin."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from pdsr_sdk.engines.group_match import find_draft, vote_draft


def vote_naive(context, corpus, min_n, max_n, k, share=0.5, corpus_min_n=None):
    context = list(context)
    seqs = [list(s) for s in corpus] + [context]
    places = []   # (n-gram length, sequence index, continuation start)
    for si, seq in enumerate(seqs):
        floor = min_n if si == len(corpus) else max(min_n, corpus_min_n or min_n)
        for start in range(1, len(seq)):
            n = 0
            while n < max_n and n < len(context) and start - 1 - n >= 0 and seq[start - 1 - n] == context[-1 - n]:
                n += 1
            if n >= floor:
                places.append((n, si, start))
    if k <= 0 or len(context) < min_n or not places:
        return [], 0
    best = max(p[0] for p in places)
    conts = [seqs[si][start:start + k] for n, si, start in places if n == best]
    draft = []
    for d in range(k):
        alive = [c for c in conts if len(c) > d]
        if not alive:
            break
        counts = Counter(c[d] for c in alive)
        top = max(counts.values())
        pick = next(c[d] for c in alive if counts[c[d]] == top)   # the earliest place's token among ties
        if top < share * len(alive):
            break
        draft.append(pick)
        conts = [c for c in alive if c[d] == pick]
    return draft, best


@pytest.mark.parametrize("corpus_floor", [None, 0, 1, 2])
def test_vote_draft_matches_its_loop_twin(corpus_floor):
    rng = random.Random(4)
    for trial in range(400):
        vocab = rng.randint(2, 6)
        corpus = [np.array([rng.randrange(vocab) for _ in range(rng.randint(0, 30))]) for _ in range(rng.randint(0, 5))]
        context = np.array([rng.randrange(vocab) for _ in range(rng.randint(0, 25))])
        min_n = rng.randint(1, 3)
        max_n = rng.randint(min_n, 5)
        k = rng.randint(0, 5)
        share = rng.choice([0.0, 0.5, 0.6, 0.7])
        corpus_min_n = None if corpus_floor is None else min_n + corpus_floor   # up to the window's longest
        draft, n = vote_draft(context, corpus, min_n, max_n, k, share, corpus_min_n)
        want, want_n = vote_naive(context, corpus, min_n, max_n, k, share, corpus_min_n)
        assert list(draft) == want, (trial, context, corpus)
        assert (n if want else 0) == (want_n if want else 0)


def test_one_place_drafts_its_continuation():
    corpus = [np.array([7, 1, 2, 3, 4, 5, 6])]
    context = np.array([9, 1, 2, 3])
    draft, n = vote_draft(context, corpus, 2, 4, 3)
    assert list(draft) == list(find_draft(context, corpus, 2, 4, 3)) == [4, 5, 6] and n == 3


def test_the_majority_wins_and_a_split_stops_the_draft():
    corpus = [np.array([1, 2, 3, 4, 8]), np.array([1, 2, 3, 4, 9]), np.array([1, 2, 5, 5, 5])]
    context = np.array([0, 1, 2])
    draft, n = vote_draft(context, corpus, 2, 4, 4, share=0.6)
    assert list(draft) == [3, 4] and n == 2   # 3: 2 of 3; 4: 2 of 2; then 8 / 9: half, under 0.6


def test_a_short_corpus_match_does_not_vote_where_the_corpus_needs_the_whole_window():
    corpus = [np.array([1, 2, 8, 8]), np.array([1, 2, 8, 8])]
    context = np.array([5, 1, 2, 9, 9, 1, 2])   # its own earlier "1 2" went on with 9, the corpus's with 8
    assert list(vote_draft(context, corpus, 2, 4, 2, share=0.6)[0]) == [8, 8]     # 2 of 3 places say 8
    draft, n = vote_draft(context, corpus, 2, 4, 2, share=0.6, corpus_min_n=4)
    assert list(draft) == [9, 9] and n == 2    # the corpus's 2-token matches no longer count
    assert list(vote_draft(np.array([7, 0, 1, 2]), [np.array([7, 0, 1, 2, 3])], 2, 4, 1, corpus_min_n=4)[0]) == [3]
