"""Advantages over a table file (``pdsr gae``): ragged list columns in, per-token list columns out. Critic GAE here;
the outcome estimators (GRPO, RLOO, REINFORCE++) in :mod:`pdsr_sdk.gae.outcome_table`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from pdsr_sdk.errors import ConfigError, DataError
from pdsr_sdk.gae.config import GaeConfig
from pdsr_sdk.io.tables import list_column_to_numpy, numpy_to_list_array, padded_to_ragged, ragged_to_padded
from pdsr_sdk.progress import ProgressFactory, silent_progress

ADVANTAGES = "advantages"
RETURNS = "returns"
#: padded cells (rows x longest row) per block of rows: GAE runs on padded arrays, and padding a whole file to its
#: longest row held rows x T_max x 17 bytes (8.7 GB peak for 100k rollout rows of 276 tokens on average and one of
#: 4,096); a block of 2^24 cells holds about 300 MB
BLOCK_CELLS = 1 << 24


def gae_output_schema() -> pa.Schema:
    """The columns ``pdsr gae`` appends to its input table."""
    return pa.schema(
        [
            pa.field(ADVANTAGES, pa.list_(pa.float32()), nullable=False, metadata={
                "description": "Per-token advantage. gae: A_t, as long as the row's rewards list; at a masked "
                               "token the advantage of the next valid token, after the last valid token 0; "
                               "whitened over the file's valid tokens when --whiten is given. grpo, rloo: the "
                               "sample's advantage on each valid token of its response, 0 on masked ones. "
                               "reinforce_plus_plus(_baseline): verl's, whitened over the file's valid tokens, "
                               "0 on masked ones."}),
            pa.field(RETURNS, pa.list_(pa.float32()), nullable=False, metadata={
                "description": "Per-token return. gae: the value target A_t + V_t, with A_t before whitening. "
                               "reinforce_plus_plus: the discounted return of each valid token, 0 on masked "
                               "ones. Not written by the other estimators."}),
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
    backend: str                # of the scan; "" for the estimators that run none (grpo, rloo, the baseline)
    seconds: float              # computing, in every pass over the file (reading and writing not counted)
    #: rows whose scalar reward is not 0 but that have no valid token to carry it (their mask is all 0): their
    #: reward is in no advantage
    dropped_rewards: tuple[int, ...] = ()
    estimator: str = "gae"
    #: grpo, rloo, reinforce_plus_plus_baseline: the file's groups, and how many hold one sample (with singleton
    #: "zero" their advantage is 0: a file of prompts sampled once trains on nothing)
    groups: int = 0
    singleton_groups: int = 0


def run_gae_file(cfg: GaeConfig, *, progress: ProgressFactory | None = None) -> GaeRunSummary:
    """Read ``cfg.data`` a block of rows at a time, compute the advantages, write ``cfg.out`` atomically (checked
    writable first): :mod:`pdsr_sdk.gae.file_run`. ``progress``: a factory whose bars count the rows done in each
    pass over the file (:mod:`pdsr_sdk.progress`; default silent)."""
    from pdsr_sdk.gae.file_run import run_gae_file as run

    return run(cfg, progress=progress)


def gae_table(table: pa.Table, cfg: GaeConfig, *, source: str | Path = "",
              progress: ProgressFactory | None = None) -> tuple[pa.Table, GaeRunSummary]:
    """``table`` plus ``advantages`` and ``returns`` columns computed as ``cfg`` says, in blocks of rows each padded
    to its own longest row (:data:`BLOCK_CELLS`), not the whole table to the longest row of all."""
    from pdsr_sdk.gae import masked_whiten

    if cfg.estimator != "gae":
        from pdsr_sdk.gae.outcome_table import outcome_table

        return outcome_table(table, cfg, source=source, progress=progress)
    block = critic_block(table, cfg, source, progress=progress)
    start = time.perf_counter()
    adv = block.advantages
    if cfg.whiten:
        try:   # over the flat tokens: the same entries, in the same order, as over a padded [B, T] array
            adv = masked_whiten(adv, block.mask)
        except DataError as exc:
            raise DataError(f"{source}: cannot whiten: {exc}") from None
    seconds = block.seconds + time.perf_counter() - start

    table = with_token_columns(table, {ADVANTAGES: adv, RETURNS: block.returns}, block.offsets)
    summary = GaeRunSummary(out=Path(cfg.out), rows=table.num_rows, tokens=int(block.offsets[-1]),
                            valid_tokens=int(block.mask.sum()), backend=block.backend, seconds=seconds,
                            dropped_rewards=tuple(int(r) for r in block.dropped))
    return table, summary


@dataclass(frozen=True)
class Rows:
    """Which of the file's rows a table holds (``count`` from ``first``; None: all), so that an error about its
    row i names the file's row ``first + i`` and says over which rows it counted the bad entries."""

    first: int = 0
    count: int | None = None

    def row(self, i) -> int:
        return self.first + int(i)

    def among(self) -> str:
        return "" if self.count is None else f" in rows {self.first}-{self.first + self.count - 1}"


