"""Masked whitening of advantages (verl's ``masked_whiten``).

``(x - mean) / sqrt(var + eps)`` where mean and variance are taken over the
masked entries of the whole array (not per row), the variance unbiased
(n-1), as verl does. Every entry is transformed, masked-out ones included;
``shift_mean=False`` adds the mean back (scale only). verl divides sums by
``count + 1e-8``; here by the exact count (a relative difference below
1e-8 / count).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pdsr_sdk.errors import DataValueError


def masked_whiten(values: Any, mask: Any, *, shift_mean: bool = True, eps: float = 1e-8) -> Any:
    """Whiten ``values`` with statistics over entries where ``mask`` is nonzero.

    numpy in -> numpy out, tensor in -> tensor out (same device, dtype).
    Raises :class:`~pdsr_sdk.errors.DataValueError` (a ValueError) when fewer than two entries are masked in.
    """
    if tuple(values.shape) != tuple(mask.shape):
        raise DataValueError(f"mask has shape {tuple(mask.shape)}, expected the shape of values {tuple(values.shape)}")
    if type(values).__module__.startswith("torch"):
        return _whiten_torch(values, mask, shift_mean, eps)
    x = np.asarray(values)
    valid = np.asarray(mask) != 0
    n = int(valid.sum())
    _check_count(n)
    x64 = x.astype(np.float64, copy=False)
    mean = x64[valid].sum() / n
    var = np.square(x64[valid] - mean).sum() / (n - 1)
    out = (x64 - mean) / np.sqrt(var + eps)
    if not shift_mean:
        out += mean
    return out.astype(x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64, copy=False)


def _whiten_torch(values, mask, shift_mean: bool, eps: float):
    import torch

    valid = mask != 0
    n = int(valid.sum())
    _check_count(n)
    x64 = values.detach().to(torch.float64)
    mean = torch.where(valid, x64, 0.0).sum() / n
    var = torch.where(valid, (x64 - mean) ** 2, 0.0).sum() / (n - 1)
    out = (x64 - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out.to(values.dtype if values.dtype.is_floating_point else torch.float64)


def _check_count(n: int) -> None:
    if n < 2:
        raise DataValueError(f"masked_whiten needs at least 2 masked-in entries for an unbiased variance, got {n}")
