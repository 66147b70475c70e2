"""Outcome advantages beside GRPO, with verl's semantics (``verl/trainer/ppo/core_algos.py``):

- :func:`rloo_advantages` (verl's ``rloo``): one number per sample, its reward less the mean reward of
  the other samples of its group, ``n / (n - 1) * (r_i - mean_g)``.
- :func:`reinforce_pp_advantages` (``reinforce_plus_plus``): per token, the discounted return over the
  response's valid tokens, masked ones skipped as GAE (:func:`~pdsr_sdk.gae.compute_gae`) skips them,
  whitened over every valid token of the batch (:func:`~pdsr_sdk.gae.masked_whiten`), 0 on masked tokens.
  verl's loop did this since its PR #7300 (August 2026); before, it reset the return at every masked token,
  so a token before a multi-turn response's tool output got nothing of the reward after it.
- :func:`reinforce_pp_baseline_advantages` (``reinforce_plus_plus_baseline``): the reward less its
  group's mean, on each valid token of the sample, whitened over every valid token of the batch (so a
  longer response weighs more in the mean and variance).

A group of one: ``singleton="zero"`` (the default, as for :func:`~pdsr_sdk.gae.grpo_advantages`) takes the
sample as its own baseline, 0 before any whitening; ``singleton="score"`` is verl's ``rloo`` and
``reinforce_plus_plus_baseline`` (a baseline of 0: the sample keeps its reward). verl's ``rloo_vectorized``
gives such a sample 0, as ``"zero"`` does.

Inputs and outputs follow :mod:`pdsr_sdk.gae.inputs`: float64 statistics, float64 out for float64 rewards
and float32 otherwise, a tensor on the rewards' device for a tensor input.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pdsr_sdk.errors import DataValueError
from pdsr_sdk.gae.inputs import check_unit_interval, read_groups, read_mask, read_rewards
from pdsr_sdk.gae.whiten import masked_whiten


def rloo_advantages(rewards: Any, group_ids: Any, *, singleton: str = "zero") -> Any:
    """RLOO advantages of [N] rewards grouped by [N] ``group_ids`` (any sortable ids): ``r_i`` less the mean of
    the other rewards of its group. ``singleton``: a sample alone in its group gets ``"zero"`` (default; verl's
    ``rloo_vectorized``) or ``"score"``, its reward (verl's ``rloo``).

    One number per sample, as :func:`~pdsr_sdk.gae.grpo_advantages`; verl's per-token form is
    ``adv[:, None] * response_mask``. A reward that is None or not a number is a DataValueError naming it.
    """
    r, x, inverse, counts = read_groups(rewards, group_ids, singleton)
    if x.size == 0:
        return r.output(x)
    n = counts[inverse]
    centered = x - (np.bincount(inverse, weights=x) / counts)[inverse]
    alone = x if singleton == "score" else np.zeros_like(x)
    return r.output(np.where(n > 1, centered * n / np.maximum(n - 1.0, 1.0), alone))


def reinforce_pp_advantages(rewards: Any, mask: Any, *, gamma: float = 1.0) -> tuple[Any, Any]:
    """REINFORCE++ advantages and returns, each [N, T], for a [N, T] response ``mask`` (nonzero = valid token).

    ``rewards``: [N, T] per-token rewards, or [N], one per sample, placed on the sample's last valid token
    (as ``pdsr gae`` places them). Returns ``(advantages, returns)``: ``returns`` the discounted returns
    ``G_t = r_t + gamma * G_next`` on each valid token, ``G_next`` that of the next valid token (0 after the
    last), rewards on masked tokens ignored, 0 on masked tokens; ``advantages`` those whitened over all valid
    tokens of the batch (unbiased variance, eps 1e-8), 0 on masked tokens. ``gamma`` is verl's
    ``algorithm.gamma``, in [0, 1].

    A [N] reward other than 0 on a row with no valid token (nowhere to place it), or a mask with fewer than
    2 valid tokens (no variance to whiten by), is a DataValueError naming it.
    """
    check_unit_interval("gamma", gamma)
    r = read_rewards(rewards, ndims=(1, 2), what="[N] (one scalar per sample) or [N, T] (per-token rewards)")
    valid = read_mask(mask, r.values.shape[0])
    token = _on_last_valid(r.values, valid) if r.values.ndim == 1 else r.values
    if token.shape != valid.shape:
        raise DataValueError(f"mask has shape {valid.shape}, expected the shape of rewards {token.shape}")
    _check_whitenable(valid, "REINFORCE++")
    returns = np.zeros_like(token)
    running = np.zeros(token.shape[0])
    gamma = float(gamma)
    for t in range(token.shape[1] - 1, -1, -1):
        step = token[:, t] + gamma * running
        returns[:, t] = np.where(valid[:, t], step, 0.0)
        running = np.where(valid[:, t], step, running)     # a masked token passes the return on unchanged
    return r.output(np.where(valid, masked_whiten(returns, valid), 0.0)), r.output(returns)


def reinforce_pp_baseline_advantages(rewards: Any, group_ids: Any, mask: Any, *, singleton: str = "zero") -> Any:
    """REINFORCE++-baseline advantages, [N, T]: each sample's reward less its group's mean, on every valid token
    of the sample, whitened over all valid tokens of the batch (unbiased variance, eps 1e-8), 0 on masked ones.

    ``rewards`` [N] and ``group_ids`` [N] as for :func:`~pdsr_sdk.gae.grpo_advantages`; ``mask`` [N, T] the
    response mask (nonzero = valid token). ``singleton``: the baseline of a sample alone in its group, itself
    (``"zero"``, default: 0 before whitening) or 0 (``"score"``: its reward, verl's). A row with no valid token
    still counts in its group's mean, as in verl, and gets 0. A mask with fewer than 2 valid tokens is a
    DataValueError.
    """
    r, x, inverse, counts = read_groups(rewards, group_ids, singleton)
    valid = read_mask(mask, x.size)
    _check_whitenable(valid, "REINFORCE++-baseline")
    mean = np.bincount(inverse, weights=x) / counts
    if singleton == "score":
        mean[counts == 1] = 0.0
    tokens = (x - mean[inverse])[:, None] * valid
    return r.output(np.where(valid, masked_whiten(tokens, valid), 0.0))


def _on_last_valid(rewards: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """[N] rewards as [N, T] token rewards on each row's last valid token."""
    token = np.zeros(valid.shape)
    has = valid.any(axis=1)
    lost = np.flatnonzero(~has & (rewards != 0))
    if lost.size:
        shown = ", ".join(f"rewards[{i}] = {rewards[i]:g}" for i in lost[:5]) + (", ..." if lost.size > 5 else "")
        raise DataValueError(f"{lost.size} reward(s) other than 0 on a mask row with no valid token, nowhere to "
                             f"place them: {shown}")
    last = valid.shape[1] - 1 - np.argmax(valid[:, ::-1], axis=1)
    rows = np.flatnonzero(has)
    token[rows, last[rows]] = rewards[rows]
    return token


def _check_whitenable(valid: np.ndarray, what: str) -> None:
    n = int(valid.sum())
    if n < 2:
        raise DataValueError(f"mask has {n} valid token{'' if n == 1 else 's'} in all; {what} whitens over the "
                             f"batch's valid tokens and needs at least 2")