ALL_ROWS = Rows()


@dataclass(frozen=True)
class CriticBlock:
    """Critic GAE of a table's rows (:func:`critic_block`): flat per-token arrays over ``offsets`` (from 0)."""

    advantages: np.ndarray      # float32, not whitened
    returns: np.ndarray         # float32
    mask: np.ndarray            # bool
    offsets: np.ndarray
    dropped: np.ndarray         # the file's rows whose scalar reward no valid token carries
    backend: str
    seconds: float              # of the scan


def critic_block(table: pa.Table, cfg: GaeConfig, source, rows: Rows = ALL_ROWS,
                 progress: ProgressFactory | None = None) -> CriticBlock:
    """GAE of ``table``'s rows (the whole file, or with ``rows`` a block of it) as ``cfg`` says, its columns
    checked (errors name the file's rows), before any whitening."""
    require_columns(table, source, {cfg.values_column: "--values-column", **mask_flag(cfg)},
                    hint="; without a critic's values, an outcome estimator: --estimator grpo, rloo, "
                         "reinforce_plus_plus or reinforce_plus_plus_baseline")
    values, offsets = flat_list(table.column(cfg.values_column), np.float32, cfg.values_column, source, rows)
    lengths = np.diff(offsets)
    check_finite(source, cfg.values_column, values, offsets, rows)
    if cfg.mask_column:
        mask_col = mask_nulls_as_all_valid(table.column(cfg.mask_column), lengths)
        mask, mask_offsets = flat_list(mask_col, np.float64, cfg.mask_column, source, rows)
        check_lengths(source, cfg.values_column, lengths, cfg.mask_column, np.diff(mask_offsets), rows)
        check_finite(source, cfg.mask_column, mask, mask_offsets, rows)
        mask = mask != 0
    else:
        mask = np.ones(len(values), dtype=np.bool_)
    rewards, dropped = token_rewards(table, cfg, source, offsets, mask, cfg.values_column, rows)
    start = time.perf_counter()
    adv, ret, name = scan_rows(rewards, values, mask, offsets, cfg, cfg.lam, progress)
    return CriticBlock(adv, ret, mask, offsets, dropped + rows.first, name, time.perf_counter() - start)


