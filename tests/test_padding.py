"""pad_rows against a per-row loop."""

from __future__ import annotations

import numpy as np
import pytest

from pdsr_sdk.io.padding import pad_rows


def pad_rows_naive(rows, width, side, fill):
    out = []
    for row in rows:
        pad = [fill] * (width - len(row))
        out.append(pad + list(row) if side == "left" else list(row) + pad)
    return out


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("seed", range(6))
def test_pad_rows_matches_a_loop(side, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 9, size=int(rng.integers(1, 12)))
    rows = [rng.integers(-50, 50, size=n) for n in lengths]
    width = int(lengths.max()) + int(rng.integers(0, 3))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.concatenate(rows) if len(rows) else np.zeros(0, np.int64)
    got = pad_rows(flat, offsets, width, side=side, fill=-7)
    assert got.shape == (len(rows), width)
    assert got.tolist() == pad_rows_naive([r.tolist() for r in rows], width, side, -7)


def test_pad_rows_reads_a_slice_and_refuses_a_row_over_the_width():
    values = np.arange(10.0)
    got = pad_rows(values, np.array([3, 5, 6]), 3, side="left", fill=np.nan, dtype=np.float32)
    assert got.dtype == np.float32
    assert np.array_equal(got, np.array([[np.nan, 3, 4], [np.nan, np.nan, 5]], np.float32), equal_nan=True)
    with pytest.raises(ValueError, match="row 1 has 4 values, more than width 3"):
        pad_rows(values, np.array([0, 1, 5]), 3)
    with pytest.raises(ValueError, match="side must be"):
        pad_rows(values, np.array([0, 1]), 3, side="middle")
