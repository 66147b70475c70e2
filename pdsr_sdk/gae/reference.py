"""The GAE oracle: a plain float64 loop over time, vectorised over rows only.

This is verl's masked recurrence written out literally, and every fast
backend is tested against it. It is slow on purpose (one numpy step per
timestep); do not optimise it.
"""

from __future__ import annotations

import numpy as np


def reference_gae(rewards, values, mask, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns) in float64 for [B, T] inputs; mask nonzero = valid."""
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    valid = np.asarray(mask) != 0
    rows, steps = r.shape
    adv = np.zeros((rows, steps), dtype=np.float64)
    lastgae = np.zeros(rows, dtype=np.float64)
    next_v = np.zeros(rows, dtype=np.float64)
    for t in range(steps - 1, -1, -1):
        delta = r[:, t] + gamma * next_v - v[:, t]
        cand = delta + gamma * lam * lastgae
        lastgae = np.where(valid[:, t], cand, lastgae)   # masked: carry unchanged
        next_v = np.where(valid[:, t], v[:, t], next_v)
        adv[:, t] = lastgae
    return adv, adv + v


class ReferenceGae:
    """``backend="reference"``: the float64 oracle; results are cast to the input dtype."""

    array_kind = "numpy"

    def warmup(self, dtype: str, carry_dtype: str) -> None:
        """Nothing to compile."""

    def compute(self, rewards, values, mask, *, gamma, lam, chunk_size, carry_dtype, threads, out):
        adv, ret = reference_gae(rewards, values, mask, gamma, lam)
        if out is not None:
            np.copyto(out[0], adv, casting="same_kind")
            np.copyto(out[1], ret, casting="same_kind")
            return out[0], out[1]
        return adv.astype(rewards.dtype, copy=False), ret.astype(rewards.dtype, copy=False)
