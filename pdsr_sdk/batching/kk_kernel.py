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
  runs, O(nnz). Otherwise it is a stable argsort of k sums, O(k log k).
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
def _merge_disjoint(oa, na, ob, nb, psum, phead, ptail, out_sum, out_head, out_tail):
    """Merged parts when A's and B's non-empty parts never meet (na + nb <= k).

    Part j of the merged state is then A's part j (j < na) or B's part k-1-j
    alone. The stable sort by descending sum is a merge of two sorted runs:
    on equal sums A's parts come first (they sit at smaller positions), and
    equal-sum parts of B come in reverse order (B sits reversed).
    """
    pa = 0
    ib = 0
    out = 0
    while pa < na or ib < nb:
        if ib >= nb or (pa < na and psum[oa + pa] >= psum[ob + ib]):
            out_sum[out] = psum[oa + pa]
            out_head[out] = phead[oa + pa]
            out_tail[out] = ptail[oa + pa]
            pa += 1
            out += 1
        else:
            run_end = ib
            while run_end + 1 < nb and psum[ob + run_end + 1] == psum[ob + ib]:
                run_end += 1
            for q in range(run_end, ib - 1, -1):
                out_sum[out] = psum[ob + q]
                out_head[out] = phead[ob + q]
                out_tail[out] = ptail[ob + q]
                out += 1
            ib = run_end + 1


@numba.njit(cache=True)
def _merge_overlapping(oa, na, ob, nb, k, psum, phead, ptail, nxt, t_sum, t_head, t_tail, key,
                       out_sum, out_head, out_tail):
    """Merged parts when na + nb > k: every merged part is non-empty.

    Positions j < k - nb keep A's part alone (still sorted); only the last nb
    positions change (A's smallest parts plus B's parts). Stable-sort those nb
    and merge them with the untouched run, which wins ties (smaller
    positions): O(k + nb log nb) instead of sorting all k parts.
    """
    keep = k - nb  # < na because na + nb > k
    for q in range(nb):
        j = keep + q
        jb = nb - 1 - q  # = k - 1 - j
        s = psum[ob + jb]
        h = phead[ob + jb]
        t = ptail[ob + jb]
        if j < na:
            s += psum[oa + j]
            nxt[ptail[oa + j] - 1] = h  # A's members, then B's
            h = phead[oa + j]
        t_sum[q] = s
        t_head[q] = h
        t_tail[q] = t
        key[q] = -s
    order = np.argsort(key[:nb], kind="mergesort")  # stable, like Python's sorted
    i = 0
    q = 0
    out = 0
    while i < keep or q < nb:
        if q >= nb or (i < keep and psum[oa + i] >= t_sum[order[q]]):
            out_sum[out] = psum[oa + i]
            out_head[out] = phead[oa + i]
            out_tail[out] = ptail[oa + i]
            i += 1
        else:
            o = order[q]
            out_sum[out] = t_sum[o]
            out_head[out] = t_head[o]
            out_tail[out] = t_tail[o]
            q += 1
        out += 1


@numba.njit(cache=True)
def kk_labels_fast(weights, k):
    """Part label (0..k-1) of each item; part 0 has the largest sum.

    ``weights``: int64 array (n,), values >= 0 whose total fits in 2**61
    (the sort key is 2 * sum + non-empty). ``k`` >= 1.
    """
    n = weights.shape[0]
    labels = np.zeros(n, np.int64)
    if n == 0 or k == 1:
        return labels

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
    out_sum = np.empty(k, np.int64)
    out_head = np.empty(k, np.int32)
    out_tail = np.empty(k, np.int32)
    counter = n
    while size > 1:
        a = heap[0]
        size -= 1
        heap[0] = heap[size]
        _sift_down(heap, size, 0, spread, seq)
        b = heap[0]  # stays on the heap top; replaced by the merged state below
        na = nnz[a]
        nb = nnz[b]
        if na + nb <= k:
            need = na + nb
            _merge_disjoint(off[a], na, off[b], nb, psum, phead, ptail, out_sum, out_head, out_tail)
        else:
            need = k
            _merge_overlapping(off[a], na, off[b], nb, k, psum, phead, ptail, nxt, t_sum, t_head,
                               t_tail, key, out_sum, out_head, out_tail)

        # B's block is free; A's too if the merged state does not fit in it
        c = cls[b]
        psum[off[b]] = free_head[c]
        free_head[c] = off[b]
        if (1 << cls[a]) < need:
            c = cls[a]
            psum[off[a]] = free_head[c]
            free_head[c] = off[a]
            c = 0
            while (1 << c) < need:
                c += 1
            if free_head[c] >= 0:
                off[a] = free_head[c]
                free_head[c] = psum[off[a]]
            else:
                if top + (1 << c) > psum.shape[0]:
                    grown = max(2 * psum.shape[0], top + (1 << c))
                    psum2 = np.empty(grown, np.int64)
                    phead2 = np.empty(grown, np.int32)
                    ptail2 = np.empty(grown, np.int32)
                    psum2[:top] = psum[:top]
                    phead2[:top] = phead[:top]
                    ptail2[:top] = ptail[:top]
                    psum = psum2
                    phead = phead2
                    ptail = ptail2
                off[a] = top
                top += 1 << c
            cls[a] = c
        o = off[a]
        for j in range(need):
            psum[o + j] = out_sum[j]
            phead[o + j] = out_head[j]
            ptail[o + j] = out_tail[j]
        nnz[a] = need
        spread[a] = out_sum[0] - (out_sum[k - 1] if need == k else 0)
        seq[a] = counter
        counter += 1
        heap[0] = a
        _sift_down(heap, size, 0, spread, seq)

    final = heap[0]
    o = off[final]
    for j in range(nnz[final]):
        node = phead[o + j]
        while node != 0:
            labels[node - 1] = j
            if node == ptail[o + j]:
                break
            node = nxt[node - 1]
    return labels
