"""A trainer's padded ids back to each row's own tokens: ``per_token_logps``'s ``prompt_mask`` and
``completion_mask``.

verl, TRL and OpenRLHF hold a batch as prompts left-padded to [B, P] and completions right-padded to [B, R], with a
mask of 1 on real tokens. Scoring reads ids as they are, so the padding has to go first: each row keeps the ids
where its mask is 1. The kept ids must be one run at the side a trainer pads from (a prompt's at its end, a
completion's from column 0); anything else is more likely a loss mask (0 on a multi-turn response's environment
tokens, which the model did read) than padding, and dropping those tokens would change every later log-prob.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from pdsr_sdk.errors import DataValueError
from pdsr_sdk.scoring.api import Ragged, as_ragged

__all__ = ["unpad"]

Side = Literal["left", "right"]


def unpad(ids: Any, mask: Any, ids_name: str, mask_name: str, side: Side) -> tuple[Ragged, int | None]:
    """The ids of each row of ``ids`` where ``mask`` is 1 (or True), and the mask's width where every row has the
    same one (a 2-D batch's P or R; None for ragged rows). ``side``: where the padding is ("left": a prompt's, the
    real tokens one run ending at the last column; "right": a completion's, one run from column 0). A
    :class:`~pdsr_sdk.errors.DataValueError` naming ``mask_name`` and the row for: a shape or a row length that is
    not the ids', a value other than 0/1, real tokens not in one run at that side, and (``side="left"``) a row with
    no real token."""
    id_shape, mask_shape = _shape_2d(ids), _shape_2d(mask)
    if id_shape is not None and mask_shape is not None and id_shape != mask_shape:
        raise DataValueError(f"{mask_name} has shape {list(mask_shape)} but {ids_name} has {list(id_shape)}: a mask "
                             f"has one entry per token id")
    rows = as_ragged(ids, ids_name)
    masks = mask_rows(mask, mask_name)
    if len(masks) != len(rows):
        raise DataValueError(f"{mask_name} has {len(masks)} rows but {ids_name} has {len(rows)}")
    for i, m in enumerate(masks):
        if len(m) != rows.lengths[i]:
            raise DataValueError(f"{mask_name} row {i} has {len(m)} entries but {ids_name} row {i} has "
                                 f"{int(rows.lengths[i])} token ids: a mask has one entry per token id")
        _check_run(m, i, mask_name, side)
    kept = np.array([int(m.sum()) for m in masks], dtype=np.int64)
    offsets = np.zeros(len(masks) + 1, dtype=np.int64)
    np.cumsum(kept, out=offsets[1:])
    values = rows.values[np.concatenate(masks)] if masks else np.zeros(0, np.int64)
    widths = {len(m) for m in masks}
    return Ragged(values, offsets), (widths.pop() if len(widths) == 1 else None)


def mask_rows(mask: Any, name: str) -> list[np.ndarray]:
    """A [B, L] mask (tensor, numpy array, or a list of rows) as B bool arrays; a value other than 0/1 (or
    True/False) is a DataValueError naming the row and column."""
    if hasattr(mask, "detach") and hasattr(mask, "cpu"):
        mask = mask.detach().cpu().numpy()
    if isinstance(mask, np.ndarray) and mask.ndim != 2:
        raise DataValueError(f"{name}: expected a 2-D mask [rows, tokens], got shape {list(mask.shape)}")
    if isinstance(mask, (str, bytes)) or not hasattr(mask, "__len__"):
        raise DataValueError(f"{name}: expected a 2-D mask [rows, tokens] (a tensor, a numpy array or a list of "
                             f"rows), got {type(mask).__name__}")
    out = []
    for i, row in enumerate(mask):
        if hasattr(row, "detach") and hasattr(row, "cpu"):
            row = row.detach().cpu().numpy()
        arr = np.asarray(row)
        if arr.ndim != 1:
            raise DataValueError(f"{name} row {i}: expected a 1-D row of 0/1, got shape {list(arr.shape)}")
        if arr.dtype != bool:
            if arr.size and arr.dtype.kind not in "iuf":
                raise DataValueError(f"{name} row {i}: expected 0/1 or True/False, got dtype {arr.dtype}")
            bad = np.flatnonzero((arr != 0) & (arr != 1))
            if bad.size:
                j = int(bad[0])
                raise DataValueError(f"{name} row {i}, column {j}: {arr[j].item()!r} is not a mask value (1 or True: a "
                                     f"real token, 0 or False: padding)")
        out.append(arr.astype(bool))
    return out


def _check_run(m: np.ndarray, i: int, name: str, side: Side) -> None:
    n = int(m.sum())
    if side == "left" and n == 0:
        raise DataValueError(f"{name} row {i} has no real token (all 0): the first completion token needs at least "
                             f"one token of prompt as context")
    want = np.zeros(len(m), dtype=bool)
    if side == "left":
        want[len(m) - n:] = True
    else:
        want[:n] = True
    if np.array_equal(m, want):
        return
    where = _runs(m)
    if side == "left":
        raise DataValueError(f"{name} row {i} is not left padding: a prompt's real tokens (1) must be one run ending "
                             f"at its last column, as a trainer's left-padded prompts are; this row's are at columns "
                             f"{where}")
    raise DataValueError(f"{name} row {i} is not right padding: a completion's real tokens (1) must be one run from "
                         f"column 0, as a trainer's right-padded responses are; this row's are at columns {where} "
                         f"(a loss mask, such as verl's response_mask with 0 on a multi-turn response's environment "
                         f"tokens, is not a padding mask: pass attention_mask[:, P:])")


def _runs(m: np.ndarray, most: int = 4) -> str:
    """The runs of True in ``m`` as "0-2, 5, 7-9" (the first ``most``, then how many more)."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], m.astype(np.int8), [0]])))
    runs = [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2])]
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:most])
    return text + (f" and {len(runs) - most} more runs" if len(runs) > most else "")


def _shape_2d(x: Any) -> tuple[int, ...] | None:
    shape = getattr(x, "shape", None)
    return tuple(int(n) for n in shape) if shape is not None and len(shape) == 2 else None
