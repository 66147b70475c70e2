"""Numba kernel: k-way Karmarkar-Karp largest differencing (arrays in, labels out).

Imports numba at module level: import this module lazily (``partition.py``
does). The algorithm, step for step identical to :mod:`kk_naive` so that both
return the same labels:

- state i (i < n) starts as k parts: part 0 = {i} with sum w[i], the rest
  empty. Parts of a state are kept sorted by (sum, non-empty) descending.
- A heap pops the state with the largest spread (max part sum - min part
  sum); ties go to the older state (smaller sequence number).
- Pop A, pop B, merge: part j of A joins part k-1-j of B (the largest of A
  meets the smallest of B), re-sort the k parts stably, push the result with
  the next sequence number. The last state left is the partition.

Layout, so that memory stays a small multiple of n rather than n x k:
- Sums >= 0, so a state's non-empty parts are a prefix of its sorted parts;
  only that prefix (``nnz`` parts) is stored, in a block of a shared pool
  (power-of-two size classes with free lists).
- Members of a part are linked lists (head/tail per part, ``nxt`` per item,
  stored +1 so that 0 means empty): joining two parts is O(1), no index list
  is ever copied.
- When A and B have at most k non-empty parts together (most merges), no
  two non-empty parts meet and the stable re-sort is a merge of two sorted
  runs: B's parts are merged into A's block in place from its end, O(nb)
  plus the parts of A they pass. Otherwise only A's last nb parts change
  (nb = B's non-empty parts): those are stably sorted and merged in the same
  way. Either way A's parts above the heaviest part B brings are not touched.
  (Sorting all k parts through a scratch array was 1.3-1.7x slower at
  k = 1,838 and 6,730 for 16,384 lengths; copying all na + nb parts on the
  disjoint merges made a run O(n k), where a heavy state takes the next
  light ones one at a time: 1.1-4.5x slower at k = 1,008-7,039.)
- A full state taking a lone part (nb = 1) joins it to its lightest part, which
  then moves up: O(k) each as a long tail's light samples come one by one (20.9M
  part moves at k = 1,833 for 16,384 kv-bound lengths). Meanwhile its block is a
  min-heap, O(log k) each, with a stamp per part (at its first member) of when it
  last changed; heapsorted back by descending sum, equal sums by stamp, before
  any other merge, it is the insertions' order. A run at k = 128-7,039 for
  16,384 lengths: 6-11 ms (8-118 ms without).
- ``limit``: a part's sum only grows (parts merge, weights are >= 0), so the
  final heaviest part is at least every part ever formed; the kernel stops at
  the first merged part above ``limit`` and reports that the result's heaviest
  part would exceed it (the count search discards such counts anyway). The
  same for ``token_limit`` on a second, unbalanced sum per item (the token
  cap when balancing the attention cost, whose weight limit a*cap + cap**2
  lets many parts over the cap pass: 16,384 lengths under 1.5x the longest
  ran 17 counts to the end to find each over the cap).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, inline="always")
def _before(spread, seq, a, b):
    # True when state a pops before state b: larger spread first, then older.
    return spread[a] > spread[b] or (spread[a] == spread[b] and seq[a] < seq[b])


@numba.njit(cache=True)
def _sift_down(heap, size, pos, spread, seq):
    item = heap[pos]
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        right = child + 1
        if right < size and _before(spread, seq, heap[right], heap[child]):
            child = right
        if _before(spread, seq, heap[child], item):
            heap[pos] = heap[child]
            pos = child
        else:
            break
    heap[pos] = item


@numba.njit(cache=True)
def _parts_of_b(ob, nb, psum, phead, ptail, t_sum, t_head, t_tail):
    """B's parts in the order they take in the merged state when na + nb <= k (no two non-empty parts meet).

    Part j of the merged state is then A's part j (j < na) or B's part k-1-j alone, so B sits reversed: in
    the stable sort by descending sum each run of B's equal sums comes in reverse order.
    """
    out = 0
    ib = 0
    while ib < nb:
        run_end = ib
        while run_end + 1 < nb and psum[ob + run_end + 1] == psum[ob + ib]:
            run_end += 1
        for q in range(run_end, ib - 1, -1):
            t_sum[out] = psum[ob + q]
            t_head[out] = phead[ob + q]
            t_tail[out] = ptail[ob + q]
            out += 1
        ib = run_end + 1


@numba.njit(cache=True)
def _changed_parts(oa, na, ob, nb, k, psum, phead, ptail, nxt, tok, token_limit, t_sum, t_head, t_tail, key):
    """The nb merged parts that change when na + nb > k, in stable descending order of sum.

    Positions j < k - nb keep A's part alone (still sorted); position j >= k - nb
    gets B's part k-1-j, joined by A's part j when A has one. Returns the order
    of the nb parts in ``t_sum``/``t_head``/``t_tail`` (a stable argsort, like
    Python's sorted), and whether a joined part's tokens (``tok`` of its head) exceed ``token_limit``.
    """
    keep = k - nb  # < na because na + nb > k
    over = False
    for q in range(nb):
        j = keep + q
        jb = nb - 1 - q  # = k - 1 - j
        s = psum[ob + jb]
        h = phead[ob + jb]
        t = ptail[ob + jb]
        if j < na:
            s += psum[oa + j]
            nxt[ptail[oa + j] - 1] = h  # A's members, then B's
            tok[phead[oa + j] - 1] += tok[h - 1]  # the joined part's head stays A's
            over = over or tok[phead[oa + j] - 1] > token_limit
            h = phead[oa + j]
        t_sum[q] = s
        t_head[q] = h
        t_tail[q] = t
        key[q] = -s
    return np.argsort(key[:nb], kind="mergesort"), over


@numba.njit(cache=True)
def _merge_in_place(o, keep, nb, order, psum, phead, ptail, t_sum, t_head, t_tail):
    """Merge the sorted changed parts into A's untouched run psum[o:o+keep], filling o..o+keep+nb-1.

    From the end: the last position takes whichever of A's smallest untouched
    part and the smallest changed part sorts later. On equal sums the untouched
    run sorts first (it sits at smaller positions), so the changed part goes
    later. Stops when the changed parts are placed: the rest of A is in place.
    """
    w = keep + nb - 1
    i = keep - 1
    q = nb - 1
    while q >= 0:
        t = order[q]
        if i >= 0 and psum[o + i] < t_sum[t]:
            psum[o + w] = psum[o + i]
            phead[o + w] = phead[o + i]
            ptail[o + w] = ptail[o + i]
            i -= 1
        else:
            psum[o + w] = t_sum[t]
            phead[o + w] = t_head[t]
            ptail[o + w] = t_tail[t]
            q -= 1
        w -= 1


@numba.njit(cache=True, inline="always")
def _lighter(psum, phead, stamp, x, y):
    # The part at pool slot x sorts after the one at y: a smaller sum, or the same sum and changed later.
    return psum[x] < psum[y] or (psum[x] == psum[y] and stamp[phead[x] - 1] > stamp[phead[y] - 1])


@numba.njit(cache=True)
def _swap_parts(psum, phead, ptail, x, y):
    psum[x], psum[y] = psum[y], psum[x]
    phead[x], phead[y] = phead[y], phead[x]
    ptail[x], ptail[y] = ptail[y], ptail[x]


@numba.njit(cache=True)
def _sift_parts(o, m, p, psum, phead, ptail, stamp):
    """Restore the min-heap (root: the part that sorts last) of the m parts in block o below position p."""
    while True:
        c = 2 * p + 1
        if c >= m:
            return
        if c + 1 < m and _lighter(psum, phead, stamp, o + c + 1, o + c):
            c += 1
        if not _lighter(psum, phead, stamp, o + c, o + p):
            return
        _swap_parts(psum, phead, ptail, o + c, o + p)
        p = c


@numba.njit(cache=True)
def _to_heap(o, k, psum, phead, ptail, stamp, clock):
    """Sorted block o of k parts -> their min-heap (reversed: sorted the heap's way); returns the next stamp."""
    for r in range(k // 2):
        _swap_parts(psum, phead, ptail, o + r, o + k - 1 - r)
    for r in range(k):  # stamps rise with the sorted position: equal sums keep their order
        stamp[phead[o + r] - 1] = clock + k - 1 - r
    return clock + k


@numba.njit(cache=True)
def _to_sorted(o, k, psum, phead, ptail, stamp):
    """Min-heap block o of k parts -> sorted by descending sum, equal sums by stamp (heapsort in place)."""
    for end in range(k - 1, 0, -1):
        _swap_parts(psum, phead, ptail, o, o + end)
        _sift_parts(o, end, 0, psum, phead, ptail, stamp)


@numba.njit(cache=True)
def _block(c, psum, phead, ptail, free_head, top):
    """A free block of class c: (offset, pool arrays, possibly grown, new top)."""
    if free_head[c] >= 0:
        o = free_head[c]
        free_head[c] = psum[o]
        return o, psum, phead, ptail, top
    if top + (1 << c) > psum.shape[0]:
        grown = max(2 * psum.shape[0], top + (1 << c))
        psum2 = np.empty(grown, np.int64)
        phead2 = np.empty(grown, np.int32)
        ptail2 = np.empty(grown, np.int32)
        psum2[:top] = psum[:top]
        phead2[:top] = phead[:top]
        ptail2[:top] = ptail[:top]
        psum, phead, ptail = psum2, phead2, ptail2
    return top, psum, phead, ptail, top + (1 << c)


@numba.njit(cache=True)
def kk_labels_fast(weights, k, limit, tokens, token_limit):
    """(part label 0..k-1 of each item, True), part 0 the largest sum; (zeros, False) past a limit.

    ``weights``: int64 array (n,), values >= 0 whose total fits in 2**61
    (the sort key is 2 * sum + non-empty). ``k`` >= 1. ``limit``: the run
    stops once a part's sum exceeds it, which happens iff the finished
    partition's largest part would (pass 2**63 - 1 for no limit). ``tokens``
    (int64 (n,), >= 0, not balanced) and ``token_limit``: likewise once a
    part's tokens exceed it; a part's tokens are kept at its first member
    (the head of its list), so only joins update them.
    """
    n = weights.shape[0]
    labels = np.zeros(n, np.int64)
    if n == 0:
        return labels, True
    if k == 1:
        return labels, weights.sum() <= limit and tokens.sum() <= token_limit
    for i in range(n):
        if weights[i] > limit or tokens[i] > token_limit:
            return labels, False
    tok = tokens.copy()

    # pool of part blocks; block of class c holds 2**c parts
    pool = 4 * n + 2 * k + 16
    psum = np.empty(pool, np.int64)
    phead = np.empty(pool, np.int32)
    ptail = np.empty(pool, np.int32)
    free_head = np.full(64, -1, np.int64)  # free-list heads per class, linked through psum
    top = n

    nxt = np.zeros(n, np.int32)
    off = np.empty(n, np.int64)
    cls = np.zeros(n, np.int64)
    nnz = np.ones(n, np.int64)
    spread = np.empty(n, np.int64)
    seq = np.empty(n, np.int64)
    heap = np.empty(n, np.int64)
    for i in range(n):
        psum[i] = weights[i]
        phead[i] = i + 1
        ptail[i] = i + 1
        off[i] = i
        spread[i] = weights[i]
        seq[i] = i
        heap[i] = i
    size = n
    for pos in range(size // 2 - 1, -1, -1):
        _sift_down(heap, size, pos, spread, seq)

    t_sum = np.empty(k, np.int64)
    t_head = np.empty(k, np.int32)
    t_tail = np.empty(k, np.int32)
    key = np.empty(k, np.int64)
    identity = np.arange(k, dtype=np.int64)
    class_k = 0
    while (1 << class_k) < k:
        class_k += 1
    counter = n
    stamp = np.zeros(n, np.int64)  # per part, at its first member: when it last changed (heap layout only)
    clock = 0
    as_heap = np.zeros(n, np.bool_)
    heaviest = np.zeros(n, np.int64)  # a state's heaviest part while its block is a heap
    while size > 1:
        a = heap[0]
        size -= 1
        heap[0] = heap[size]
        _sift_down(heap, size, 0, spread, seq)
        b = heap[0]  # stays on the heap top; replaced by the merged state below
        na = nnz[a]
        nb = nnz[b]
        oa = off[a]
        if as_heap[b]:
            _to_sorted(off[b], k, psum, phead, ptail, stamp)
            as_heap[b] = False
        if na == k and nb == 1:
            # A full state takes a lone part into its lightest, which then moves up past the lighter parts: a
            # chain of these (a long tail's light samples, one by one) cost O(k) each in the sorted layout.
            # The block is kept as a min-heap meanwhile, O(log k) each, stamps keeping the sorted order's
            # ties: the changed part goes after the unchanged ones of its sum.
            if not as_heap[a]:
                heaviest[a] = psum[oa]
                clock = _to_heap(oa, k, psum, phead, ptail, stamp, clock)
                as_heap[a] = True
            ob = off[b]
            h = phead[ob]
            nxt[ptail[oa] - 1] = h  # A's members, then B's
            ptail[oa] = ptail[ob]
            psum[oa] += psum[ob]
            tok[phead[oa] - 1] += tok[h - 1]
            if tok[phead[oa] - 1] > token_limit:
                return labels, False
            stamp[phead[oa] - 1] = clock
            clock += 1
            heaviest[a] = max(heaviest[a], psum[oa])
            psum[ob] = free_head[cls[b]]  # B's block is free
            free_head[cls[b]] = ob
            _sift_parts(oa, k, 0, psum, phead, ptail, stamp)
            if heaviest[a] > limit:
                return labels, False
            spread[a] = heaviest[a] - psum[oa]
            seq[a] = counter
            counter += 1
            heap[0] = a
            _sift_down(heap, size, 0, spread, seq)
            continue
        if as_heap[a]:
            _to_sorted(oa, k, psum, phead, ptail, stamp)
            as_heap[a] = False
        if na + nb <= k:
            # B's parts are merged into A's block in place from its end: B is usually a few parts lighter than
            # all of A's, so this costs O(nb), where copying all na + nb parts made a run O(n k).
            need = na + nb
            _parts_of_b(off[b], nb, psum, phead, ptail, t_sum, t_head, t_tail)
            c = cls[b]  # B's parts are in t_*: its block is free
            psum[off[b]] = free_head[c]
            free_head[c] = off[b]
            if (1 << cls[a]) < need:  # A's parts move to a block large enough for the merged state
                c = 0
                while (1 << c) < need:
                    c += 1
                o, psum, phead, ptail, top = _block(c, psum, phead, ptail, free_head, top)
                for j in range(na):
                    psum[o + j] = psum[oa + j]
                    phead[o + j] = phead[oa + j]
                    ptail[o + j] = ptail[oa + j]
                psum[oa] = free_head[cls[a]]  # the old block is free once copied
                free_head[cls[a]] = oa
                oa = o
                off[a] = oa
                cls[a] = c
            _merge_in_place(oa, na, nb, identity, psum, phead, ptail, t_sum, t_head, t_tail)
        else:
            need = k
            keep = k - nb
            order, over = _changed_parts(oa, na, off[b], nb, k, psum, phead, ptail, nxt, tok, token_limit,
                                         t_sum, t_head, t_tail, key)
            if over:
                return labels, False
            c = cls[b]  # B's parts are in t_*: its block is free
            psum[off[b]] = free_head[c]
            free_head[c] = off[b]
            if (1 << cls[a]) < k:  # A's untouched parts move to a block of k
                o, psum, phead, ptail, top = _block(class_k, psum, phead, ptail, free_head, top)
                for j in range(keep):
                    psum[o + j] = psum[oa + j]
                    phead[o + j] = phead[oa + j]
                    ptail[o + j] = ptail[oa + j]
                c = cls[a]
                psum[oa] = free_head[c]
                free_head[c] = oa
                oa = o
                off[a] = oa
                cls[a] = class_k
            _merge_in_place(oa, keep, nb, order, psum, phead, ptail, t_sum, t_head, t_tail)
        if psum[oa] > limit:
            return labels, False
        nnz[a] = need
        spread[a] = psum[oa] - (psum[oa + k - 1] if need == k else 0)
        seq[a] = counter
        counter += 1
        heap[0] = a
        _sift_down(heap, size, 0, spread, seq)

    final = heap[0]
    o = off[final]
    if as_heap[final]:
        _to_sorted(o, k, psum, phead, ptail, stamp)
    for j in range(nnz[final]):
        node = phead[o + j]
        while node != 0:
            labels[node - 1] = j
            if node == ptail[o + j]:
                break
            node = nxt[node - 1]
    return labels, True
