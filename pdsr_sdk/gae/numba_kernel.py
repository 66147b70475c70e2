"""Numba CPU kernels for masked GAE (``backend="numba"``).

Two kernels with identical semantics (see :mod:`pdsr_sdk.gae`), both
looping over rows and writing into caller buffers:

- :func:`gae_rows_simple`: the recurrence step by step, one token per loop
  iteration. Its speed is set by the loop-carried chain
  ``g = x + w_t * g`` (one FMA, 4 cycles) per token.
- :func:`gae_rows_unrolled` (the backend's kernel): four tokens per
  iteration with the four affine steps ``g -> x_t + w_t g`` folded into one
  map ``g -> X + W g`` (recurrence doubling), so the carried chain has one
  FMA per four tokens; the per-token advantages hang off it and run in
  parallel. Each row stays one sequential backward stream per array, which
  the hardware prefetchers handle well.

Threads: :func:`numba_gae` splits the rows into blocks that the calling
thread and a small pool take in turn, each block one GIL-free (``nogil``)
kernel call, instead of ``parallel=True``/``prange``. On our shared 2-core
machines a prange call waits at numba's OpenMP barrier for a thread stuck
behind another process (measured: 7-20 ms for a 0.3 ms job while the other
core was busy; the threading layer is process-wide, so a library should not
switch it for its users). Here the caller never waits for a helper that has
not started: it takes the remaining blocks itself.

Masks are handled branch-free (a masked step is the identity map: x=0, w=1)
so random masks cost no mispredictions, and masked positions never read
their reward into the state (NaN there is ignored).

Why not tiles of rows (SIMD across rows)? Measured on the team machine
(2-core Xeon, float32, B=256, T=131072): tiles of 4-16 rows copied through
a transposed scratch buffer ran 4-10x slower than one row at a time, with
or without padding the 512 KiB row stride: numba emits the strided copies
as scalar code and a tile keeps 5 x R memory streams live, more than the
prefetchers track; interleaving 2-4 rows without copying was 1.1-2x
slower. Single-threaded on B=64, T=131072 the unrolled kernel took 15.6 ms,
the one-token kernel 26.5 ms; ``bench/gae.py`` prints the kernel's
bandwidth against a plain memory copy.

``fastmath={"contract"}`` only allows fusing a*b+c into one FMA (no
reassociation), which removes a rounding step and halves the chain latency.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

_FLAGS = dict(cache=True, fastmath={"contract"}, nogil=True)


@njit(inline="always", **_FLAGS)
def _one_token(rb, vb, mb, ab, tb, t, g, nv, gamma, w, zero, one):  # pragma: no cover - jitted
    """Token ``t`` of a row, one step of the recurrence: writes its advantage and return, and gives the carried
    ``(g, nv)`` (nv: the value of the next valid token). Inlined into both kernels."""
    vt = vb[t]
    valid = mb[t] != 0
    d = rb[t] + gamma * nv - vt           # computed unconditionally, selected below
    g = (d if valid else zero) + (w if valid else one) * g
    nv = vt if valid else nv
    ab[t] = g
    tb[t] = g + vt
    return g, nv


@njit(**_FLAGS)
def gae_rows_simple(rewards, values, mask, gamma, w, zero, one, adv, ret):  # pragma: no cover - jitted
    """Per-row masked GAE, one token per step. ``gamma``, ``w`` (= gamma*lam),
    ``zero`` and ``one`` are scalars of the carry dtype, which sets the
    precision of the running state."""
    rows, steps = rewards.shape
    for b in range(rows):
        rb = rewards[b]
        vb = values[b]
        mb = mask[b]
        ab = adv[b]
        tb = ret[b]
        g = zero
        nv = zero
        for t in range(steps - 1, -1, -1):
            g, nv = _one_token(rb, vb, mb, ab, tb, t, g, nv, gamma, w, zero, one)


@njit(**_FLAGS)
def gae_rows_unrolled(rewards, values, mask, gamma, w, zero, one, adv, ret):  # pragma: no cover - jitted
    """Per-row masked GAE, four tokens per step with the carried chain folded
    (see the module docstring). Same arguments as :func:`gae_rows_simple`."""
    rows, steps = rewards.shape
    for b in range(rows):
        rb = rewards[b]
        vb = values[b]
        mb = mask[b]
        ab = adv[b]
        tb = ret[b]
        g = zero
        nv = zero
        t = steps - 1
        # the last steps % 4 tokens one at a time, so the rest splits into groups of 4
        while (t + 1) % 4 != 0:
            g, nv = _one_token(rb, vb, mb, ab, tb, t, g, nv, gamma, w, zero, one)
            t -= 1
        while t >= 3:
            # tokens t (k=3) down to t-3 (k=0)
            v3 = vb[t]
            v2 = vb[t - 1]
            v1 = vb[t - 2]
            v0 = vb[t - 3]
            m3 = mb[t] != 0
            m2 = mb[t - 1] != 0
            m1 = mb[t - 2] != 0
            m0 = mb[t - 3] != 0
            # value of the next valid token seen from each position (select chain, 1 cycle each)
            n3 = nv
            n2 = v3 if m3 else n3
            n1 = v2 if m2 else n2
            n0 = v1 if m1 else n1
            nv = v0 if m0 else n0
            d3 = rb[t] + gamma * n3 - v3
            d2 = rb[t - 1] + gamma * n2 - v2
            d1 = rb[t - 2] + gamma * n1 - v1
            d0 = rb[t - 3] + gamma * n0 - v0
            x3 = d3 if m3 else zero
            x2 = d2 if m2 else zero
            x1 = d1 if m1 else zero
            x0 = d0 if m0 else zero
            w3 = w if m3 else one
            w2 = w if m2 else one
            w1 = w if m1 else one
            w0 = w if m0 else one
            # g_out = X + W g_in for the whole group: one FMA on the carried chain
            big_x = x0 + w0 * (x1 + w1 * (x2 + w2 * x3))
            big_w = (w0 * w1) * (w2 * w3)
            g3 = x3 + w3 * g
            g2 = x2 + w2 * g3
            g1 = x1 + w1 * g2
            g = big_x + big_w * g
            ab[t] = g3
            ab[t - 1] = g2
            ab[t - 2] = g1
            ab[t - 3] = g
            tb[t] = g3 + v3
            tb[t - 1] = g2 + v2
            tb[t - 2] = g1 + v1
            tb[t - 3] = g + v0
            t -= 4


#: below this many tokens per block, a hand-off to another thread costs more than it saves
_MIN_TOKENS_PER_BLOCK = 1 << 17
#: blocks per thread, so that a thread slowed down by a busy core does less of the work
_BLOCKS_PER_THREAD = 4

KERNELS = {"unrolled": gae_rows_unrolled, "simple": gae_rows_simple}

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def available_threads() -> int:
    """CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=available_threads(), thread_name_prefix="pdsr-gae")
        return _POOL


