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

from pdsr_sdk.errors import ConfigValueError, DataValueError


SINGLETONS = ("zero", "score")


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
    if singleton not in SINGLETONS:
        raise ConfigValueError(f"singleton: expected one of {', '.join(SINGLETONS)}, got {singleton!r}")
    tensor_in = type(rewards).__module__.startswith("torch")
    if tensor_in:
        out_dtype = np.float64 if str(rewards.dtype) == "torch.float64" else np.float32
        r_np = rewards.detach().cpu().double().numpy()
    else:
        r_np = np.asarray(rewards)
        if r_np.dtype.kind in "OUS":     # None (a reward that raised) or text among the rewards
            r_np = _numeric_or_raise(r_np if isinstance(rewards, np.ndarray) else np.array(rewards, dtype=object))
        out_dtype = np.float64 if r_np.dtype == np.float64 else np.float32
    ids = group_ids.detach().cpu().numpy() if type(group_ids).__module__.startswith("torch") else np.asarray(group_ids)
    if r_np.ndim != 1:
        raise DataValueError(f"rewards must be 1-D [N] (one scalar per sample), got shape {r_np.shape}")
    if ids.shape != r_np.shape:
        raise DataValueError(f"group_ids has shape {ids.shape}, expected the shape of rewards {r_np.shape}")
    if not (np.issubdtype(r_np.dtype, np.floating) or np.issubdtype(r_np.dtype, np.integer)
            or r_np.dtype == np.bool_):
        raise DataValueError(f"rewards must be numeric, got dtype {r_np.dtype}")
    if r_np.size == 0:
        result = np.zeros(0, dtype=out_dtype)
    else:
        x = r_np.astype(np.float64)
        _, inverse = np.unique(ids, return_inverse=True)
        inverse = inverse.reshape(-1)
        counts = np.bincount(inverse).astype(np.float64)
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
        result = centered.astype(out_dtype)
    if tensor_in:
        import torch

        return torch.from_numpy(result).to(rewards.device)
    return result


def _numeric_or_raise(r_np: np.ndarray) -> np.ndarray:
    """An object array of numbers as float64; else a DataValueError naming the first entries that are None
    or not numbers (a reward that raised is None in a step's result)."""
    flat = r_np.reshape(-1)
    bad = [i for i, v in enumerate(flat)
           if v is None or isinstance(v, (str, bytes)) or not isinstance(v, (int, float, np.number, bool))]
    if not bad:
        return r_np.astype(np.float64)
    shown = ", ".join(f"rewards[{i}] = {flat[i]!r}" for i in bad[:5]) + (", ..." if len(bad) > 5 else "")
    none_hint = ("; a sample whose reward function raised has reward None: its error is in the step result's "
                 "scores[i].error (the table's reward_error column); leave those samples out or give them a "
                 "reward" if any(flat[i] is None for i in bad) else "")
    raise DataValueError(f"rewards must be numbers; {len(bad)} of {flat.size} "
                         f"{'is' if len(bad) == 1 else 'are'} not: {shown}{none_hint}")