def flat_list(column, dtype, name: str, source, rows: Rows = ALL_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~pdsr_sdk.io.tables.list_column_to_numpy`, its errors naming the file's row."""
    try:
        return list_column_to_numpy(column, dtype, name=name, path=source)
    except DataError as exc:
        head = f"{source}: column {name!r} row "
        text = str(exc)
        if rows.first == 0 or not text.startswith(head):
            raise
        row, _, rest = text[len(head):].partition(" ")
        raise DataError(f"{head}{rows.row(int(row))} {rest}") from None


def with_token_columns(table: pa.Table, flats: dict[str, np.ndarray], offsets: np.ndarray) -> pa.Table:
    """``table`` with each of ``flats`` (flat per-token float32 arrays over ``offsets``) as a list column of the
    output schema, replacing a column of that name."""
    schema = gae_output_schema()
    for name, flat in flats.items():
        column = numpy_to_list_array(flat, offsets, pa.float32())
        if name in table.column_names:
            table = table.drop_columns([name])
        table = table.append_column(schema.field(name), column)
    return table


def scan_rows(rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, offsets: np.ndarray, cfg: GaeConfig,
              lam: float, progress: ProgressFactory | None) -> tuple[np.ndarray, np.ndarray, str]:
    """Masked GAE of flat per-token arrays over ``offsets`` with ``cfg``'s backend and gamma and ``lam``, in blocks
    of rows (:func:`row_blocks`): the flat advantages, returns, and the backend's name."""
    from pdsr_sdk.gae.api import get_backend, resolve_backend_name

    cuda = cfg.device.startswith("cuda")
    name = resolve_backend_name(cfg.backend, cuda=cuda)
    backend = get_backend(name)
    backend.warmup("float32", cfg.carry_dtype)
    if cuda:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"device: {cfg.device!r} requested but torch sees no CUDA device; use --device cpu")
    adv = np.empty(len(values), dtype=np.float32)
    ret = np.empty(len(values), dtype=np.float32)
    bar = (progress or silent_progress)(desc=cfg.estimator, total=int(offsets[-1]), unit="token")
    try:
        for first, end in row_blocks(np.diff(offsets), BLOCK_CELLS):
            a, b = int(offsets[first]), int(offsets[end])
            block = offsets[first:end + 1] - a
            adv[a:b], ret[a:b] = _gae_block(rewards[a:b], values[a:b], mask[a:b], block, cfg, lam, name, cuda or
                                            backend.array_kind == "torch")
            bar.update(b - a)
    finally:
        bar.close()
    return adv, ret, name


def require_columns(table: pa.Table | pa.Schema, source, flags: dict[str, str], hint: str = "") -> None:
    """A DataError naming the first of ``flags``' columns (column -> the flag that names it) ``table`` (or a
    file's schema) lacks."""
    names = column_names(table)
    for column, flag in flags.items():
        if column not in names:
            key = flag.removeprefix("--").replace("-", "_")
            raise DataError(f"{source}: no column {column!r} ({flag}, config key {key}); the file has: "
                            f"{', '.join(names) or '(no columns)'}{hint}")


def column_names(table: pa.Table | pa.Schema) -> list[str]:
    return table.names if isinstance(table, pa.Schema) else table.column_names


def mask_flag(cfg: GaeConfig) -> dict[str, str]:
    return {cfg.mask_column: "--mask-column"} if cfg.mask_column else {}


def row_blocks(lengths: np.ndarray, cells: int) -> list[tuple[int, int]]:
    """Consecutive row ranges ``(first, end)`` covering every row, each as few as its padded size (rows x its
    longest row) keeps within ``cells``; a row longer than ``cells`` is a block of its own."""
    blocks: list[tuple[int, int]] = []
    first, longest = 0, 0
    for i, n in enumerate(lengths.tolist()):
        wider = max(longest, n)
        if i > first and (i - first + 1) * wider > cells:
            blocks.append((first, i))
            first, wider = i, n
        longest = wider
    if len(lengths):
        blocks.append((first, len(lengths)))
    return blocks


def _gae_block(rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, offsets: np.ndarray, cfg: GaeConfig,
               lam: float, name: str, as_torch: bool) -> tuple[np.ndarray, np.ndarray]:
    """GAE of one block of rows (flat arrays and their offsets from 0), padded to the block's longest row;
    the flat advantages and returns."""
    from pdsr_sdk.gae import compute_gae

    padded_r, lengths = ragged_to_padded(rewards, offsets, dtype=np.float32)
    padded_v, _ = ragged_to_padded(values, offsets, dtype=np.float32)
    padded_m, _ = ragged_to_padded(mask, offsets, fill=False, dtype=np.bool_)
    threads = cfg.threads or None
    if as_torch:
        import torch

        args = [torch.from_numpy(x).to(cfg.device) for x in (padded_r, padded_v, padded_m)]
        adv, ret = compute_gae(*args, cfg.gamma, lam, backend=name, chunk_size=cfg.chunk,
                               carry_dtype=cfg.carry_dtype, threads=threads)
        adv, ret = adv.cpu().numpy(), ret.cpu().numpy()
    else:
        adv, ret = compute_gae(padded_r, padded_v, padded_m, cfg.gamma, lam, backend=name,
                               chunk_size=cfg.chunk, carry_dtype=cfg.carry_dtype, threads=threads)
    return padded_to_ragged(adv, lengths)[0], padded_to_ragged(ret, lengths)[0]


def mask_nulls_as_all_valid(column: pa.ChunkedArray, lengths: np.ndarray) -> pa.Array:
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


def check_finite(source, name: str, flat: np.ndarray, offsets: np.ndarray, rows: Rows = ALL_ROWS) -> None:
    """NaN/inf would spread through a row's advantages (with whitening, the whole file's): name the first."""
    bad = np.flatnonzero(~np.isfinite(flat))
    if bad.size:
        i = int(bad[0])
        row = int(np.searchsorted(offsets, i, side="right") - 1)
        raise DataError(f"{source}: column {name!r} row {rows.row(row)} token {i - int(offsets[row])} is {flat[i]}; "
                        f"expected finite numbers ({bad.size} non-finite value(s) in the column{rows.among()})")


def check_lengths(source, name_a: str, len_a: np.ndarray, name_b: str, len_b: np.ndarray,
                  rows: Rows = ALL_ROWS) -> None:
    bad = np.flatnonzero(len_a != len_b)
    if bad.size:
        row = int(bad[0])
        raise DataError(f"{source}: row {rows.row(row)}: {name_a!r} has {int(len_a[row])} elements but {name_b!r} "
                        f"has {int(len_b[row])}; the per-token lists of a row must have equal length "
                        f"({bad.size} row(s) differ{rows.among()})")


def rewards_column_name(table: pa.Table | pa.Schema, cfg: GaeConfig, source) -> str:
    """The rewards column ``cfg`` names, or without one 'rewards' if ``table`` has it, else 'reward' (the
    column ``pdsr rollout`` writes)."""
    if cfg.rewards_column:
        require_columns(table, source, {cfg.rewards_column: "--rewards-column"})
        return cfg.rewards_column
    for name in ("rewards", "reward"):
        if name in column_names(table):
            return name
    raise DataError(f"{source}: no rewards column: neither 'rewards' nor 'reward' (the column `pdsr rollout` "
                    f"writes); name one with --rewards-column (config key rewards_column); the file has: "
                    f"{', '.join(column_names(table)) or '(no columns)'}")


def token_rewards(table: pa.Table, cfg: GaeConfig, source, offsets: np.ndarray, mask: np.ndarray,
                  lengths_name: str, rows: Rows = ALL_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Flat per-token rewards (a scalar column goes on each row's last valid token; a list column's rows as long
    as ``lengths_name``'s), and the rows whose scalar reward is not 0 but that have no valid token to carry it."""
    name = rewards_column_name(table, cfg, source)
    column = table.column(name)
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        rewards, r_offsets = flat_list(column, np.float32, name, source, rows)
        check_lengths(source, name, np.diff(r_offsets), lengths_name, np.diff(offsets), rows)
        check_finite(source, name, rewards, r_offsets, rows)
        return rewards, np.zeros(0, dtype=np.int64)
    scalars = reward_scalars(column, name, source, reward_error_in(table), rows).astype(np.float32)
    rewards = np.zeros(int(offsets[-1]), dtype=np.float32)
    # last valid flat index of each row: the last valid index before the row's end, if inside the row
    valid_idx = np.flatnonzero(mask)
    k = np.searchsorted(valid_idx, offsets[1:], side="left") - 1
    last = valid_idx[np.maximum(k, 0)] if valid_idx.size else np.zeros(len(k), dtype=np.int64)
    has_valid = (k >= 0) & (last >= offsets[:-1])
    rewards[last[has_valid]] = scalars[has_valid]   # a row with no valid token carries no reward
    return rewards, np.flatnonzero(~has_valid & (scalars != 0))


def reward_error_in(table: pa.Table) -> Callable[[int], object]:
    """The ``reward_error`` (what `pdsr rollout` writes of a reward function that raised) of ``table``'s row i."""
    if "reward_error" not in table.column_names:
        return lambda i: None
    return lambda i: table.column("reward_error")[i].as_py()


def reward_scalars(column: pa.ChunkedArray, name: str, source, reward_error: Callable[[int], object],
                   rows: Rows = ALL_ROWS) -> np.ndarray:
    """A column of one reward per row as float64; a null (a reward function that failed: `pdsr rollout` writes
    its exception in ``reward_error``, row i's given by ``reward_error(i)``) or non-finite one is a DataError
    naming the file's row."""
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
        raise DataError(f"{source}: column {name!r} must be a list of numbers per row or one number "
                        f"per row, got {kind}")
    if column.null_count:
        null = np.flatnonzero(~np.asarray(column.is_valid()))
        row = int(null[0])
        why = reward_error(row)
        why = f"; its reward_error: {str(why).strip().splitlines()[-1][:200]}" if why else ""
        raise DataError(f"{source}: column {name!r} row {rows.row(row)} is null ({null.size} null row(s)"
                        f"{rows.among()}){why}; expected a number: leave out the samples without a reward, or give "
                        f"them one")
    scalars = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(scalars))
    if bad.size:
        raise DataError(f"{source}: column {name!r} row {rows.row(bad[0])} is {scalars[bad[0]]}; expected "
                        f"a finite number ({bad.size} non-finite row(s){rows.among()})")
    return scalars
