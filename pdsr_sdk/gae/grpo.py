"""GRPO group-normalised advantages (one scalar per sample).

``adv_i = (r_i - mean_g) / (std + eps)`` with ``mean_g`` the mean of i's group g and ``std`` by
``normalize_std``:

- ``True`` or ``"group"`` (default): the unbiased (n-1) standard deviation of the group, as verl's
  ``compute_grpo_outcome_advantage`` (``torch.std``) and TRL's ``scale_rewards="group"`` use.
- ``"batch"``: the unbiased standard deviation of all N rewards, one number for the whole batch (TRL's
  ``scale_rewards="batch"``, Lite PPO's group mean with the batch's std), so a group whose rewards spread
  little is not scaled up.
- ``False`` or ``"none"``: ``r_i - mean_g`` (Dr. GRPO; verl's ``norm_adv_by_std_in_grpo=False``).

- A group of size 1 gets advantage 0 by default (``singleton="zero"``):
  the sample is its own mean, so it carries no relative signal. verl's
  ``compute_grpo_outcome_advantage`` instead takes mean 0 and std 1 for
  such a group, so the sample keeps its score, ``r / (1 + eps)`` (``r``
  with ``normalize_std=False``): ``singleton="score"`` gives those numbers (with ``"batch"``, its mean 0
  and the batch's std). A group whose rewards are all equal gets 0.
- Per-token advantages, as verl returns them, are ``adv[:, None] * mask``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pdsr_sdk.errors import ConfigValueError
from pdsr_sdk.gae.inputs import read_groups

#: normalize_std's values beside True (= "group") and False (= "none"), as TRL's scale_rewards names them
STD_SCALES = ("group", "batch", "none")


def grpo_advantages(rewards: Any, group_ids: Any, *, normalize_std: bool | str = True, eps: float = 1e-6,
                    singleton: str = "zero") -> Any:
    """Group-normalised advantages of [N] rewards grouped by [N] ``group_ids`` (any sortable ids).

    ``normalize_std``: the std the centred reward is divided by: its group's (``True`` or ``"group"``,
    default), the whole batch's (``"batch"``), or none (``False`` or ``"none"``). ``eps``, a number >= 0, is added
    to it (verl's 1e-6; TRL's is 1e-4); with ``eps=0`` a group (or batch) whose rewards are all equal still gets 0.

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
    scale = _std_scale(normalize_std)
    _check_eps(eps)
    r, x, inverse, counts = read_groups(rewards, group_ids, singleton)
    if x.size == 0:
        return r.output(x)
    mean = np.bincount(inverse, weights=x) / counts
    alone = counts == 1
    if singleton == "score":    # verl's mean 0 (and std 1 below) for a group of one
        mean[alone] = 0.0
    centered = x - mean[inverse]                        # "zero": exactly 0 for singleton groups
    if scale == "group":
        sq = np.bincount(inverse, weights=centered * centered)
        std = np.sqrt(sq / np.maximum(counts - 1.0, 1.0))   # unbiased; singleton: 0
        if singleton == "score":
            std[alone] = 1.0
        centered = _divide(centered, std[inverse] + eps)
    elif scale == "batch":      # one reward alone has no spread: std 0, as TRL's
        centered = _divide(centered, np.full_like(x, (np.std(x, ddof=1) if x.size > 1 else 0.0) + eps))
    return r.output(centered)


def _divide(centered: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``centered / scale``, 0 where ``scale`` is 0 (``eps=0`` and no spread: 0 / 0, which would be NaN)."""
    return np.divide(centered, scale, out=np.zeros_like(centered), where=scale > 0)


def _check_eps(eps: Any) -> None:
    try:
        ok = not isinstance(eps, (bool, str)) and math.isfinite(float(eps)) and float(eps) >= 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigValueError(f"eps: expected a finite number >= 0 (added to the std: verl's 1e-6, TRL's 1e-4), "
                               f"got {eps!r}")


def _std_scale(normalize_std: Any) -> str:
    if isinstance(normalize_std, (bool, np.bool_)):
        return "group" if normalize_std else "none"
    if isinstance(normalize_std, str) and normalize_std in STD_SCALES:
        return normalize_std
    raise ConfigValueError(f"normalize_std: expected True, False or one of {', '.join(map(repr, STD_SCALES))}, "
                           f"got {normalize_std!r}")
