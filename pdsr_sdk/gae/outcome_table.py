"""``pdsr gae --estimator grpo|rloo|reinforce_plus_plus|reinforce_plus_plus_baseline``: advantages without a critic
over a table of rollouts, as verl feeds them to its loss (per token, 0 on masked tokens).

The per-sample numbers (group means and stds) are taken over the whole file at once, so a group's rows may lie
anywhere in it; only REINFORCE++'s per-token return runs in blocks of rows (:func:`~pdsr_sdk.gae.table.scan_rows`),
each row whole in one block, and is whitened over the whole file after. :mod:`pdsr_sdk.gae.file_run` runs the same
functions over a file a block of rows at a time.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from pdsr_sdk.errors import DataError
from pdsr_sdk.gae.config import GaeConfig
from pdsr_sdk.gae.table import (ADVANTAGES, ALL_ROWS, RETURNS, GaeRunSummary, Rows, check_finite, check_lengths,
                                flat_list, mask_flag, mask_nulls_as_all_valid, require_columns, reward_error_in,
                                reward_scalars, rewards_column_name, scan_rows, token_rewards, with_token_columns)
from pdsr_sdk.progress import ProgressFactory

GROUPED = ("grpo", "rloo", "reinforce_plus_plus_baseline")


def outcome_table(table: pa.Table, cfg: GaeConfig, *, source: str | Path = "",
                  progress: ProgressFactory | None = None) -> tuple[pa.Table, GaeRunSummary]:
    """``table`` plus ``advantages`` (and for reinforce_plus_plus ``returns``) by ``cfg.estimator``."""
    from pdsr_sdk.gae import masked_whiten

    grouped = cfg.estimator in GROUPED
    require_columns(table, source, outcome_flags(cfg))
    offsets = token_offsets(table, cfg.tokens_column, source)
    lengths = np.diff(offsets)
    mask = valid_tokens(table, cfg, source, lengths)
    start = time.perf_counter()
    columns: dict[str, np.ndarray] = {}
    dropped: np.ndarray = np.zeros(0, dtype=np.int64)
    backend = ""
    counts = np.zeros(0, dtype=np.int64)
    if grouped:
        rewards = sample_rewards(table, cfg, source, lengths)
        per_sample, counts = per_sample_advantages(rewards, group_ids(table.column(cfg.group_column),
                                                                      cfg.group_column, source), cfg)
        adv = np.where(mask, np.repeat(per_sample, lengths), 0.0)    # verl: scores.unsqueeze(-1) * response_mask
    else:
        token, dropped = token_rewards(table, cfg, source, offsets, mask, cfg.tokens_column)
        adv, backend = discounted_returns(token, mask, offsets, cfg, progress)
        columns[RETURNS] = adv.astype(np.float32)
    if cfg.estimator.startswith("reinforce_plus_plus"):
        check_whiten_count(int(mask.sum()), cfg, source)
        adv = np.where(mask, masked_whiten(adv.astype(np.float64), mask), 0.0)
    columns = {ADVANTAGES: adv.astype(np.float32), **columns}
    seconds = time.perf_counter() - start
    table = with_token_columns(table, columns, offsets)
    summary = GaeRunSummary(out=Path(cfg.out), rows=table.num_rows, tokens=int(lengths.sum()),
                            valid_tokens=int(mask.sum()), backend=backend, seconds=seconds,
                            dropped_rewards=tuple(int(r) for r in dropped), estimator=cfg.estimator,
                            groups=len(counts), singleton_groups=int((counts == 1).sum()))
    return table, summary


def outcome_flags(cfg: GaeConfig) -> dict[str, str]:
    """The columns ``cfg.estimator`` reads beside the rewards, each with the flag that names it."""
    grouped = {cfg.group_column: "--group-column"} if cfg.estimator in GROUPED else {}
    return {cfg.tokens_column: "--tokens-column", **mask_flag(cfg), **grouped}


def per_sample_advantages(rewards: np.ndarray, groups: np.ndarray, cfg: GaeConfig) -> tuple[np.ndarray, np.ndarray]:
    """A grouped estimator's advantage of each sample (float64), and the size of each group."""
    from pdsr_sdk.gae import grpo_advantages, rloo_advantages

    counts = np.unique(groups, return_counts=True)[1]
    if cfg.estimator == "grpo":
        per_sample = grpo_advantages(rewards, groups, normalize_std=cfg.normalize_std, eps=cfg.eps,
                                     singleton=cfg.singleton)
    elif cfg.estimator == "rloo":
        per_sample = rloo_advantages(rewards, groups, singleton=cfg.singleton)
    else:   # the reward less its group's mean (a singleton's: 0, or with "score" its reward), whitened after
        per_sample = grpo_advantages(rewards, groups, normalize_std=False, singleton=cfg.singleton)
    return per_sample, counts


