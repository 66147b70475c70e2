"""Micro-batch plans for scoring: which samples go together and the padded shape of each forward.

A plan is a list of :class:`MicroBatch` (sample indices, padded rows, padded
sequence length). Three modes:

- ``plan_single``: one forward over everything (rows = n).
- ``plan_fixed``: consecutive slices of ``mbs`` samples in input order; the
  last slice is padded with dummy rows to ``mbs`` (the seeds' "scheme B"), so
  every forward has ``mbs`` rows and the shapes differ only by length bucket.
- ``plan_token_quota``: micro-batches whose computed tokens (rows x padded
  length) stay within a cap, split with :func:`pdsr_sdk.batching.partition_by_tokens`.

Why token quota groups by length first. verl's dynamic batch size balances
*real* token sums with Karmarkar-Karp; that is right for its unpadded
(packed, varlen-attention) forward. A padded forward computes rows x longest
row, and a KK-balanced micro-batch mixes the longest samples with short ones:
on a GRPO-like long-tailed distribution that computes ~3x the real tokens.
So samples are sorted by length and cut into groups of similar length, and
each group is split by ``partition_by_tokens`` on the group's padded length,
so the cap bounds what is actually computed (padding included). Groups are
formed on bucket-rounded lengths (that rounding is paid anyway) and stop
growing when padding to the group's longest would exceed
``max_padding_fraction`` of the group's rounded tokens; hence padding
efficiency >= (real / bucket-rounded tokens) x (1 - max_padding_fraction).
``grouping="none"`` keeps verl's global rule for comparison.

Sequence lengths are rounded up to a multiple of ``length_bucket`` so that
few distinct shapes occur (fewer compilations / allocator shapes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pdsr_sdk.errors import ConfigValueError, DataValueError


@dataclass(frozen=True)
class MicroBatch:
    """One forward: ``indices`` are real samples (rows 0..len-1); rows beyond are dummy rows."""

    indices: tuple[int, ...]
    rows: int
    seq_len: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.seq_len)

    @property
    def computed_tokens(self) -> int:
        return self.rows * self.seq_len


def round_up(n: int, multiple: int) -> int:
    return -(-int(n) // multiple) * multiple


def _micro_batch(indices: Sequence[int], lengths: np.ndarray, length_bucket: int,
                 rows: int | None = None) -> MicroBatch:
    idx = tuple(int(i) for i in indices)
    longest = int(lengths[list(idx)].max())
    return MicroBatch(idx, rows if rows is not None else len(idx), round_up(longest, length_bucket))


def plan_single(lengths: np.ndarray, *, length_bucket: int) -> list[MicroBatch]:
    """Everything in one forward, padded to the longest sample."""
    if len(lengths) == 0:
        return []
    return [_micro_batch(range(len(lengths)), lengths, length_bucket)]


def plan_fixed(lengths: np.ndarray, mbs: int, *, length_bucket: int) -> list[MicroBatch]:
    """Slices of ``mbs`` in input order; the tail slice is padded to ``mbs`` rows (scheme B)."""
    if mbs < 1:
        raise ConfigValueError(f"mbs: expected an integer >= 1, got {mbs}")
    n = len(lengths)
    return [_micro_batch(range(s, min(s + mbs, n)), lengths, length_bucket, rows=mbs) for s in range(0, n, mbs)]


def length_groups(lengths: np.ndarray, max_padding_fraction: float) -> list[np.ndarray]:
    """Sorted (longest first) runs of samples whose padding to the run's longest stays within the fraction.

    ``lengths`` are the costs to group (the scorer passes bucket-rounded lengths).

    A run starting at length L_0 takes the next (shorter) sample j while
    ``sum(run) + L_j >= (1 - max_padding_fraction) * (len(run) + 1) * L_0``.
    """
    order = np.argsort(-lengths, kind="stable")
    groups: list[np.ndarray] = []
    start, total = 0, 0
    keep = 1.0 - max_padding_fraction
    for pos, i in enumerate(order):
        length = int(lengths[i])
        if pos > start:
            head = int(lengths[order[start]])
            if total + length < keep * (pos - start + 1) * head:
                groups.append(order[start:pos])
                start, total = pos, 0
        total += length
    if len(order):
        groups.append(order[start:])
    return groups


def plan_token_quota(lengths: np.ndarray, max_tokens: int, *, length_bucket: int, grouping: str = "length",
                     max_padding_fraction: float = 0.03) -> tuple[list[MicroBatch], list[list[int]]]:
    """Micro-batches under a token quota; returns (plan, partitions) where partitions[m] == plan[m].indices.

    ``grouping="length"``: every micro-batch computes at most ``max_tokens``
    tokens including padding. ``grouping="none"``: real token sums stay within
    the cap (verl's rule); the padded forward may compute more.
    """
    from pdsr_sdk.batching import partition_by_tokens

    if max_tokens < 1:
        raise ConfigValueError(f"max_tokens_per_micro_batch: expected an integer >= 1, got {max_tokens}")
    padded = np.array([round_up(x, length_bucket) for x in lengths], dtype=np.int64)
    cost = padded if grouping == "length" else lengths
    too_long = np.flatnonzero(cost > max_tokens)
    if too_long.size:
        i = int(too_long[0])
        raise DataValueError(
            f"sample {i}: prompt + completion = {int(lengths[i])} tokens"
            + (f" (padded to {int(padded[i])}, a multiple of length_bucket={length_bucket})"
               if grouping == "length" else "")
            + f" does not fit max_tokens_per_micro_batch={max_tokens}; raise the quota"
            + (f" ({too_long.size} samples are too long)" if too_long.size > 1 else ""))
    if grouping == "none":
        partitions = partition_by_tokens(lengths, max_tokens)
    elif grouping == "length":
        partitions = []
        # Grouping on padded lengths: the length-bucket rounding is paid anyway;
        # a group adds at most max_padding_fraction on top of it.
        for group in length_groups(padded, max_padding_fraction):
            # Every sample in the group costs the group's padded length, so the
            # partition's token sums are exactly the rows x seq_len it computes.
            group_cost = np.full(len(group), padded[group[0]], dtype=np.int64)
            for part in partition_by_tokens(group_cost, max_tokens):
                partitions.append(sorted(int(group[j]) for j in part))
    else:
        raise ConfigValueError(f"token_grouping: expected 'length' or 'none', got {grouping!r}")
    plan = [_micro_batch(part, lengths, length_bucket) for part in partitions]
    return plan, [list(mb.indices) for mb in plan]


def request_blocks(lengths: np.ndarray, *, mbs: int | None = None, max_tokens: int | None = None) -> list[list[int]]:
    """Consecutive blocks of samples in input order, for backends that batch unpadded (vLLM).

    ``mbs`` samples per block, or as many consecutive samples as fit
    ``max_tokens`` real tokens, or everything in one block. No reordering and
    no partitioner: the engine schedules its own batches, blocks only bound
    what one call submits (and pace the progress bar).
    """
    n = len(lengths)
    if n == 0:
        return []
    if mbs is not None:
        return [list(range(s, min(s + mbs, n))) for s in range(0, n, mbs)]
    if max_tokens is None:
        return [list(range(n))]
    too_long = np.flatnonzero(lengths > max_tokens)
    if too_long.size:
        i = int(too_long[0])
        raise DataValueError(f"sample {i}: prompt + completion = {int(lengths[i])} tokens does not fit "
                        f"max_tokens_per_micro_batch={max_tokens}; raise the quota")
    blocks, current, total = [], [], 0
    for i, length in enumerate(lengths.tolist()):
        if current and total + length > max_tokens:
            blocks.append(current)
            current, total = [], 0
        current.append(i)
        total += length
    blocks.append(current)
    return blocks


def plan_packed(lengths: np.ndarray, *, mbs: int | None = None, max_tokens: int | None = None) -> list[MicroBatch]:
    """Packed micro-batches: each is ONE row of concatenated samples, no padding (rows=1, seq_len = real tokens).

    ``max_tokens``: the fewest balanced micro-batches whose real tokens stay
    within the budget (:func:`pdsr_sdk.batching.partition_by_tokens`, verl's
    rule, made for exactly this unpadded forward); ``mbs``: consecutive
    blocks of ``mbs`` samples; neither: everything in one row.
    """
    from pdsr_sdk.batching import partition_by_tokens

    n = len(lengths)
    if n == 0:
        return []
    if max_tokens is not None:
        if max_tokens < 1:
            raise ConfigValueError(f"max_tokens_per_micro_batch: expected an integer >= 1, got {max_tokens}")
        too_long = np.flatnonzero(lengths > max_tokens)
        if too_long.size:
            i = int(too_long[0])
            raise DataValueError(f"sample {i}: prompt + completion = {int(lengths[i])} tokens does not fit "
                            f"max_tokens_per_micro_batch={max_tokens}; raise the quota"
                            + (f" ({too_long.size} samples are too long)" if too_long.size > 1 else ""))
        partitions = partition_by_tokens(lengths, int(max_tokens))
    elif mbs is not None:
        if mbs < 1:
            raise ConfigValueError(f"mbs: expected an integer >= 1, got {mbs}")
        partitions = [list(range(s, min(s + mbs, n))) for s in range(0, n, mbs)]
    else:
        partitions = [list(range(n))]
    return [MicroBatch(tuple(int(i) for i in part), 1, int(lengths[list(part)].sum())) for part in partitions]


def plan_stats(plan: Sequence[MicroBatch]) -> dict[str, int]:
    """Micro-batch count, distinct (rows, seq_len) shapes and computed tokens of a plan."""
    return {
        "micro_batches": len(plan),
        "distinct_shapes": len({mb.shape for mb in plan}),
        "computed_tokens": int(sum(mb.computed_tokens for mb in plan)),
    }
