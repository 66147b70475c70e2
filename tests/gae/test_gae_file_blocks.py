"""``pdsr gae`` on a file (:func:`run_gae_file`) reads, computes and writes a block of rows at a time: with tiny
blocks and read batches forced, every estimator writes what the whole-table path (``read_table``, ``gae_table``,
``write_table_atomic``) writes for Parquet, JSONL and Arrow IPC inputs, bit for bit where nothing is whitened; its
errors name the file's rows; an interrupted run leaves nothing; and its peak memory is a block's, not the file's."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support import interrupt_at_call

from pdsr_sdk.errors import DataError
from pdsr_sdk.gae import file_run, masked_whiten
from pdsr_sdk.gae.config import GaeConfig
from pdsr_sdk.gae.table import gae_table, run_gae_file
from pdsr_sdk.io.tables import read_table, write_table_atomic


def rollout_table(seed: int, rows: int = 90, listed: bool = False) -> pa.Table:
    """Rows of 0-24 tokens and two of 120, groups of 3 spread over the file (and a lone one), a partial mask with
    null rows (all valid) and a row all masked, values, a reward per row (or a list per token with ``listed``)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 25, rows)
    lengths[[4, 50]] = 120
    groups = rng.permutation(np.repeat(np.arange(rows // 3), 3))
    groups[-1] = 1000
    mask = [None if i % 5 == 0 else (rng.random(n) < 0.75).astype(np.int8).tolist() for i, n in enumerate(lengths)]
    mask[9] = [0] * int(lengths[9])
    reward = rng.standard_normal(rows).astype(np.float32)
    columns = {
        "prompt_id": pa.array([f"p{g}" for g in groups]),
        "response_token_ids": pa.array([rng.integers(0, 500, n).tolist() for n in lengths], pa.list_(pa.int64())),
        "response_mask": pa.array(mask, pa.list_(pa.int8())),
        "values": pa.array([rng.standard_normal(n).astype(np.float32).tolist() for n in lengths],
                           pa.list_(pa.float32())),
        "reward": pa.array(reward),
    }
    if listed:
        columns["rewards"] = pa.array([rng.standard_normal(n).astype(np.float32).tolist() for n in lengths],
                                      pa.list_(pa.float32()))
    return pa.table(columns)


def write_as(table: pa.Table, path):
    if path.suffix == ".parquet":
        pq.write_table(table, path, row_group_size=17)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
    else:
        with pa.ipc.new_file(path, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=23):
                writer.write_batch(batch)
    return path


ESTIMATORS = [("gae", {"lam": 0.9, "gamma": 0.99}), ("gae", {"lam": 0.9, "whiten": True}), ("grpo", {}),
              ("rloo", {}), ("reinforce_plus_plus", {"gamma": 0.95}), ("reinforce_plus_plus_baseline", {})]
WHITENED = {"reinforce_plus_plus", "reinforce_plus_plus_baseline"}


@pytest.fixture()
def tiny_blocks(monkeypatch):
    """Blocks of at most 64 padded cells, read 7 rows at a time; the blocks written, counted."""
    monkeypatch.setattr("pdsr_sdk.gae.table.BLOCK_CELLS", 64)
    monkeypatch.setattr(file_run, "READ_ROWS", 7)
    written = []
    real = file_run.with_token_columns

    def counting(table, flats, offsets):
        written.append(table.num_rows)
        return real(table, flats, offsets)

    monkeypatch.setattr(file_run, "with_token_columns", counting)
    return written


def whole_file_path(path, cfg: GaeConfig, out):
    """What `pdsr gae` wrote before it streamed: the input read whole, gae_table, one atomic write."""
    table, summary = gae_table(read_table(path, what="GAE input", setting="data (--data)"), cfg, source=path)
    write_table_atomic(table, out)
    return pq.read_table(out), summary


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".arrow"])
@pytest.mark.parametrize("estimator, settings", ESTIMATORS, ids=[e + ("+whiten" if s.get("whiten") else "")
                                                                  for e, s in ESTIMATORS])
@pytest.mark.parametrize("listed", [False, True], ids=["reward", "rewards-list"])
def test_streamed_blocks_write_what_the_whole_file_path_writes(tmp_path, tiny_blocks, suffix, estimator, settings,
                                                               listed):
    path = write_as(rollout_table(3, listed=listed), tmp_path / f"in{suffix}")
    cfg = GaeConfig(data=path, out=tmp_path / "out.parquet", estimator=estimator, **settings)
    summary = run_gae_file(cfg)
    assert len(tiny_blocks) > 10, tiny_blocks      # many blocks (the 120-token rows each alone)
    want, want_summary = whole_file_path(path, cfg, tmp_path / "whole.parquet")
    got = pq.read_table(cfg.out)
    assert got.schema.equals(want.schema, check_metadata=True)
    assert (summary.rows, summary.tokens, summary.valid_tokens, summary.dropped_rewards, summary.groups,
            summary.singleton_groups, summary.backend) == (
        want_summary.rows, want_summary.tokens, want_summary.valid_tokens, want_summary.dropped_rewards,
        want_summary.groups, want_summary.singleton_groups, want_summary.backend)
    if estimator == "gae" and not listed:
        assert 9 in summary.dropped_rewards     # its reward on a row all masked
    if not (settings.get("whiten") or estimator in WHITENED):
        assert got.equals(want)
        return
    # whitened: the statistics are summed block by block, not in numpy's order over the whole file; the float64
    # results differ in their last bits, the float32 ones by float32's rounding at most
    assert got.drop_columns(["advantages"]).equals(want.drop_columns(["advantages"]))
    a, b = (np.concatenate(t.column("advantages").to_pylist()) for t in (got, want))
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert np.mean(a == b) > 0.99


def test_whitening_statistics_merged_by_block_equal_masked_whiten_over_the_whole():
    """Chan's merge of block moments gives masked_whiten's mean and unbiased variance over all valid entries, for
    blocks of any sizes and weights (a row's advantage on each of its valid tokens), with a mean far from 0."""
    rng = np.random.default_rng(0)
    x = (1e3 + rng.standard_normal(10_001)).astype(np.float32)
    valid = rng.random(x.size) < 0.8
    moments = file_run.Moments()
    for a, b in zip([0, 1, 2, 500, 501, 7000], [1, 2, 500, 501, 7000, x.size]):
        moments.add(x[a:b][valid[a:b]])
    np.testing.assert_allclose(moments.whiten(x).astype(np.float32), masked_whiten(x, valid), rtol=0, atol=2e-6)
    np.testing.assert_allclose(moments.mean, x[valid].astype(np.float64).mean(), rtol=1e-15)
    np.testing.assert_allclose(moments.m2 / (moments.n - 1), x[valid].astype(np.float64).var(ddof=1), rtol=1e-9)
    per_row, counts = rng.standard_normal(300), rng.integers(0, 9, 300)
    weighted = file_run.Moments()
    weighted.add(per_row, counts)
    tokens = np.repeat(per_row, counts)
    assert weighted.n == tokens.size
    np.testing.assert_allclose([weighted.mean, weighted.m2 / (weighted.n - 1)], [tokens.mean(), tokens.var(ddof=1)],
                               rtol=1e-12)


def test_errors_name_the_files_row_in_a_later_block(tmp_path, tiny_blocks):
    table = rollout_table(5)
    values = table.column("values").to_pylist()
    values[61][0] = float("nan")
    bad = table.set_column(table.schema.get_field_index("values"), "values", pa.array(values, pa.list_(pa.float32())))
    path = write_as(bad, tmp_path / "in.parquet")
    with pytest.raises(DataError, match=r"column 'values' row 61 token 0 is nan; expected finite numbers "
                                        r"\(1 non-finite value\(s\) in the column in rows \d+-\d+\)"):
        run_gae_file(GaeConfig(data=path, out=tmp_path / "out.parquet", whiten=True))
    assert not (tmp_path / "out.parquet").exists()

    reward = table.column("reward").to_pylist()
    reward[40] = reward[80] = None
    errors = [None] * len(reward)
    errors[40] = "Traceback ...\nValueError: no answer"
    nulls = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array(reward, pa.float32()))
    path = write_as(nulls.append_column("reward_error", pa.array(errors, pa.string())), tmp_path / "in.jsonl")
    with pytest.raises(DataError, match=r"'reward' row 40 is null \(2 null row\(s\)\); its reward_error: "
                                        r"ValueError: no answer"):
        run_gae_file(GaeConfig(data=path, out=tmp_path / "out.parquet", estimator="grpo"))
    mask = table.column("response_mask").to_pylist()
    mask[73] = [1]
    table = table.set_column(table.schema.get_field_index("response_mask"), "response_mask", pa.array(mask))
    path = write_as(table, tmp_path / "in.arrow")
    with pytest.raises(DataError, match=r"row 73: 'response_token_ids' has \d+ elements but 'response_mask' has 1"):
        run_gae_file(GaeConfig(data=path, out=tmp_path / "out.parquet", estimator="reinforce_plus_plus"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.arrow", "in.jsonl", "in.parquet"]


def test_an_interrupted_run_leaves_no_output(tmp_path, tiny_blocks, monkeypatch):
    path = write_as(rollout_table(1), tmp_path / "in.parquet")
    out = tmp_path / "out.parquet"
    out.write_bytes(b"an earlier result")
    interrupt_at_call(monkeypatch, file_run, "critic_block", 5)
    with pytest.raises(KeyboardInterrupt):
        run_gae_file(GaeConfig(data=path, out=out, overwrite=True))
    assert out.read_bytes() == b"an earlier result"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet", "out.parquet"]   # no temp file left


#: the pools peak_bytes made: kept, for the buffers they allocated may outlive the measurement
POOLS: list = []


def peak_bytes(run) -> int:
    """Peak of numpy's (tracemalloc) plus Arrow's (its memory pool, fresh) allocations while ``run`` runs."""
    pool = pa.proxy_memory_pool(pa.system_memory_pool())
    POOLS.append(pool)
    before = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1] + pool.max_memory()
    finally:
        tracemalloc.stop()
        pa.set_memory_pool(before)


def token_file(path, rows: int) -> int:
    """``rows`` rows of 100-300 tokens as Parquet in row groups of 128 rows (Parquet is read a row group at a
    time); the table's size in memory."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(100, 300, rows)
    table = pa.table({
        "prompt_id": pa.array(rng.integers(0, rows // 4, rows)),
        "response_token_ids": pa.array([np.arange(n) for n in lengths], pa.list_(pa.int64())),
        "response_mask": pa.array([np.ones(n, np.int8) for n in lengths], pa.list_(pa.int8())),
        "values": pa.array([rng.standard_normal(n).astype(np.float32) for n in lengths], pa.list_(pa.float32())),
        "reward": pa.array(rng.standard_normal(rows)),
    })
    pq.write_table(table, path, row_group_size=128)
    return table.nbytes


@pytest.mark.parametrize("estimator, settings", [("gae", {"whiten": True}), ("grpo", {}),
                                                 ("reinforce_plus_plus", {})])
def test_peak_memory_is_a_blocks_not_the_files(tmp_path, monkeypatch, estimator, settings):
    """Files of 1,500 and 6,000 rows (4 and 16 MB in memory), blocks of 2^14 cells read 64 rows at a time: the
    streamed run's peak stays that of a block (the larger file's under a fifth of its table), where the whole-file
    path's grows with the file, to several times its table. Sizes, not times."""
    monkeypatch.setattr("pdsr_sdk.gae.table.BLOCK_CELLS", 1 << 14)
    monkeypatch.setattr(file_run, "READ_ROWS", 64)
    peaks = []
    for rows in (1500, 6000):
        path = tmp_path / f"rows{rows}.parquet"
        size = token_file(path, rows)
        cfg = GaeConfig(data=path, out=tmp_path / "out.parquet", estimator=estimator, overwrite=True, **settings)
        run_gae_file(cfg)   # numba compiled outside the peak
        peaks.append((size, peak_bytes(lambda: run_gae_file(cfg)),
                      peak_bytes(lambda: whole_file_path(path, cfg, tmp_path / "whole.parquet"))))
    (_, streamed_small, whole_small), (size, streamed, whole) = peaks
    # the grouped estimators hold a few numbers per row: a little more for 4 times the rows
    assert streamed < 1.5 * streamed_small and whole > 3 * whole_small, peaks
    assert streamed * 5 < size < whole, peaks