class _RowBlocks:
    """Blocks of rows handed out to whichever thread asks first; the caller
    waits only for blocks in progress, never for a helper that has not started."""

    def __init__(self, run, bounds: list[tuple[int, int]]):
        self._run = run
        self._bounds = bounds
        self._next = 0
        self._done = 0
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._finished = threading.Event()

    def work(self) -> None:
        while True:
            with self._lock:
                if self._next >= len(self._bounds) or self._error is not None:
                    return
                lo, hi = self._bounds[self._next]
                self._next += 1
            try:
                self._run(lo, hi)   # the kernel releases the GIL
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                with self._lock:
                    self._error = exc
            with self._lock:
                self._done += 1
                if self._done == self._next and (self._next == len(self._bounds) or self._error is not None):
                    self._finished.set()

    def wait(self) -> None:
        self._finished.wait()
        if self._error is not None:
            raise self._error


def numba_gae(rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, gamma: float, lam: float, *,
              carry_dtype: str = "auto", out: tuple[np.ndarray, np.ndarray] | None = None,
              threads: int | None = None, kernel: str = "unrolled") -> tuple[np.ndarray, np.ndarray]:
    """Run a kernel on C-contiguous [B, T] float arrays; allocates outputs unless ``out`` is given.

    Rows are split into blocks that the calling thread and up to
    ``threads - 1`` pool threads (default: all CPUs of this process) take in
    turn, each block one GIL-free kernel call.
    """
    if carry_dtype == "auto":  # the data's precision
        carry_dtype = "float64" if rewards.dtype == np.float64 else "float32"
    carry = np.float64 if carry_dtype == "float64" else np.float32
    fn = KERNELS[kernel]
    if out is None:
        out = (np.empty_like(rewards), np.empty_like(rewards))
    adv, ret = out
    if mask.dtype == np.bool_:
        mask = mask.view(np.uint8)  # same bytes; one compiled variant for bool and uint8 masks
    scalars = (carry(gamma), carry(gamma * lam), carry(0.0), carry(1.0))
    rows, steps = rewards.shape
    n_threads = available_threads() if threads is None else max(1, int(threads))
    n_blocks = min(rows, n_threads * _BLOCKS_PER_THREAD, rewards.size // _MIN_TOKENS_PER_BLOCK)
    if n_threads <= 1 or n_blocks <= 1:
        fn(rewards, values, mask, *scalars, adv, ret)
        return adv, ret
    edges = np.linspace(0, rows, n_blocks + 1).astype(np.int64)
    blocks = _RowBlocks(lambda lo, hi: fn(rewards[lo:hi], values[lo:hi], mask[lo:hi], *scalars,
                                          adv[lo:hi], ret[lo:hi]),
                        [(int(lo), int(hi)) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo])
    pool = _pool()
    for _ in range(min(n_threads, n_blocks) - 1):
        pool.submit(blocks.work)
    blocks.work()
    blocks.wait()
    return adv, ret


class NumbaGae:
    """``backend="numba"``: the unrolled per-row kernel, rows split over threads."""

    array_kind = "numpy"

    def warmup(self, dtype: str, carry_dtype: str) -> None:
        """Compile (or load from numba's on-disk cache) the kernel for this dtype pair."""
        tiny = np.zeros((1, 5), dtype=dtype)
        numba_gae(tiny, tiny, np.ones((1, 5), np.bool_), 1.0, 1.0, carry_dtype=carry_dtype)

    def compute(self, rewards, values, mask, *, gamma, lam, chunk_size, carry_dtype, threads, out):
        return numba_gae(rewards, values, mask, gamma, lam, carry_dtype=carry_dtype, out=out, threads=threads)