def discounted_returns(token_rewards: np.ndarray, mask: np.ndarray, offsets: np.ndarray, cfg: GaeConfig,
                       progress: ProgressFactory | None = None) -> tuple[np.ndarray, str]:
    """REINFORCE++'s per-token return, 0 on masked tokens (float32), and the scan's backend: GAE with values 0 and
    lambda 1."""
    returns, _, backend = scan_rows(token_rewards, np.zeros_like(token_rewards), mask, offsets, cfg, 1.0, progress)
    # after a row's last valid token the scan leaves 0; inside, it carries
    return np.where(mask, returns, 0.0), backend


def check_whiten_count(valid: int, cfg: GaeConfig, source) -> None:
    if valid < 2:
        raise DataError(f"{source}: {valid} valid token(s) in all; {cfg.estimator} whitens the advantages over "
                        f"the file's valid tokens and needs at least 2")


def token_offsets(table: pa.Table, name: str, source, rows: Rows = ALL_ROWS) -> np.ndarray:
    """Row offsets into the flat tokens: each row as long as its list in column ``name``."""
    column = table.column(name)
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        raise DataError(f"{source}: column {name!r} (--tokens-column) must hold a list per row (the response's "
                        f"tokens), got {column.type}")
    if column.null_count:
        row = rows.row(np.flatnonzero(~np.asarray(column.is_valid()))[0])
        raise DataError(f"{source}: column {name!r} (--tokens-column) row {row} is null; expected the response's "
                        f"tokens (an empty list for an empty response)")
    lengths = np.concatenate([np.asarray(c.value_lengths(), dtype=np.int64) for c in column.chunks] or
                             [np.zeros(0, dtype=np.int64)])
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def valid_tokens(table: pa.Table, cfg: GaeConfig, source, lengths: np.ndarray, rows: Rows = ALL_ROWS) -> np.ndarray:
    """The flat response mask as bool (a null row, or no mask column: every token valid)."""
    if not cfg.mask_column:
        return np.ones(int(lengths.sum()), dtype=np.bool_)
    column = mask_nulls_as_all_valid(table.column(cfg.mask_column), lengths)
    mask, offsets = flat_list(column, np.float64, cfg.mask_column, source, rows)
    check_lengths(source, cfg.tokens_column, lengths, cfg.mask_column, np.diff(offsets), rows)
    check_finite(source, cfg.mask_column, mask, offsets, rows)
    return mask != 0


def sample_rewards(table: pa.Table, cfg: GaeConfig, source, lengths: np.ndarray, rows: Rows = ALL_ROWS,
                   reward_error: Callable[[int], object] | None = None) -> np.ndarray:
    """One reward per row, float64: the rewards column's number, or its list's sum (verl's
    ``token_level_rewards.sum(dim=-1)``, masked tokens included), each list as long as the row's tokens.
    ``reward_error``: row i's reward_error (default: ``table``'s column)."""
    name = rewards_column_name(table, cfg, source)
    column = table.column(name)
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        return reward_scalars(column, name, source, reward_error or reward_error_in(table), rows)
    if column.null_count:
        row = rows.row(np.flatnonzero(~np.asarray(column.is_valid()))[0])
        raise DataError(f"{source}: column {name!r} row {row} is null; expected a list of per-token rewards")
    flat, offsets = flat_list(column, np.float64, name, source, rows)
    check_lengths(source, name, np.diff(offsets), cfg.tokens_column, lengths, rows)
    check_finite(source, name, flat, offsets, rows)
    return np.bincount(np.repeat(np.arange(len(lengths)), lengths), weights=flat, minlength=len(lengths))


def group_ids(column: pa.ChunkedArray, name: str, source) -> np.ndarray:
    """The group id of each row of a column (the whole file's), numbers or text; a null one is a DataError naming
    the row."""
    if column.null_count:
        row = int(np.flatnonzero(~np.asarray(column.is_valid()))[0])
        raise DataError(f"{source}: column {name!r} (--group-column) row {row} is null; every sample needs its "
                        f"group's id")
    kind = column.type
    if pa.types.is_dictionary(kind):   # a pandas category, a dictionary-encoded Parquet column: its values are the ids
        column, kind = column.cast(kind.value_type), kind.value_type
    if not (pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_boolean(kind) or pa.types.is_floating(kind)):
        raise DataError(f"{source}: column {name!r} (--group-column) must hold a number or text id per row, got "
                        f"{kind}")
    return np.asarray(column.to_numpy(zero_copy_only=False))
