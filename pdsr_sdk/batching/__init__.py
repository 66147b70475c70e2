"""Token-quota micro-batching (dynamic batch size) for trainers.

``partition_by_tokens`` splits samples into the fewest balanced micro-batches
under a token cap; ``restore_order`` puts per micro-batch outputs back in
sample order; the data-parallel helpers give every rank the same count;
``partition_equal_size`` spreads a batch over ranks, the same number each.
Numba is imported only when a partition is first computed.
"""

from __future__ import annotations

from pdsr_sdk.batching.dp import (
    all_reduce_max,
    common_micro_batch_count,
    pad_micro_batches,
    partition_for_data_parallel,
    partition_on_rank,
)
from pdsr_sdk.batching.equal import partition_equal_size
from pdsr_sdk.batching.partition import (
    DEFAULT_ATTENTION_COEF,
    inverse_permutation,
    partition_by_tokens,
    restore_order,
)

__all__ = [
    "DEFAULT_ATTENTION_COEF",
    "all_reduce_max",
    "common_micro_batch_count",
    "inverse_permutation",
    "pad_micro_batches",
    "partition_by_tokens",
    "partition_equal_size",
    "partition_for_data_parallel",
    "partition_on_rank",
    "restore_order",
]
