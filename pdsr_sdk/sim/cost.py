"""The simulator's cost model as pure functions (numbers and arrays in, numbers out).

Step model of one engine (continuous batching, one token per running request per step)::

    t_step = c0 + c1 * R + c2 * C + p * Q

``R`` running requests, ``C`` context tokens in the batch (each request's
prompt + generated tokens so far, including the token the step reads), ``Q``
prefill tokens (uncached context of requests admitted at this step; ``p`` is
seconds per prefill token). Between events the batch is fixed, every request
gains one token per step and ``C`` grows by ``R`` per step, so step ``j`` of an
epoch costs ``a + b * j`` with ``a = c0 + c1 R + c2 C0`` and ``b = c2 R``, and k
steps cost an arithmetic series. KV cache: a request whose next step reads a
context of ``c`` tokens holds ``ceil(c / block)`` blocks.

Every closed form here has a naive twin (``*_naive``, a plain float64 loop)
that tests hold it to.
"""

from __future__ import annotations

import math

import numpy as np


# -- time of k steps -------------------------------------------------------------------

def steps_time(k: int, a: float, b: float, extra: float = 0.0) -> float:
    """Seconds for k steps whose j-th (0-based) costs ``a + b*j``, plus ``extra`` on the first step."""
    if k <= 0:
        return 0.0
    return extra + k * a + b * (k * (k - 1) // 2)


def steps_time_naive(k: int, a: float, b: float, extra: float = 0.0) -> float:
    t = 0.0
    for j in range(k):
        t += a + b * j + (extra if j == 0 else 0.0)
    return t


def steps_within(dt: float, a: float, b: float, extra: float = 0.0) -> int:
    """The most steps k with ``steps_time(k, a, b, extra) <= dt`` (``a > 0``, ``b >= 0``)."""
    if dt < extra + a:
        return 0
    s = dt - extra
    if b == 0.0:
        k = int(s // a)
    else:
        # s = (a - b/2) k + (b/2) k^2 -> the positive root, in a cancellation-free form
        lin = a - 0.5 * b
        k = int(2.0 * s / (lin + math.sqrt(lin * lin + 2.0 * b * s)))
    k = max(k, 1)
    # the root is within one step of the answer; fix it up with the exact series
    while steps_time(k + 1, a, b, extra) <= dt:
        k += 1
    while k > 1 and steps_time(k, a, b, extra) > dt:
        k -= 1
    return k


def steps_within_naive(dt: float, a: float, b: float, extra: float = 0.0) -> int:
    k, t = 0, 0.0
    while True:
        t_next = t + a + b * k + (extra if k == 0 else 0.0)
        if t_next > dt + 1e-12 * max(1.0, abs(dt)):
            return k
        t, k = t_next, k + 1


# -- KV blocks -------------------------------------------------------------------------

def blocks_for(context: int, block: int) -> int:
    """KV blocks a request reading ``context`` tokens holds: ``ceil(context / block)``."""
    return -(-context // block)


def cached_prefix(computed_tokens: int, block: int) -> int:
    """Tokens of a context a prefix cache can serve: whole blocks of the computed tokens."""
    return block * (max(computed_tokens, 0) // block)


def uncached_tokens(context: int, cached: int, block: int) -> int:
    """Tokens a request of ``context`` tokens prefills when the first ``cached`` (whole blocks) are in the
    prefix cache: vLLM computes at least the last token, so only the whole blocks of ``context - 1`` count."""
    return context - min(cached, cached_prefix(context - 1, block))


def overflow_step(free_blocks: int, residue_counts, step0: int, block: int) -> int:
    """First global step S > step0 at which the running requests need more than ``free_blocks`` new blocks.

    ``residue_counts[r]`` counts running requests whose ``context - step`` is ``r`` mod ``block``; such a
    request gains a block at every step S with ``(S - 1 + r) % block == 0``. Each window of ``block``
    consecutive steps adds exactly one block per request, so the answer is found in O(block).
    """
    running = int(sum(residue_counts))
    if running == 0:
        raise ValueError("no running request: the cache cannot overflow")
    cycles, rest = divmod(free_blocks, running)
    seen = 0
    for d in range(1, block + 1):
        seen += residue_counts[(1 - (step0 + d)) % block]
        if seen > rest:
            return step0 + cycles * block + d
    raise AssertionError("unreachable: every window of `block` steps adds one block per request")


def overflow_step_naive(free_blocks: int, offsets, step0: int, block: int) -> int:
    """Twin of :func:`overflow_step` from the requests' ``context - step`` offsets, step by step."""
    if not len(offsets):
        raise ValueError("no running request: the cache cannot overflow")
    base = sum(blocks_for(step0 + o, block) for o in offsets)
    s = step0
    while True:
        s += 1
        if sum(blocks_for(s + o, block) for o in offsets) - base > free_blocks:
            return s


# -- lower bound -----------------------------------------------------------------------

def least_prefill(prompt_len, first, block: int | None) -> np.ndarray:
    """Least tokens each sample prefills at its first admission (int64 array).

    ``first`` marks the first sample of each prompt in the batch: it prefills its whole prompt.
    With a prompt cache of ``block``-token blocks (``block`` None: none), a later sample of the
    same prompt can find the prompt's whole blocks cached, but vLLM computes at least the last
    token, so it prefills ``P - block * floor((P - 1) / block)`` (a prompt that fills whole
    blocks recomputes its last block; :func:`uncached_tokens`, the engine's rule, for a whole array).
    """
    p = np.asarray(prompt_len, dtype=np.int64)
    if block is None:
        return p.copy()
    shared = p - block * (np.maximum(p - 1, 0) // block)
    return np.where(np.asarray(first, dtype=bool), p, shared)


def sample_work(prompt_len, length, *, c0: float, c1: float, c2: float, prefill: float,
                max_seqs: int, prefill_len=None) -> np.ndarray:
    """Least engine-seconds each sample costs (float64 array).

    A step's cost split over its R <= max_seqs requests charges each at least
    ``c0/max_seqs + c1 + c2*context`` per token, and it prefills at least
    ``prefill_len`` tokens (default: its prompt; see :func:`least_prefill`):
    ``W = p*Q + L*(c0/M + c1) + c2*(L*P + L(L-1)/2)``.
    """
    p = np.asarray(prompt_len, dtype=np.float64)
    q = p if prefill_len is None else np.asarray(prefill_len, dtype=np.float64)
    n = np.asarray(length, dtype=np.float64)
    return prefill * q + n * (c0 / max_seqs + c1) + c2 * (n * p + n * (n - 1) / 2)


def alone_time(prompt_len, length, *, c0: float, c1: float, c2: float, prefill: float,
               prefill_len=None) -> np.ndarray:
    """Seconds a sample needs even alone on an engine: its L steps in sequence, each at least
    ``c0 + c1 + c2*context``, the first with its prefill of ``prefill_len`` tokens (default: its
    prompt) (float64 array)."""
    p = np.asarray(prompt_len, dtype=np.float64)
    q = p if prefill_len is None else np.asarray(prefill_len, dtype=np.float64)
    n = np.asarray(length, dtype=np.float64)
    return np.where(n > 0, prefill * q + n * (c0 + c1) + c2 * (n * p + n * (n - 1) / 2), 0.0)


def least_prefill_naive(prompt_len, first, block) -> list[int]:
    out = []
    for p, f in zip(prompt_len, first):
        cached = 0
        if block is not None and not f:
            # whole blocks of the prompt, but never the last token (the engine computes at least one)
            cached = min(block * (int(p) // block), block * (max(int(p) - 1, 0) // block))
        out.append(int(p) - cached)
    return out


def sample_work_naive(prompt_len, length, *, c0, c1, c2, prefill, max_seqs, prefill_len=None) -> list[float]:
    out = []
    q_all = prompt_len if prefill_len is None else prefill_len
    for p, n, q in zip(prompt_len, length, q_all):
        w = prefill * q
        for j in range(int(n)):
            w += c0 / max_seqs + c1 + c2 * (p + j)
        out.append(float(w))
    return out


def alone_time_naive(prompt_len, length, *, c0, c1, c2, prefill, prefill_len=None) -> list[float]:
    out = []
    q_all = prompt_len if prefill_len is None else prefill_len
    for p, n, q in zip(prompt_len, length, q_all):
        t = 0.0
        for j in range(int(n)):
            t += c0 + c1 + c2 * (p + j) + (prefill * q if j == 0 else 0.0)
        out.append(t)
    return out


# -- speculative decoding --------------------------------------------------------------------

def drafting(running: int, tokens_per_step: float, max_batch: int) -> bool:
    """Whether a step of ``running`` requests drafts (and yields ``tokens_per_step`` tokens a request)."""
    return running <= max_batch and tokens_per_step > 1.0


def speculation_scale(running: int, tokens_per_step: float, verify_cost: list[tuple[int, float]],
                      max_batch: int, draft_load: float = 1.0) -> float:
    """What one token of each running request costs with speculation, relative to a plain decode step: a step's
    cost over the tokens it yields. The step costs 1 plus the verify cost's excess (``verify_cost``, [running,
    factor] pairs for a full draft, interpolated, flat past the ends) times ``draft_load``, the share of a full
    draft the step carries; 1 while more than ``max_batch`` requests run (no drafting)."""
    if not drafting(running, tokens_per_step, max_batch):
        return 1.0
    sizes = [b for b, _ in verify_cost]
    factors = [f for _, f in verify_cost]
    return (1.0 + (float(np.interp(running, sizes, factors)) - 1.0) * draft_load) / tokens_per_step


def speculation_scale_naive(running: int, tokens_per_step: float, verify_cost: list[tuple[int, float]],
                            max_batch: int, draft_load: float = 1.0) -> float:
    if running > max_batch or tokens_per_step <= 1.0:
        return 1.0
    factor = verify_cost[-1][1]
    if running <= verify_cost[0][0]:
        factor = verify_cost[0][1]
    else:
        for (b0, f0), (b1, f1) in zip(verify_cost, verify_cost[1:]):
            if b0 <= running <= b1:
                factor = f0 + (f1 - f0) * (running - b0) / (b1 - b0)
                break
    return (draft_load * factor + (1.0 - draft_load)) / tokens_per_step
