"""GRPO group-normalised advantages (one scalar per sample).

``adv_i = (r_i - mean_g) / (std_g + eps)`` over the samples of i's group g,
or ``r_i - mean_g`` with ``normalize_std=False``.

- ``std_g`` is the unbiased (n-1) standard deviation, as verl's
  ``compute_grpo_outcome_advantage`` (``torch.std``) uses.
- A group of size 1 gets advantage 0 by default (``singleton="zero"``):
  the sample is its own mean, so it carries no relative signal. verl's
  ``compute_grpo_outcome_advantage`` instead takes mean 0 and std 1 for
  such a group, so the sample keeps its score, ``r / (1 + eps)`` (``r``
  with ``normalize_std=False``): ``singleton="score"`` gives those numbers.
  A group whose rewards are all equal gets 0.
- Per-token advantages, as verl returns them, are ``adv[:, None] * mask``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pdsr_sdk.gae.inputs import check_singleton, group_index, read_rewards


def grpo_advantages(rewards: Any, group_ids: Any, *, normalize_std: bool = True, eps: float = 1e-6,
                    singleton: str = "zero") -> Any:
    """Group-normalised advantages of [N] rewards grouped by [N] ``group_ids`` (any sortable ids).

    ``singleton``: the advantage of a sample alone in its group: ``"zero"`` (default), or ``"score"``, verl's
    (its reward, divided by ``1 + eps`` when ``normalize_std``).

    Statistics are computed in float64; the result is float64 for float64
    rewards and float32 otherwise (a float32 tensor gives float32), a numpy
    array or (for a tensor input) a tensor on the rewards' device.

    A reward that is None or not a number (a sample whose reward function
    raised has reward None; its error is in the step result's
    ``scores[i].error`` and the table's ``reward_error`` column) is a
    :class:`~pdsr_sdk.errors.DataValueError` naming the first such entries.
    """
    check_singleton(singleton)
    r = read_rewards(rewards)
    x = r.values
    inverse, counts = group_index(group_ids, x.size)
    if x.size == 0:
        return r.output(x)
    mean = np.bincount(inverse, weights=x) / counts
    alone = counts == 1
    if singleton == "score":    # verl's mean 0 (and std 1 below) for a group of one
        mean[alone] = 0.0
    centered = x - mean[inverse]                        # "zero": exactly 0 for singleton groups
    if normalize_std:
        sq = np.bincount(inverse, weights=centered * centered)
        std = np.sqrt(sq / np.maximum(counts - 1.0, 1.0))   # unbiased; singleton: 0
        if singleton == "score":
            std[alone] = 1.0
        centered = centered / (std[inverse] + eps)
    return r.output(centered)
