"""``pdsr gae`` on a table runs in blocks of rows, each padded to its own longest row: the same advantages and
returns as the whole table padded at once (the float64 reference), with a progress bar over the tokens."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import pdsr_sdk.gae as gae_pkg
from pdsr_sdk.gae import masked_whiten
from pdsr_sdk.gae.config import GaeConfig
from pdsr_sdk.gae.reference import reference_gae
from pdsr_sdk.gae.table import gae_table, row_blocks
from pdsr_sdk.io.padding import pad_rows


def long_tailed_table(seed: int, rows: int = 60):
    """Rows of 0-30 tokens with a few of 200, a partial mask (null rows: all valid) and a scalar reward."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 31, rows)
    lengths[[3, 41]] = 200
    values = [rng.standard_normal(n).astype(np.float32) for n in lengths]
    mask = [None if i % 5 == 0 else (rng.random(n) < 0.7).astype(np.int8) for i, n in enumerate(lengths)]
    table = pa.table({
        "values": pa.array([v.tolist() for v in values], pa.list_(pa.float32())),
        "response_mask": pa.array([None if m is None else m.tolist() for m in mask], pa.list_(pa.int8())),
        "reward": pa.array(rng.standard_normal(rows).astype(np.float32)),
    })
    return table, lengths


def padded_reference(table: pa.Table, lengths: np.ndarray, gamma: float, lam: float, whiten: bool):
    """Every row padded to the longest, the scalar reward on each row's last valid token, the float64 reference."""
    rows, width = len(lengths), int(lengths.max())
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = pad_rows(np.concatenate(table.column("values").to_pylist()), offsets, width, dtype=np.float32)
    mask = np.zeros((rows, width), dtype=bool)
    rewards = np.zeros((rows, width), dtype=np.float32)
    for i, (m, r) in enumerate(zip(table.column("response_mask").to_pylist(), table.column("reward").to_pylist())):
        mask[i, :lengths[i]] = True if m is None else np.asarray(m) != 0
        valid = np.flatnonzero(mask[i])
        if valid.size:
            rewards[i, valid[-1]] = r
    adv, ret = reference_gae(rewards, values, mask, gamma, lam)
    if whiten:
        adv = masked_whiten(adv, mask)
    return [adv[i, :n] for i, n in enumerate(lengths)], [ret[i, :n] for i, n in enumerate(lengths)]


def test_row_blocks_cover_the_rows_in_order_within_the_cell_budget():
    lengths = np.array([5, 1, 1, 40, 2, 2, 2, 2, 2, 2, 100, 0, 3])
    blocks = row_blocks(lengths, 20)
    assert blocks[0][0] == 0 and blocks[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))   # consecutive, no row twice or left out
    for first, end in blocks:
        assert end > first
        # within the budget, unless a single row is wider than the budget
        assert (end - first) * int(lengths[first:end].max()) <= 20 or end - first == 1
    assert (3, 4) in blocks and (10, 11) in blocks   # the 40- and 100-token rows alone
    assert row_blocks(np.array([], dtype=np.int64), 20) == []


@pytest.mark.parametrize("whiten", [False, True])
@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_blocks_equal_the_whole_table_padded_at_once(monkeypatch, backend, whiten):
    table, lengths = long_tailed_table(7)
    widths = []
    real = gae_pkg.compute_gae

    def recording(rewards, *args, **kwargs):
        widths.append(tuple(rewards.shape))
        return real(rewards, *args, **kwargs)

    monkeypatch.setattr("pdsr_sdk.gae.table.BLOCK_CELLS", 256)
    monkeypatch.setattr(gae_pkg, "compute_gae", recording)
    updates = []

    class Bar:
        def __init__(self, desc="", total=None, unit="it"):
            updates.append(("total", total, unit))

        def update(self, n=1):
            updates.append(n)

        def set_postfix_str(self, s="", refresh=True):
            pass

        def close(self):
            updates.append("closed")

    cfg = GaeConfig(data="in.parquet", out="out.parquet", rewards_column="reward", gamma=0.99, lam=0.95,
                    backend=backend, whiten=whiten)
    out, summary = gae_table(table, cfg, progress=Bar)
    want_adv, want_ret = padded_reference(table, lengths, 0.99, 0.95, whiten)
    for i, (adv, ret) in enumerate(zip(out.column("advantages").to_pylist(), out.column("returns").to_pylist())):
        np.testing.assert_allclose(adv, want_adv[i], atol=1e-4, err_msg=f"row {i}")
        np.testing.assert_allclose(ret, want_ret[i], atol=1e-4, err_msg=f"row {i}")
    # many blocks, none padded to the 200-token rows unless it holds one
    assert len(widths) > 5
    assert all(r * t <= 256 or r == 1 for r, t in widths)
    assert sum(r for r, _ in widths) == len(lengths)
    assert updates[0] == ("total", int(lengths.sum()), "token") and updates[-1] == "closed"
    assert sum(u for u in updates[1:-1]) == int(lengths.sum()) == summary.tokens
