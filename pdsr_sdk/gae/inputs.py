"""Reading the inputs of the advantage estimators (GRPO, RLOO, REINFORCE++): rewards, group ids, a response
mask, each a numpy array, a torch tensor or a list; and giving the result back in the rewards' kind.

The dtype rule of them all: statistics in float64; the result float64 for float64 rewards and float32
otherwise, a numpy array, or a tensor on the rewards' device for a tensor input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pdsr_sdk.errors import ConfigValueError, DataValueError

#: what a sample alone in its group gets: 0, or (verl's) a mean of 0, so its own score
SINGLETONS = ("zero", "score")


@dataclass(frozen=True)
class Rewards:
    """Rewards as float64, and how to give a result back (numpy, or a tensor on ``device``)."""

    values: np.ndarray
    out_dtype: type
    device: Any = None          # None: numpy in, numpy out

    def output(self, result: np.ndarray) -> Any:
        result = result.astype(self.out_dtype)
        if self.device is None:
            return result
        import torch

        return torch.from_numpy(result).to(self.device)


def is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def check_singleton(singleton: Any) -> None:
    if singleton not in SINGLETONS:
        raise ConfigValueError(f"singleton: expected one of {', '.join(SINGLETONS)}, got {singleton!r}")


def check_unit_interval(key: str, value: Any) -> None:
    """A ConfigValueError naming ``key`` unless ``value`` is a number in [0, 1] (gamma, lambda)."""
    try:
        ok = 0.0 <= float(value) <= 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigValueError(f"{key}: expected a number in [0, 1], got {value!r}")


def read_rewards(rewards: Any, ndims: tuple[int, ...] = (1,), what: str = "[N] (one scalar per sample)") -> Rewards:
    """``rewards`` as float64 of one of ``ndims`` dimensions; a None or text entry is a DataValueError naming the
    first such entries (a sample whose reward function raised has reward None)."""
    if is_tensor(rewards):
        out_dtype = np.float64 if str(rewards.dtype) == "torch.float64" else np.float32
        r_np, device = rewards.detach().cpu().double().numpy(), rewards.device
    else:
        try:
            r_np, device = np.asarray(rewards), None
        except ValueError as err:    # numpy refuses rows of different lengths
            raise DataValueError(f"rewards must be {what}, rows of one length: {err}") from None
        if r_np.dtype.kind in "OUS":     # None (a reward that raised) or text among the rewards
            r_np = _numeric_or_raise(r_np if isinstance(rewards, np.ndarray) else np.array(rewards, dtype=object))
        out_dtype = np.float64 if r_np.dtype == np.float64 else np.float32
    if r_np.ndim not in ndims:
        raise DataValueError(f"rewards must be {'-D or '.join(map(str, ndims))}-D {what}, got shape {r_np.shape}")
    if not (np.issubdtype(r_np.dtype, np.floating) or np.issubdtype(r_np.dtype, np.integer)
            or r_np.dtype == np.bool_):
        raise DataValueError(f"rewards must be numeric, got dtype {r_np.dtype}")
    values = r_np.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(values.reshape(-1)))
    if bad.size:    # one NaN would turn every advantage its group or batch statistics touch into NaN
        index = (lambda i: f"{i}") if values.ndim <= 1 else (
            lambda i: ", ".join(map(str, np.unravel_index(i, values.shape))))
        shown = ", ".join(f"rewards[{index(i)}] = {values.reshape(-1)[i]}" for i in bad[:5])
        raise DataValueError(f"rewards must be finite numbers; {bad.size} of {values.size} "
                             f"{'is' if bad.size == 1 else 'are'} not: {shown}{', ...' if bad.size > 5 else ''}")
    return Rewards(values, out_dtype, device)


def group_index(group_ids: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's group as 0..G-1 (``inverse``, [N]) and each group's size (``counts``, [G], float64)."""
    ids = group_ids.detach().cpu().numpy() if is_tensor(group_ids) else np.asarray(group_ids)
    if ids.shape != (n,):
        raise DataValueError(f"group_ids has shape {ids.shape}, expected the shape of rewards {(n,)}")
    try:
        _, inverse = np.unique(ids, return_inverse=True)
    except TypeError as err:     # None beside strings, or ids of two kinds: no order to group them by
        raise DataValueError(f"group_ids must be ids of one sortable kind (all numbers or all strings); "
                             f"{err}") from None
    inverse = inverse.reshape(-1)
    return inverse, np.bincount(inverse).astype(np.float64)


def read_groups(rewards: Any, group_ids: Any, singleton: Any) -> tuple[Rewards, np.ndarray, np.ndarray, np.ndarray]:
    """The grouped estimators' inputs, checked: ``(rewards, their float64 values [N], each sample's group 0..G-1
    [N], each group's size [G])``."""
    check_singleton(singleton)
    r = read_rewards(rewards)
    inverse, counts = group_index(group_ids, r.values.size)
    return r, r.values, inverse, counts


def read_mask(mask: Any, rows: int) -> np.ndarray:
    """A [rows, T] response mask (bool or numeric, nonzero = valid token) as bool."""
    m = mask.detach().cpu().numpy() if is_tensor(mask) else np.asarray(mask)
    if m.ndim != 2 or m.shape[0] != rows:
        raise DataValueError(f"mask must be 2-D [N, T] with N = {rows} rows (one per sample), got shape {m.shape}")
    if not (m.dtype == np.bool_ or np.issubdtype(m.dtype, np.number)):
        raise DataValueError(f"mask must be a bool or numeric array (nonzero = valid), got dtype {m.dtype}")
    return m != 0


def _numeric_or_raise(r_np: np.ndarray) -> np.ndarray:
    """An object array of numbers as float64; else a DataValueError naming the first entries that are None
    or not numbers (a reward that raised is None in a step's result)."""
    flat = r_np.reshape(-1)
    bad = [i for i, v in enumerate(flat)
           if v is None or isinstance(v, (str, bytes)) or not isinstance(v, (int, float, np.number, bool))]
    if not bad:
        return r_np.astype(np.float64)
    index = (lambda i: f"{i}") if r_np.ndim <= 1 else (lambda i: ", ".join(map(str, np.unravel_index(i, r_np.shape))))
    shown = ", ".join(f"rewards[{index(i)}] = {flat[i]!r}" for i in bad[:5]) + (", ..." if len(bad) > 5 else "")
    none_hint = ("; a sample whose reward function raised has reward None: its error is in the step result's "
                 "scores[i].error (the table's reward_error column); leave those samples out or give them a "
                 "reward" if any(flat[i] is None for i in bad) else "")
    raise DataValueError(f"rewards must be numbers; {len(bad)} of {flat.size} "
                         f"{'is' if len(bad) == 1 else 'are'} not: {shown}{none_hint}")
