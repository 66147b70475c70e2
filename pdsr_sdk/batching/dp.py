"""The same micro-batch count on every data-parallel rank.

Ranks that run different numbers of forward/backward passes deadlock in the
collectives of FSDP/Megatron, so every rank must run the same count (verl's
``same_micro_num_in_dp``). Each rank computes its own minimal count, the
ranks agree on the maximum, and each rank re-partitions its samples into that
many micro-batches (``min_micro_batches``), so every rank stays balanced
rather than just padded. Empty micro-batches appear only on a rank with fewer
samples than the agreed count.

Because the balanced partition at a larger count can, rarely, break the cap
and need a still larger one, agreement is a loop: re-partition at the agreed
count, agree again, until no rank asks for more. The count only grows, and a
rank never needs more micro-batches than samples, so the loop ends.
"""

from __future__ import annotations

import operator
import sys
from typing import Any, Callable, Sequence

from pdsr_sdk.batching.partition import (
    DEFAULT_ATTENTION_COEF,
    _check_options,
    _int_option,
    as_lengths,
    partition_lengths,
)
from pdsr_sdk.errors import ConfigValueError, DataValueError


def common_micro_batch_count(counts: Sequence[int]) -> int:
    """The count every rank uses: the maximum of the ranks' counts."""
    counts = list(counts)
    if not counts:
        raise ConfigValueError("common_micro_batch_count: no counts given (expected one per rank)")
    values = []
    for r, c in enumerate(counts):
        try:
            value = operator.index(c)
        except TypeError:
            value = -1
        if isinstance(c, bool) or value < 0:
            raise ConfigValueError(f"common_micro_batch_count: counts[{r}] = {c!r}; expected an integer >= 0")
        values.append(value)
    return max(values)


def pad_micro_batches(partitions: Sequence[Sequence[int]], count: int) -> list[list[int]]:
    """``partitions`` followed by empty micro-batches up to ``count`` (a new list)."""
    count = _int_option("count", count, 0)
    if len(partitions) > count:
        raise DataValueError(f"pad_micro_batches: {len(partitions)} micro-batches already, more than count={count}")
    return [list(p) for p in partitions] + [[] for _ in range(count - len(partitions))]


def all_reduce_max(count: int, group: Any = None) -> int:
    """Max of ``count`` over the ranks of ``group`` through torch.distributed.

    Returns ``count`` unchanged when torch.distributed is not initialised (and
    never imports torch itself: without torch imported there is no process
    group). The tensor goes on the CPU for gloo/mpi and on the current
    accelerator otherwise (NCCL needs CUDA tensors).
    """
    count = int(count)
    if "torch" not in sys.modules:
        return count
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return count
    backend = str(dist.get_backend(group))
    device = torch.device("cpu")
    if "gloo" not in backend and "mpi" not in backend:
        accel = getattr(torch, "accelerator", None)
        current = accel.current_accelerator() if accel is not None else None
        device = current if current is not None else torch.device("cuda", torch.cuda.current_device())
    value = torch.tensor([count], dtype=torch.int64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return int(value.item())


# What a rank that cannot partition its samples passes to the reduce: no rank asks for as many micro-batches.
_FAILED = 2**63 - 1


def _agree(parts: list[list[int]], partition_at: Callable[[int], list[list[int]]],
           reduce_max: Callable[[int], int]) -> list[list[int]]:
    """One rank's side of the agreement loop from its own partition (every rank calls reduce_max equally often)."""
    count = 0
    while True:
        agreed = reduce_max(len(parts))
        if agreed >= _FAILED:
            raise DataValueError("partition_on_rank: another rank of the group could not partition its samples "
                                 "(its own error says why); this rank stops too rather than wait for it")
        if agreed == count:
            return parts
        count = agreed
        if len(parts) != count:
            parts = partition_at(count)


def partition_on_rank(lengths, max_tokens_per_micro_batch: int, *, group: Any = None,
                      min_micro_batches: int = 1, divisible_by: int = 1, balance: str = "tokens",
                      attention_coef: int = DEFAULT_ATTENTION_COEF,
                      reduce_max: Callable[[int], int] | None = None) -> list[list[int]]:
    """This rank's micro-batches, with the count agreed over ``group``.

    Call it on every rank of the group. ``reduce_max`` (default
    :func:`all_reduce_max` over ``group``) returns the maximum of the values
    all ranks pass in; the result has the same length on every rank. A rank
    whose lengths or options are refused still takes part in the first
    reduce before it raises, and every other rank then raises DataValueError
    too, rather than wait in the collective for it.
    """
    reduce = reduce_max if reduce_max is not None else (lambda c: all_reduce_max(c, group=group))
    try:
        cap, min_mb, d, balance, coef = _check_options(
            max_tokens_per_micro_batch, min_micro_batches, divisible_by, balance, attention_coef)
        arr = as_lengths(lengths)
        parts = partition_lengths(arr, cap, min_micro_batches=min_mb, divisible_by=d, balance=balance,
                                  attention_coef=coef, allow_empty=True)
    except (ConfigValueError, DataValueError):
        reduce(_FAILED)  # the other ranks wait in this reduce: a sample too long on one rank hung them all
        raise

    def partition_at(count: int) -> list[list[int]]:
        return partition_lengths(arr, cap, min_micro_batches=max(min_mb, count), divisible_by=d,
                                 balance=balance, attention_coef=coef, allow_empty=True)

    return _agree(parts, partition_at, reduce)


def partition_for_data_parallel(lengths_per_rank: Sequence[Any], max_tokens_per_micro_batch: int, *,
                                min_micro_batches: int = 1, divisible_by: int = 1, balance: str = "tokens",
                                attention_coef: int = DEFAULT_ATTENTION_COEF) -> list[list[list[int]]]:
    """Micro-batches for every rank at once (a single process that sees all ranks).

    ``lengths_per_rank[r]`` are rank r's sample lengths; the result's entry r
    is rank r's micro-batches (indices into its own samples). All entries
    have the same length; see the module docstring for how it is chosen. A
    rank with no samples gets only empty micro-batches.
    """
    cap, min_mb, d, balance, coef = _check_options(
        max_tokens_per_micro_batch, min_micro_batches, divisible_by, balance, attention_coef)
    ranks = [as_lengths(lengths, name=f"lengths_per_rank[{r}]") for r, lengths in enumerate(lengths_per_rank)]
    if not ranks:
        raise ConfigValueError("partition_for_data_parallel: lengths_per_rank is empty (expected one entry per rank)")

    def partition_at(r: int, count: int) -> list[list[int]]:
        try:
            return partition_lengths(ranks[r], cap, min_micro_batches=max(min_mb, count), divisible_by=d,
                                     balance=balance, attention_coef=coef, allow_empty=True)
        except DataValueError as exc:
            raise DataValueError(f"rank {r}: {exc}") from None

    parts = [partition_at(r, 0) for r in range(len(ranks))]
    count = 0
    while True:
        agreed = common_micro_batch_count([len(p) for p in parts])
        if agreed == count:
            return parts
        count = agreed
        parts = [p if len(p) == count else partition_at(r, count) for r, p in enumerate(parts)]
