"""GAE over a table file (``pdsr gae``): ragged list columns in, two list columns out."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from pdsr_sdk.errors import ConfigError, DataError
from pdsr_sdk.gae.config import GaeConfig
from pdsr_sdk.io.tables import (check_new_output, list_column_to_numpy, numpy_to_list_array, padded_to_ragged, ragged_to_padded,
                                read_table, write_table_atomic)

ADVANTAGES = "advantages"
RETURNS = "returns"


def gae_output_schema() -> pa.Schema:
    """The columns ``pdsr gae`` appends to its input table."""
    return pa.schema(
        [
            pa.field(ADVANTAGES, pa.list_(pa.float32()), nullable=False, metadata={
                "description": "Per-token GAE advantage A_t, as long as the row's rewards list; at a masked token "
                               "the advantage of the next valid token, after the last valid token 0; whitened "
                               "over the file's valid tokens when --whiten is given."}),
            pa.field(RETURNS, pa.list_(pa.float32()), nullable=False, metadata={
                "description": "Per-token return (value target) A_t + V_t, with A_t before whitening."}),
        ],
        metadata={"description": "Columns added by `pdsr gae` to a copy of its input table."},
    )


@dataclass(frozen=True)
class GaeRunSummary:
    """What :func:`run_gae_file` did (the CLI prints it)."""

    out: Path
    rows: int
    tokens: int
    valid_tokens: int
    backend: str
    seconds: float
    #: rows whose scalar reward is not 0 but that have no valid token to carry it (their mask is all 0): their
    #: reward is in no advantage
    dropped_rewards: tuple[int, ...] = ()


def run_gae_file(cfg: GaeConfig) -> GaeRunSummary:
    """Read ``cfg.data``, compute GAE per row, write ``cfg.out`` atomically (checked writable first)."""
    check_new_output(cfg.out, "out (--out)", overwrite=cfg.overwrite)
    columns = ([cfg.rewards_column] if cfg.rewards_column else []) + [cfg.values_column] + \
        ([cfg.mask_column] if cfg.mask_column else [])
    table = read_table(cfg.data, columns, what="GAE input")
    result, summary = gae_table(table, cfg, source=cfg.data)
    write_table_atomic(result, cfg.out)
    return summary


def gae_table(table: pa.Table, cfg: GaeConfig, *, source: str | Path = "") -> tuple[pa.Table, GaeRunSummary]:
    """``table`` plus ``advantages`` and ``returns`` columns computed as ``cfg`` says."""
    from pdsr_sdk.gae import compute_gae, masked_whiten
    from pdsr_sdk.gae.api import get_backend, resolve_backend_name

    values, offsets = list_column_to_numpy(table.column(cfg.values_column), np.float32, name=cfg.values_column,
                                           path=source)
    lengths = np.diff(offsets)
    _check_finite(source, cfg.values_column, values, offsets)
    if cfg.mask_column:
        mask_col = _mask_nulls_as_all_valid(table.column(cfg.mask_column), lengths)
        mask, mask_offsets = list_column_to_numpy(mask_col, np.float64, name=cfg.mask_column, path=source)
        _check_lengths(source, cfg.values_column, lengths, cfg.mask_column, np.diff(mask_offsets))
        _check_finite(source, cfg.mask_column, mask, mask_offsets)
        mask = mask != 0
    else:
        mask = np.ones(len(values), dtype=np.bool_)
    rewards, dropped = _rewards(table, cfg, source, offsets, mask)

    padded_r, _ = ragged_to_padded(rewards, offsets, dtype=np.float32)
    padded_v, _ = ragged_to_padded(values, offsets, dtype=np.float32)
    padded_m, _ = ragged_to_padded(mask, offsets, fill=False, dtype=np.bool_)
    cuda = cfg.device.startswith("cuda")
    name = resolve_backend_name(cfg.backend, cuda=cuda)
    backend = get_backend(name)
    backend.warmup("float32", cfg.carry_dtype)
    threads = cfg.threads or None
    start = time.perf_counter()
    if cuda or backend.array_kind == "torch":
        import torch

        if cuda and not torch.cuda.is_available():
            raise ConfigError(f"device: {cfg.device!r} requested but torch sees no CUDA device; use --device cpu")
        args = [torch.from_numpy(a).to(cfg.device) for a in (padded_r, padded_v, padded_m)]
        adv, ret = compute_gae(*args, cfg.gamma, cfg.lam, backend=name, chunk_size=cfg.chunk,
                               carry_dtype=cfg.carry_dtype, threads=threads)
        adv, ret = adv.cpu().numpy(), ret.cpu().numpy()
    else:
        adv, ret = compute_gae(padded_r, padded_v, padded_m, cfg.gamma, cfg.lam, backend=name,
                               chunk_size=cfg.chunk, carry_dtype=cfg.carry_dtype, threads=threads)
    if cfg.whiten:
        try:
            adv = masked_whiten(adv, padded_m)
        except DataError as exc:
            raise DataError(f"{source}: cannot whiten: {exc}") from None
    seconds = time.perf_counter() - start

    schema = gae_output_schema()
    for field, padded in ((schema.field(ADVANTAGES), adv), (schema.field(RETURNS), ret)):
        flat, new_offsets = padded_to_ragged(padded, lengths)
        column = numpy_to_list_array(np.ascontiguousarray(flat, dtype=np.float32), new_offsets, pa.float32())
        if field.name in table.column_names:
            table = table.drop_columns([field.name])
        table = table.append_column(field, column)
    summary = GaeRunSummary(out=Path(cfg.out), rows=table.num_rows, tokens=int(lengths.sum()),
                            valid_tokens=int(mask.sum()), backend=name, seconds=seconds,
                            dropped_rewards=tuple(int(r) for r in dropped))
    return table, summary


def _mask_nulls_as_all_valid(column: pa.ChunkedArray, lengths: np.ndarray) -> pa.Array:
    """The mask column with each null row replaced by ones, as long as the row's values list: ``pdsr rollout``
    writes ``response_mask`` null for a single-turn sample (every token sampled), and ``trainer_batch`` reads it
    so. Anything else odd (not a list of numbers, null elements) is left for list_column_to_numpy to name."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = column.type
    if (not column.null_count or not (pa.types.is_list(kind) or pa.types.is_large_list(kind))
            or not (pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type)
                    or pa.types.is_boolean(kind.value_type)) or len(column) != len(lengths)):
        return column
    flat = column.flatten()   # the valid rows' elements, in row order
    if flat.null_count:
        return column
    null = ~np.asarray(column.is_valid())
    row_lengths = np.where(null, lengths, np.asarray(column.value_lengths().fill_null(0), dtype=np.int64))
    offsets = np.zeros(len(row_lengths) + 1, dtype=np.int64)
    np.cumsum(row_lengths, out=offsets[1:])
    in_null_row = np.repeat(null, row_lengths)
    values = np.ones(int(offsets[-1]), dtype=np.float64)
    values[~in_null_row] = np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float64)
    return numpy_to_list_array(values, offsets, pa.float64())


