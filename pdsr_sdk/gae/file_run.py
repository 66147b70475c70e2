"""``pdsr gae`` on a file: read, compute and write a block of rows at a time, so memory holds a block, not the file.

The input is read by :func:`~pdsr_sdk.io.blocks.open_table_batches` (Parquet, Arrow IPC and JSONL streamed; CSV, a
``.json`` array and shards of differing schemas read whole) and the output written block by block through a
Parquet writer to a temporary file beside ``out``, renamed over it at the end (an interrupted run leaves nothing
under ``out``). Each row's numbers are those of the whole-table path (:func:`~pdsr_sdk.gae.table.gae_table`):

- ``gae`` without whitening: one pass. The rows are gathered into the blocks the whole-table path scans, cut by
  the same rule (:data:`~pdsr_sdk.gae.table.BLOCK_CELLS` padded cells, rows in order), so the same bits come out.
- ``gae --whiten`` and ``reinforce_plus_plus``: the whitening's mean and variance are over the file's valid tokens,
  so a first pass reads only the columns the numbers need, computes each block and folds its count, mean and sum
  of squared deviations (float64) into the file's (Chan, Golub and LeVeque's update); the second pass reads every
  column, computes each block again (the scan runs twice: no temporary copy of the advantages on disk) and writes
  it whitened. The statistics are summed in another order than numpy's over the whole array: the float64 mean and
  variance differ in their last bits, so a whitened float32 advantage may differ by float32's rounding.
- ``grpo``, ``rloo``, ``reinforce_plus_plus_baseline``: a first pass reads the rewards, group ids and token counts
  (and for the baseline the mask) into a few numbers per row; the per-sample advantages are taken over the file as
  the whole-table path takes them; the second pass broadcasts them to the tokens block by block.

A file that changes between the two passes (other row count or lengths) is an error, and nothing is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from pdsr_sdk.errors import DataError
from pdsr_sdk.gae import table as gae_table_module
from pdsr_sdk.gae.config import GaeConfig
from pdsr_sdk.gae.outcome_table import (GROUPED, check_whiten_count, discounted_returns, group_ids, outcome_flags,
                                        per_sample_advantages, sample_rewards, token_offsets, valid_tokens)
from pdsr_sdk.gae.table import (ADVANTAGES, RETURNS, GaeRunSummary, Rows, critic_block, mask_flag, require_columns,
                                reward_scalars, rewards_column_name, token_rewards, with_token_columns)
from pdsr_sdk.io.blocks import BATCH_ROWS, TableBatches, open_table_batches
from pdsr_sdk.io.tables import atomic_path, check_new_output
from pdsr_sdk.progress import ProgressFactory, silent_progress

#: rows read from the input at a time (a block of the scan may gather several such batches, or cut one)
READ_ROWS = BATCH_ROWS

#: what a block gives to write: its new flat columns, offsets, mask, dropped rewards' rows, backend, seconds
Computed = tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, str, float]


def run_gae_file(cfg: GaeConfig, *, progress: ProgressFactory | None = None) -> GaeRunSummary:
    """Read ``cfg.data`` a block of rows at a time, compute the advantages ``cfg`` asks for, write ``cfg.out``
    atomically (checked writable before anything is read). ``progress``: a factory whose bars count the rows of
    each pass over the file (default silent). See the module doc."""
    check_new_output(cfg.out, "out (--out)", overwrite=cfg.overwrite)
    source = open_table_batches(cfg.data, what="GAE input", setting="data (--data)")
    run = _Run(source, cfg, progress or silent_progress)
    if cfg.estimator == "gae":
        return run.critic()
    if cfg.estimator in GROUPED:
        return run.grouped()
    return run.reinforce_pp()


class Moments:
    """Count, mean and sum of squared deviations of values seen a block at a time (float64), merged as Chan, Golub
    and LeVeque do: the statistics :func:`~pdsr_sdk.gae.masked_whiten` takes over the whole array."""

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, np.float64(0.0), np.float64(0.0)

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Fold in ``values`` (each counted ``weights`` times, when given)."""
        x = np.asarray(values, dtype=np.float64)
        w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
        k = int(w.sum())
        if k == 0:
            return
        mean = (w * x).sum() / k
        m2 = (w * np.square(x - mean)).sum()
        n = self.n + k
        delta = mean - self.mean
        self.mean = self.mean + delta * (k / n)
        self.m2 = self.m2 + m2 + delta * delta * (self.n * k / n)
        self.n = n

    def whiten(self, values: np.ndarray, eps: float = 1e-8) -> np.ndarray:
        """``(values - mean) / sqrt(var + eps)`` in float64, the variance unbiased (verl's ``masked_whiten``)."""
        var = self.m2 / (self.n - 1)
        return (values.astype(np.float64) - self.mean) / np.sqrt(var + eps)


