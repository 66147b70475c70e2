"""Replay of V2.5's rank-based offloading on recorded lengths (seed 002's dispatch table), as a pure function on
a [G, N] array of lengths (column 0 the probe), with ``stats``' conventions for batches and counts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pdsr_sdk.analysis.stats import as_matrix, batch_blocks, cap_tokens, offload_count


@dataclass(frozen=True)
class DispatchCounts:
    """Sample counts of a V2.5 rank-based offloading replay (the seed's dispatch table)."""

    batch_prompts: int
    offload_fraction: float
    cap_multiplier: float
    batches: int
    samples: int
    heavy_prompts: int     # prompts offloaded (the unit of seed 002's table)
    heavy: int             # samples of offloaded prompts (all N samples, probe included)
    fast: int              # samples of prompts kept on the fast pool (probe included)
    fast_broke: int        # fast samples longer than the batch's cap -> break, retried on heavy
    fast_prompts: int      # prompts kept on the fast pool
    fast_prompts_broke: int  # ... with at least one sample that breaks (the seed table's "熔断重试")
    tokens: int            # total response tokens of the trace
    wasted_tokens: int     # tokens fast samples generated before breaking (cap per break)
    l_cut: np.ndarray      # int64 [batches]: probe length of the shortest offloaded prompt
    cap: np.ndarray        # int64 [batches]: floor(cap_multiplier * l_cut)

    @property
    def fast_ok(self) -> int:
        return self.fast - self.fast_broke

    @property
    def fast_prompts_ok(self) -> int:
        return self.fast_prompts - self.fast_prompts_broke


def dispatch_v25(lengths, batch_prompts: int = 16, offload_fraction: float = 0.2,
                 cap_multiplier: float = 1.5) -> DispatchCounts:
    """Replay V2.5 rank-based offloading on recorded lengths.

    Per batch of B consecutive prompts: sort by probe length (longest first,
    ties by group order: one fixed tie order, which does not look at the
    later samples, so it does not favour the probe the way a shared tie
    rule favours top-K recall; it is one draw, not an expectation) and offload
    the first ``floor(offload_fraction * B)`` (at least 1) prompts, all their
    N samples, to the heavy pool. ``L_cut`` is the probe
    length of the last (shortest) offloaded prompt, and every sample of the
    remaining prompts runs on the fast pool with the cap
    ``floor(cap_multiplier * L_cut)``; a fast sample longer than the cap breaks
    (and is retried on heavy, having generated ``cap`` tokens first).
    A shorter last batch offloads ``floor(offload_fraction * its size)`` prompts (at least 1).
    """
    x = as_matrix(lengths, min_n=1).astype(np.int64)
    n = x.shape[1]
    heavy = broke = wasted = fast_prompts = prompts_broke = 0
    l_cuts, caps = [], []
    for block in batch_blocks(x, batch_prompts):
        nb, b, _ = block.shape
        n_heavy = offload_count(offload_fraction, b)
        order = np.argsort(-block[:, :, 0], axis=1, kind="stable")
        is_heavy = np.zeros((nb, b), dtype=bool)
        np.put_along_axis(is_heavy, order[:, :n_heavy], True, axis=1)
        l_cut = np.take_along_axis(block[:, :, 0], order[:, n_heavy - 1: n_heavy], axis=1)[:, 0]
        cap = cap_tokens(cap_multiplier, l_cut)
        breaks = (block > cap[:, None, None]) & ~is_heavy[:, :, None]
        per_batch = breaks.sum(axis=(1, 2))
        fast_prompts += int((~is_heavy).sum())
        prompts_broke += int(breaks.any(axis=2).sum())
        heavy += int(is_heavy.sum()) * n
        broke += int(per_batch.sum())
        wasted += int((per_batch * cap).sum())
        l_cuts.append(l_cut)
        caps.append(cap)
    samples = int(x.size)
    l_cut_all = np.concatenate(l_cuts)
    return DispatchCounts(batch_prompts=batch_prompts, offload_fraction=offload_fraction, cap_multiplier=cap_multiplier,
                          batches=int(l_cut_all.size), samples=samples, heavy_prompts=heavy // n, heavy=heavy,
                          fast=samples - heavy,
                          fast_broke=broke, fast_prompts=fast_prompts, fast_prompts_broke=prompts_broke,
                          tokens=int(x.sum()), wasted_tokens=wasted, l_cut=l_cut_all,
                          cap=np.concatenate(caps))