def _check_finite(source, name: str, flat: np.ndarray, offsets: np.ndarray) -> None:
    """NaN/inf would spread through a row's advantages (with whitening, the whole file's): name the first."""
    bad = np.flatnonzero(~np.isfinite(flat))
    if bad.size:
        i = int(bad[0])
        row = int(np.searchsorted(offsets, i, side="right") - 1)
        raise DataError(f"{source}: column {name!r} row {row} token {i - int(offsets[row])} is {flat[i]}; expected "
                        f"finite numbers ({bad.size} non-finite value(s) in the column)")


def _check_lengths(source, name_a: str, len_a: np.ndarray, name_b: str, len_b: np.ndarray) -> None:
    bad = np.flatnonzero(len_a != len_b)
    if bad.size:
        row = int(bad[0])
        raise DataError(f"{source}: row {row}: {name_a!r} has {int(len_a[row])} elements but {name_b!r} has "
                        f"{int(len_b[row])}; the per-token lists of a row must have equal length "
                        f"({bad.size} row(s) differ)")


def rewards_column_name(table: pa.Table, cfg: GaeConfig, source) -> str:
    """The rewards column ``cfg`` names, or without one 'rewards' if ``table`` has it, else 'reward' (the
    column ``pdsr rollout`` writes)."""
    if cfg.rewards_column:
        return cfg.rewards_column
    for name in ("rewards", "reward"):
        if name in table.column_names:
            return name
    raise DataError(f"{source}: no rewards column: neither 'rewards' nor 'reward' (the column `pdsr rollout` "
                    f"writes); name one with --rewards-column (config key rewards_column); the file has: "
                    f"{', '.join(table.column_names) or '(no columns)'}")


def _rewards(table: pa.Table, cfg: GaeConfig, source, offsets: np.ndarray,
             mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat per-token rewards (a scalar column goes on each row's last valid token), and the rows whose scalar
    reward is not 0 but that have no valid token to carry it."""
    name = rewards_column_name(table, cfg, source)
    column = table.column(name)
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        rewards, r_offsets = list_column_to_numpy(column, np.float32, name=name, path=source)
        _check_lengths(source, name, np.diff(r_offsets), cfg.values_column, np.diff(offsets))
        _check_finite(source, name, rewards, r_offsets)
        return rewards, np.zeros(0, dtype=np.int64)
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
        raise DataError(f"{source}: column {name!r} must be a list of numbers per row or one number "
                        f"per row, got {kind}")
    if column.null_count:
        row = int(np.flatnonzero(~np.asarray(column.is_valid()))[0])
        raise DataError(f"{source}: column {name!r} row {row} is null; expected a number")
    scalars = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float32)
    bad = np.flatnonzero(~np.isfinite(scalars))
    if bad.size:
        raise DataError(f"{source}: column {name!r} row {int(bad[0])} is {scalars[bad[0]]}; expected "
                        f"a finite number ({bad.size} non-finite row(s))")
    rewards = np.zeros(int(offsets[-1]), dtype=np.float32)
    # last valid flat index of each row: the last valid index before the row's end, if inside the row
    valid_idx = np.flatnonzero(mask)
    k = np.searchsorted(valid_idx, offsets[1:], side="left") - 1
    last = valid_idx[np.maximum(k, 0)] if valid_idx.size else np.zeros(len(k), dtype=np.int64)
    has_valid = (k >= 0) & (last >= offsets[:-1])
    rewards[last[has_valid]] = scalars[has_valid]   # a row with no valid token carries no reward
    return rewards, np.flatnonzero(~has_valid & (scalars != 0))
