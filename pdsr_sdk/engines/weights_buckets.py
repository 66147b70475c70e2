"""An update's weights in buckets of bounded size, as slime and verl send a large model's: at most
``bucket_bytes`` of tensors (or one tensor bigger than that) staged at a time, so shared memory holds a bucket,
not the model.

:func:`stage_update` yields what the engines load, in order: one :class:`~pdsr_sdk.engines.weights.StagedWeights`
for an update that fits in one bucket (the session's kept block, CUDA IPC: the one-block path), else one per
bucket, each carrying its :class:`~pdsr_sdk.engines.weights.WeightsBucket`. Every bucket is written into the same
block of the bucket's size (the session's kept one), rewritten in place for the next.

Checks: a state dict's names, shapes and tensors are all checked before the first bucket is yielded (nothing
changes on a bad one). An iterator of pairs is consumed a bucket at a time (never materialised); each bucket is
checked before it is yielded, and the tensors missing from the update after the last one is taken. A bad bucket
after the first raises when earlier buckets have been loaded: the caller (the session) reports the engines'
partial update.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

from pdsr_sdk.engines.weights import (StagedWeights, WeightsBlock, WeightsBucket, check_items, checked_pairs,
                                      stage_weights)
from pdsr_sdk.engines.weights_check import ModelWeights
from pdsr_sdk.errors import DataValueError

#: the default bucket size (RolloutConfig.weights_bucket_bytes): 1 GiB, as slime's default buffer
DEFAULT_BUCKET_BYTES = 1 << 30


def nbytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


def stage_update(weights: Any, reference: ModelWeights, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 block: WeightsBlock | None = None) -> Iterator[StagedWeights]:
    """The staged parts of one update of ``weights`` (a state dict, an iterable of ``(name, tensor)``, a model
    folder), checked against ``reference``; see the module docstring."""
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise DataValueError(f"update_weights: bucket_bytes must be a positive int; got {bucket_bytes!r}")
    if isinstance(weights, (str, os.PathLike, Path, Mapping)):
        whole = stage_weights(weights, reference, block=block)   # a folder is read by each engine itself
        items = whole.items
        if items is None or sum(nbytes(t) for _, t in items) <= bucket_bytes:
            yield whole
            return
        for i, (chunk, last) in enumerate(_buckets(iter(items), bucket_bytes)):
            yield StagedWeights(items=chunk, block=block, bucket=WeightsBucket(i, last), min_size=bucket_bytes)
        return
    seen: set[str] = set()
    tied: dict[str, Any] = {}    # a tied head and its embedding may come in different buckets
    pairs = checked_pairs(weights)
    index = 0
    for chunk, last in _buckets(pairs, bucket_bytes):
        what = "update_weights" if index == 0 and last else f"update_weights (bucket {index})"
        chunk = check_items(chunk, reference, what=what, seen=seen, complete=last, tied=tied)
        if index == 0 and last:
            yield StagedWeights(items=chunk, block=block)
            return
        yield StagedWeights(items=chunk, block=block, bucket=WeightsBucket(index, last), min_size=bucket_bytes)
        index += 1
    if index == 0:
        raise DataValueError("update_weights: no tensors given")


def update_bytes(reference: ModelWeights, first: StagedWeights) -> int:
    """About how many bytes a whole update takes (what a staggered update keeps of one sent in buckets): every
    parameter of ``reference`` at the element size of ``first``'s tensors (the trainer's dtype, not the
    checkpoint's)."""
    size = first.items[0][1].element_size() if first.items else 4
    return sum(math.prod(shape) * size for shape, _ in reference.shapes.values())


def _buckets(pairs: Iterator[tuple[str, Any]], bucket_bytes: int) -> Iterator[tuple[list[tuple[str, Any]], bool]]:
    """Consecutive runs of ``pairs`` of at most ``bucket_bytes`` (a bigger tensor alone), each with whether it is
    the last, taken lazily: a run is handed on when the pair after it is taken (one tensor ahead, not a bucket)."""
    chunk: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in pairs:
        n = nbytes(tensor)
        if chunk and size + n > bucket_bytes:
            yield chunk, False
            chunk, size = [], 0
        chunk.append((name, tensor))
        size += n
    if chunk:
        yield chunk, True
