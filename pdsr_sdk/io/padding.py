"""Ragged rows -> one padded array: the kernel behind :func:`pdsr_sdk.rollout.padded.trainer_batch` and
:func:`pdsr_sdk.io.tables.ragged_to_padded`.

Plain arrays in and out; ``tests/test_padding.py`` holds it to a per-row loop."""

from __future__ import annotations

from typing import Literal

import numpy as np

from pdsr_sdk.errors import ConfigValueError, DataValueError


def pad_rows(values: np.ndarray, offsets: np.ndarray, width: int, *, side: Literal["left", "right"] = "right",
             fill=0, dtype=None) -> np.ndarray:
    """Rows ``values[offsets[i]:offsets[i + 1]]`` as a ``[rows, width]`` array, each row's values at its
    right end (``side="left"``: padded on the left, as a prompt is) or its left end (``"right"``), the rest
    ``fill``. A row longer than ``width`` is a :class:`~pdsr_sdk.errors.DataValueError` naming the row (a
    ValueError)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    if len(lengths) and int(lengths.max()) > width:
        raise DataValueError(f"row {int(np.argmax(lengths))} has {int(lengths.max())} values, more than width {width}")
    out = np.full((len(lengths), int(width)), fill, dtype=dtype or np.asarray(values).dtype)
    col = np.arange(int(width))[None, :]
    if side == "right":
        mask = col < lengths[:, None]
    elif side == "left":
        mask = col >= (width - lengths)[:, None]
    else:
        raise ConfigValueError(f"side must be 'left' or 'right', got {side!r}")
    out[mask] = np.asarray(values)[offsets[0]:offsets[-1]] if len(offsets) else values
    return out