@dataclass
class _Tally:
    """What the write pass saw, for the summary."""

    rows: int = 0
    tokens: int = 0
    valid: int = 0
    dropped: list[np.ndarray] = field(default_factory=list)
    backend: str = ""
    seconds: float = 0.0


class _Run:
    def __init__(self, source: TableBatches, cfg: GaeConfig, progress: ProgressFactory):
        self.source, self.cfg, self.progress, self.where = source, cfg, progress, cfg.data
        self.seconds = 0.0   # computing in a first pass

    # ------------------------------------------------------------------ estimators

    def critic(self) -> GaeRunSummary:
        cfg, where, schema = self.cfg, self.where, self.source.schema
        require_columns(schema, where, {cfg.values_column: "--values-column", **mask_flag(cfg)},
                        hint="; without a critic's values, an outcome estimator: --estimator grpo, rloo, "
                             "reinforce_plus_plus or reinforce_plus_plus_baseline")
        reads = self._present(cfg.values_column, cfg.mask_column, rewards_column_name(schema, cfg, where),
                              "reward_error")
        moments = None
        if cfg.whiten:
            moments = Moments()
            for rows, block in self._scan_blocks(reads, cfg.values_column, "statistics"):
                b = critic_block(block, cfg, where, rows)
                moments.add(b.advantages[b.mask])
                self.seconds += b.seconds
            if moments.n < 2:   # masked_whiten's words
                raise DataError(f"{where}: cannot whiten: masked_whiten needs at least 2 masked-in entries for an "
                                f"unbiased variance, got {moments.n}")

        def compute(block: pa.Table, rows: Rows) -> Computed:
            b = critic_block(block, cfg, where, rows)
            adv = b.advantages if moments is None else moments.whiten(b.advantages).astype(np.float32)
            return {ADVANTAGES: adv, RETURNS: b.returns}, b.offsets, b.mask, b.dropped, b.backend, b.seconds

        return self._summary(self._write(self._scan_blocks(None, cfg.values_column), compute, (ADVANTAGES, RETURNS),
                                         moments))

    def reinforce_pp(self) -> GaeRunSummary:
        cfg, where, schema = self.cfg, self.where, self.source.schema
        require_columns(schema, where, outcome_flags(cfg))
        reads = self._present(cfg.tokens_column, cfg.mask_column, rewards_column_name(schema, cfg, where),
                              "reward_error")

        def returns_of(block: pa.Table, rows: Rows):
            offsets = token_offsets(block, cfg.tokens_column, where, rows)
            mask = valid_tokens(block, cfg, where, np.diff(offsets), rows)
            token, dropped = token_rewards(block, cfg, where, offsets, mask, cfg.tokens_column, rows)
            start = time.perf_counter()
            returns, backend = discounted_returns(token, mask, offsets, cfg)
            return returns, offsets, mask, dropped + rows.first, backend, time.perf_counter() - start

        moments = Moments()
        for rows, block in self._scan_blocks(reads, cfg.tokens_column, "statistics"):
            returns, _, mask, *_, seconds = returns_of(block, rows)
            moments.add(returns[mask])
            self.seconds += seconds
        check_whiten_count(moments.n, cfg, where)

        def compute(block: pa.Table, rows: Rows) -> Computed:
            returns, offsets, mask, dropped, backend, seconds = returns_of(block, rows)
            adv = np.where(mask, moments.whiten(returns), 0.0)
            return ({ADVANTAGES: adv.astype(np.float32), RETURNS: returns.astype(np.float32)}, offsets, mask, dropped,
                    backend, seconds)

        return self._summary(self._write(self._scan_blocks(None, cfg.tokens_column), compute, (ADVANTAGES, RETURNS),
                                         moments))

    def grouped(self) -> GaeRunSummary:
        cfg, where, schema = self.cfg, self.where, self.source.schema
        require_columns(schema, where, outcome_flags(cfg))
        name = rewards_column_name(schema, cfg, where)
        baseline = cfg.estimator == "reinforce_plus_plus_baseline"
        kind = schema.field(name).type
        listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        lengths, valid, sums, scalars, ids = [], [], [], [], []
        reads = self._present(cfg.tokens_column, name, cfg.group_column, cfg.mask_column if baseline else None)
        for rows, batch in self._batches(reads, "statistics"):
            n = np.diff(token_offsets(batch, cfg.tokens_column, where, rows))
            lengths.append(n)
            if baseline:   # each row's valid tokens: the weight of its advantage in the file's whitening
                mask = valid_tokens(batch, cfg, where, n, rows)
                seen = np.concatenate([[0], np.cumsum(mask)])
                valid.append(seen[np.cumsum(n)] - seen[np.cumsum(n) - n])
            if listed:
                sums.append(sample_rewards(batch, cfg, where, n, rows))
            else:
                scalars.extend(batch.column(name).chunks)
            ids.extend(batch.column(cfg.group_column).chunks)
        start = time.perf_counter()
        rewards = np.concatenate(sums) if listed and sums else np.zeros(0) if listed else reward_scalars(
            pa.chunked_array(scalars, type=kind), name, where, self._reward_error)
        groups = group_ids(pa.chunked_array(ids, type=schema.field(cfg.group_column).type), cfg.group_column, where)
        per_sample, counts = per_sample_advantages(rewards, groups, cfg)
        all_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        moments = None
        if baseline:
            moments = Moments()
            weights = np.concatenate(valid) if valid else np.zeros(0, np.int64)
            moments.add(per_sample, weights)
            check_whiten_count(moments.n, cfg, where)
        self.seconds += time.perf_counter() - start

        def compute(block: pa.Table, rows: Rows) -> Computed:
            offsets = token_offsets(block, cfg.tokens_column, where, rows)
            n = np.diff(offsets)
            self._same_lengths(n, all_lengths, rows)
            mask = valid_tokens(block, cfg, where, n, rows)
            start = time.perf_counter()
            adv = np.where(mask, np.repeat(per_sample[rows.first:rows.first + len(n)], n), 0.0)
            if moments is not None:
                adv = np.where(mask, moments.whiten(adv), 0.0)
            return ({ADVANTAGES: adv.astype(np.float32)}, offsets, mask, np.zeros(0, np.int64), "",
                    time.perf_counter() - start)

        tally = self._write(self._batches(None), compute, (ADVANTAGES,), moments)
        return replace(self._summary(tally), groups=len(counts), singleton_groups=int((counts == 1).sum()))

    # ------------------------------------------------------------------ passes

    def _present(self, *names: str | None) -> list[str]:
        """The named columns the file has, each once, in its order."""
        wanted = {n for n in names if n}
        return [n for n in self.source.schema.names if n in wanted]

    def _bar(self, step: str):
        desc = f"{self.cfg.estimator} ({step})" if step else self.cfg.estimator
        return self.progress(desc=desc, total=self.source.num_rows, unit="row")

    def _batches(self, columns: list[str] | None, step: str = "") -> Iterator[tuple[Rows, pa.Table]]:
        bar, first = self._bar(step), 0
        try:
            for batch in self.source.batches(columns, READ_ROWS):
                yield Rows(first, batch.num_rows), batch
                first += batch.num_rows
                bar.update(batch.num_rows)
        finally:
            bar.close()

    def _scan_blocks(self, columns: list[str] | None, lengths_column: str,
                     step: str = "") -> Iterator[tuple[Rows, pa.Table]]:
        """The rows in the blocks :func:`~pdsr_sdk.gae.table.row_blocks` cuts the whole file into (by the lengths
        of ``lengths_column``'s lists), gathered from the batches read."""
        cells = gae_table_module.BLOCK_CELLS
        pending: list[pa.Table] = []
        first = count = longest = 0
        for _, batch in self._batches(columns, step):
            start = 0
            for i, n in enumerate(_list_lengths(batch.column(lengths_column)).tolist()):
                wider = max(longest, n)
                if count and (count + 1) * wider > cells:   # row_blocks' rule
                    pending.append(batch.slice(start, i - start))
                    yield Rows(first, count), pa.concat_tables(pending)
                    first, count, start, pending, wider = first + count, 0, i, [], n
                count += 1
                longest = wider
            pending.append(batch.slice(start))
        if count:
            yield Rows(first, count), pa.concat_tables(pending)

    def _write(self, blocks: Iterator[tuple[Rows, pa.Table]], compute: Callable[[pa.Table, Rows], Computed],
               added: tuple[str, ...], moments: Moments | None) -> _Tally:
        """Each block with its new columns, through one Parquet writer, to ``out`` (atomic rename at the end, once
        the rows and valid tokens read are those of the file when opened, and of the first pass's ``moments``)."""
        import pyarrow.parquet as pq

        empty = {name: np.zeros(0, np.float32) for name in added}
        schema = with_token_columns(self.source.schema.empty_table(), empty, np.zeros(1, np.int64)).schema
        tally = _Tally()
        with atomic_path(self.cfg.out) as tmp:
            with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
                for rows, block in blocks:
                    columns, offsets, mask, dropped, backend, seconds = compute(block, rows)
                    writer.write_table(with_token_columns(block, columns, offsets))
                    tally.rows += block.num_rows
                    tally.tokens += int(offsets[-1])
                    tally.valid += int(mask.sum())
                    tally.dropped.append(dropped)
                    tally.backend = backend
                    tally.seconds += seconds
            if tally.rows != self.source.num_rows:
                self._changed(f"{self.source.num_rows} rows when opened, {tally.rows} read")
            if moments is not None and moments.n != tally.valid:
                self._changed(f"{moments.n} valid tokens in the first pass, {tally.valid} in the second")
        return tally

    def _summary(self, tally: _Tally) -> GaeRunSummary:
        dropped = np.concatenate(tally.dropped) if tally.dropped else np.zeros(0, np.int64)
        backend = tally.backend
        if not backend and self.cfg.estimator in ("gae", "reinforce_plus_plus"):   # no rows: the scan's, unrun
            from pdsr_sdk.gae.api import resolve_backend_name

            backend = resolve_backend_name(self.cfg.backend, cuda=self.cfg.device.startswith("cuda"))
        return GaeRunSummary(out=Path(self.cfg.out), rows=tally.rows, tokens=tally.tokens, valid_tokens=tally.valid,
                             backend=backend, seconds=self.seconds + tally.seconds,
                             dropped_rewards=tuple(int(r) for r in dropped), estimator=self.cfg.estimator)

    def _same_lengths(self, n: np.ndarray, lengths: np.ndarray, rows: Rows) -> None:
        if not np.array_equal(n, lengths[rows.first:rows.first + len(n)]):
            self._changed(f"other token counts in rows {rows.first}-{rows.first + len(n) - 1}")

    def _changed(self, what: str) -> None:
        raise DataError(f"{self.where}: the input changed while pdsr gae read it twice ({what}); nothing was "
                        f"written to {self.cfg.out}")

    def _reward_error(self, row: int) -> object:
        """Row ``row``'s reward_error, read only when a null reward is named."""
        if "reward_error" not in self.source.schema.names:
            return None
        first = 0
        for batch in self.source.batches(["reward_error"], READ_ROWS):
            if row < first + batch.num_rows:
                return batch.column(0)[row - first].as_py()
            first += batch.num_rows
        return None


def _list_lengths(column: pa.ChunkedArray) -> np.ndarray:
    """Each row's list length (0 for a null row, or for a column that is not of lists: the block's check names
    it)."""
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        return np.zeros(len(column), dtype=np.int64)
    return np.concatenate([np.asarray(c.value_lengths().fill_null(0), dtype=np.int64) for c in column.chunks]
                          or [np.zeros(0, np.int64)])
