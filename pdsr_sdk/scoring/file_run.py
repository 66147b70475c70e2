"""``pdsr score`` on a file: read, score and write blocks of rows, so memory holds a block and a run can resume.

A first pass reads only the two token columns and checks every row (types, nulls, empty prompts, ids in the
vocabulary, lengths within the model's context and the token quota), naming the file and row before the model
loads. The rows are then cut into blocks of about ``block_tokens`` tokens (:func:`plan_blocks`); each block is
scored and written to ``<out>.parts/`` (:mod:`pdsr_sdk.scoring.resume`), and the blocks are merged into ``out``
at the end (atomic rename). ``resume`` keeps the blocks an interrupted run finished, after checking each against
its rows of the input. One run at a time writes an output (:func:`~pdsr_sdk.io.output_lock.output_lock`): two on
one ``out`` would write the same block files.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from pdsr_sdk.errors import ConfigError, DataError, DataValueError, Interrupted
from pdsr_sdk.io.blocks import TableBatches, open_table_batches
from pdsr_sdk.io.output_lock import output_lock
from pdsr_sdk.io.tables import atomic_path, check_new_output, remove_stale_temps, write_table_atomic
from pdsr_sdk.progress import ProgressFactory, silent_progress
from pdsr_sdk.scoring import resume as parts
from pdsr_sdk.scoring.api import Ragged, ScoreStats, check_context, score_checked, validate_rows
from pdsr_sdk.scoring.backend import ScoreMeter, get_backend
from pdsr_sdk.scoring.config import ScoreConfig
from pdsr_sdk.scoring.rollout_input import with_rollout_temperature
from pdsr_sdk.scoring.tokenizer_check import check_tokenizer


class _FileMeter(ScoreMeter):
    """A block's meter that advances the file's one progress bar, in tokens."""

    def __init__(self, lengths: np.ndarray, bar: Any):
        super().__init__(lengths)
        self.bar_of_file = bar

    def start(self, total: int) -> None:
        import time

        self.t0 = time.perf_counter()

    def advance(self, indices) -> None:
        self.bar_of_file.update(int(self.lengths[list(indices)].sum()))

    def stop(self) -> None:
        import time

        self.seconds = time.perf_counter() - self.t0


def score_file(config: ScoreConfig, *, progress: ProgressFactory | None = None) -> tuple[Path, ScoreStats]:
    """Read ``config.data``, score it in blocks of rows, write ``config.out``; returns (path, stats of the rows
    scored by this call; ``stats.resumed_samples``: rows kept from an interrupted run). See the module doc. The
    output's lock (``<out>.lock``) is held for the whole call: a second run on the same ``out`` is a DataError
    naming it, before it reads or writes anything there."""
    with output_lock(config.out, "pdsr score"):
        return _score_file(config, progress)


def _score_file(config: ScoreConfig, progress: ProgressFactory | None) -> tuple[Path, ScoreStats]:
    out = Path(config.out)
    check_new_output(out, "out (--out)", overwrite=config.overwrite or config.resume)
    model_dir = _model_dir(config)
    on_disk = parts.finished_parts(out)
    if on_disk and not (config.resume or config.overwrite):
        raise ConfigError(f"{parts.parts_dir(out)}: an interrupted run of pdsr score left {len(on_disk)} finished "
                          f"block(s) there: continue it with --resume, or start over with --overwrite")
    if config.overwrite and parts.parts_dir(out).exists():
        shutil.rmtree(parts.parts_dir(out))
        on_disk = []
    columns = {config.prompt_column: "--prompt-column", config.response_column: "--response-column"}
    source = open_table_batches(config.data, columns, what="scoring input", setting="data (--data)")
    given = "temperature" in config.model_fields_set
    config, recorded = with_rollout_temperature(config, source.schema)   # a rollout's file: at its temperature
    if not given:
        _check_rollout_temperature(config, recorded)
    temperatures = dict(temperature=config.temperature, rollout_temperature=recorded)
    settings = parts.run_settings(config, model_dir)
    if config.resume:
        done = _finished_output(out, settings, on_disk, source.num_rows)
        if done is not None:
            return out, replace(done, **temperatures)
        for part in on_disk[:1]:
            parts.check_settings(parts.parts_dir(out), part.settings, settings)
    where = str(config.data)
    lengths = scan_rows(source, config, model_dir, where)
    check_tokenizer(source, model_dir, config.response_column, where)
    plan = plan_blocks(lengths, config.block_tokens, config.mbs)
    kept = _kept_blocks(out, on_disk, plan)
    run_id = on_disk[0].run_id if kept else uuid.uuid4().hex
    parts.remove_temps(out)
    remove_stale_temps(out)
    stats = _score_blocks(source, config, model_dir, plan, kept, lengths, where,
                          dict(settings=settings, run_id=run_id), progress or silent_progress)
    _merge(out, source, config, len(plan), dict(settings=settings, run_id=run_id, rows=int(len(lengths))))
    return out, replace(stats, resumed_samples=sum(b - a for a, b in plan[:kept]), **temperatures)


def _model_dir(config: ScoreConfig) -> Path:
    if config.model is not None:
        from pdsr_sdk.scoring.checkpoint import check_model_dir

        return check_model_dir(config.model)  # fail before reading a large input
    from pdsr_sdk.models.tiny import ensure_tiny_model

    return Path(ensure_tiny_model())


def _check_rollout_temperature(config: ScoreConfig, recorded: float | None) -> None:
    """The vllm backend scores at temperature 1 only: where the temperature is the one the rollout recorded in
    ``data`` (none given), say so, and what each way out means, rather than the backend's words about a
    temperature the user never gave."""
    if config.backend != "vllm" or recorded is None or recorded == 1.0:
        return
    raise ConfigError(f"{config.data}: the rollout in this file sampled at temperature {recorded:g} (recorded in its "
                      f"metadata), which pdsr score takes as its temperature (--temperature) unless given, but the "
                      f"vllm backend (--backend vllm) scores at temperature 1 only: vLLM's prompt log-probs are of "
                      f"the raw logits. Score with --backend torch for log-probs at {recorded:g}, as the rollout's "
                      f"response_logprobs and verl's old and reference log-probs are, or pass --temperature 1 for "
                      f"log-probs of the raw logits")


def _finished_output(out: Path, settings: dict, on_disk: list, rows: int) -> ScoreStats | None:
    """With --resume: stats of nothing scored where ``out`` is this run finished (its parts, if a kill left them,
    removed), None where there is a run to continue; a ConfigError where ``out`` is something else."""
    meta = parts.read_meta(out) if out.exists() else None
    if meta is None or (on_disk and on_disk[0].run_id != meta["run_id"]):
        if out.exists() and not on_disk:
            raise ConfigError(f"{out}: nothing to resume ({parts.parts_dir(out)} holds no finished block) and the "
                              f"output exists{'' if meta else ', not written by pdsr score'}: pass --overwrite to "
                              f"replace it")
        return None
    parts.check_settings(out, meta["settings"], settings)
    if int(meta["rows"]) != rows:
        raise DataError(f"{out}: finished on {meta['rows']} rows, but the input (--data) has {rows} now: it changed "
                        f"since; pass --overwrite to score it again")
    shutil.rmtree(parts.parts_dir(out), ignore_errors=True)
    return ScoreStats(backend=settings["backend"], mode="nothing left to score", samples=0, micro_batches=0,
                      distinct_shapes=None, shapes=(), real_tokens=0, computed_tokens=0, scored_tokens=0,
                      seconds=0.0, peak_memory_bytes=None, peak_memory_method="n/a", head="n/a",
                      resumed_samples=int(meta["rows"]))


def _kept_blocks(out: Path, on_disk: list, plan: list[tuple[int, int]]) -> int:
    """How many of the blocks on disk are the plan's first blocks (their rows are checked as they are read)."""
    for k, part in enumerate(on_disk):
        if k >= len(plan) or (part.first_row, part.first_row + part.rows) != plan[k]:
            raise DataError(f"{part.path}: holds rows {part.first_row}-{part.first_row + part.rows - 1}, but the "
                            f"input cuts into other blocks now: the input (--data) changed since the run was "
                            f"interrupted. Resume with its input, or start over with --overwrite")
    return len(on_disk)


# ------------------------------------------------------------------ first pass

def scan_rows(source: TableBatches, config: ScoreConfig, model_dir: Path, where: str) -> np.ndarray:
    """Check every row's token columns (reading only them, a batch at a time); prompt + response lengths."""
    from pdsr_sdk.scoring.api import _config_vocab_size

    vocab = _config_vocab_size(model_dir)
    names = dict(prompt_name=config.prompt_column, completion_name=config.response_column, where=where)
    lengths, first = [], 0
    for batch in source.batches([config.prompt_column, config.response_column]):
        prompts = token_column(batch, config.prompt_column, where, first)
        responses = token_column(batch, config.response_column, where, first)
        validate_rows(prompts, responses, vocab, first_row=first, **names)
        lengths.append(prompts.lengths + responses.lengths)
        first += batch.num_rows
    lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    quota = config.max_tokens_per_micro_batch
    too_long = np.flatnonzero(lengths > quota) if quota is not None else ()
    if len(too_long):   # (padded to a length bucket, a few more may not fit: the block names those)
        i = int(too_long[0])
        raise DataValueError(f"{where}: row {i}: prompt + completion = {int(lengths[i])} tokens does not fit "
                             f"max_tokens_per_micro_batch={quota}; raise the quota ({len(too_long)} row(s) in all)")
    check_context(lengths, context_limit(model_dir, config), where)
    return lengths


def token_column(batch: pa.Table, name: str, where: str, first_row: int) -> Ragged:
    """A list-of-integers column of a batch as :class:`Ragged`; a DataError naming the column and the file's row
    for another type, a null row or a null id."""
    from pdsr_sdk.io.columns import integer_token_ids, is_token_ids
    from pdsr_sdk.io.tables import list_column_to_numpy

    column = batch.column(name).combine_chunks()
    if not is_token_ids(column.type):
        raise DataError(f"{where}: column {name!r} must be a list of integer token ids, got {column.type}")
    column = integer_token_ids(column)   # list<null>: every list empty or null (the checks below say which)
    if column.null_count:
        row = first_row + int(np.flatnonzero(~np.asarray(column.is_valid()))[0])
        raise DataError(f"{where}: column {name!r} row {row} is null; expected a list of token ids")
    values, offsets = list_column_to_numpy(column, np.int64, name=name, path=where) if not column.values.null_count \
        else _null_id(column, name, where, first_row)
    return Ragged(values, offsets)


def _null_id(column: pa.Array, name: str, where: str, first_row: int):
    offsets = np.asarray(column.offsets, dtype=np.int64)
    flat = int(offsets[0]) + int(np.flatnonzero(~np.asarray(column.values.slice(int(offsets[0])).is_valid()))[0])
    row = first_row + int(np.searchsorted(offsets, flat, side="right") - 1)
    raise DataError(f"{where}: column {name!r} row {row} has a null token id")


def context_limit(model_dir: Path, config: ScoreConfig) -> tuple[int | None, str]:
    """The longest prompt + response the model takes, and what says so: its config.json
    (:func:`~pdsr_sdk.models.context.model_context`, as ``pdsr rollout`` and vLLM read it), or
    ``vllm_max_model_len`` - 1 where that is smaller (vLLM needs length + 1)."""
    from pdsr_sdk.models.context import model_context

    limit, what = model_context(model_dir)
    if config.backend == "vllm" and config.vllm_max_model_len and (limit is None
                                                                    or config.vllm_max_model_len - 1 < limit):
        limit = config.vllm_max_model_len - 1
        what = f"--vllm-max-model-len {config.vllm_max_model_len} - 1: vLLM needs prompt + completion + 1"
    return limit, what


def plan_blocks(lengths: np.ndarray, block_tokens: int, mbs: int | None = None) -> list[tuple[int, int]]:
    """Consecutive row ranges ``(first, end)`` covering every row, each closed once it holds ``block_tokens``
    tokens (so at most that plus one row), and with ``mbs`` only after a whole number of ``mbs`` rows (a fixed
    micro-batch never spans two blocks, and only the file's last is padded)."""
    step = mbs or 1
    blocks, first, tokens = [], 0, 0
    n = len(lengths)
    for start in range(0, n, step):
        end = min(start + step, n)
        tokens += int(lengths[start:end].sum())
        if tokens >= block_tokens:
            blocks.append((first, end))
            first, tokens = end, 0
    if first < n:
        blocks.append((first, n))
    return blocks


# ------------------------------------------------------------------ blocks

def row_blocks(source: TableBatches, plan: list[tuple[int, int]], where: str) -> Iterator[pa.Table]:
    """The input's rows (every column) as one table per planned block, reading a batch at a time."""
    batches = source.batches()
    pending: list[pa.Table] = []
    have = 0
    for first, end in plan:
        while have < end - first:
            batch = next(batches, None)
            if batch is None:
                raise DataError(f"{where}: the input ended at row {first + have}, before row {end - 1}: it changed "
                                f"while being scored")
            pending.append(batch)
            have += batch.num_rows
        table = pa.concat_tables(pending)
        rest = table.slice(end - first)
        yield table.slice(0, end - first)
        pending, have = ([rest], rest.num_rows) if rest.num_rows else ([], 0)


def _score_blocks(source: TableBatches, config: ScoreConfig, model_dir: Path, plan: list, kept: int,
                  lengths: np.ndarray, where: str, meta: dict, progress: ProgressFactory) -> ScoreStats:
    from pdsr_sdk.scoring.table import ENTROPY_DESCRIPTION, LOGPS_DESCRIPTION, _attach

    opts = config.options()
    backend = get_backend(opts.backend)
    backend.check(opts)
    todo = plan[kept:]
    model = owned = None
    if todo:
        model, owned = _load(backend, model_dir, opts, int(lengths.max(initial=0)))
    bar = progress(desc="score", total=int(sum(int(lengths[a:b].sum()) for a, b in todo)), unit="token")
    all_stats = []
    scores = (config.column, f"{config.column}_entropy")
    try:
        vocab = backend.vocab_size(model) if todo else None
        for index, block in enumerate(row_blocks(source, plan, where)):
            first, end = plan[index]
            if index < kept:
                _check_kept(parts.part_path(config.out, index), block.drop_columns(
                    [c for c in scores if c in block.column_names]), first, end)
                continue
            prompts = token_column(block, config.prompt_column, where, first)
            responses = token_column(block, config.response_column, where, first)
            if vocab is not None:
                validate_rows(prompts, responses, int(vocab), prompt_name=config.prompt_column,
                              completion_name=config.response_column, where=where, first_row=first)
            meter = _FileMeter(prompts.lengths + responses.lengths, bar)
            try:
                result = score_checked(backend, model, prompts, responses, opts, meter)
            except DataValueError as exc:
                raise DataValueError(f"{where}: {_file_rows(str(exc), first)}") from None
            scored = _attach(block, config.column, result.logps, LOGPS_DESCRIPTION)
            if result.entropy is not None:
                scored = _attach(scored, f"{config.column}_entropy", result.entropy, ENTROPY_DESCRIPTION)
            block_meta = json.dumps({**meta, "first_row": first, "rows": end - first}).encode()
            write_table_atomic(scored.replace_schema_metadata({**(scored.schema.metadata or {}),
                                                               parts.METADATA_KEY: block_meta}),
                               parts.part_path(config.out, index))
            all_stats.append(result.stats)
    except KeyboardInterrupt as exc:
        done = len(parts.finished_parts(Path(config.out)))
        raise Interrupted(f"{str(exc) or 'interrupted'}: {done} of {len(plan)} blocks "
                          f"({plan[done - 1][1] if done else 0}"
                          f" of {len(lengths)} rows) are scored in {parts.parts_dir(config.out)}; continue with "
                          f"--resume", getattr(exc, "exit_status", 130)) from None
    finally:
        bar.close()
        if owned is not None:
            from pdsr_sdk.scoring.vllm_backend import shutdown_engine

            shutdown_engine(owned)
    return _sum_stats(all_stats, opts.backend)


def _load(backend: Any, model_dir: Path, opts, longest: int) -> tuple[Any, Any]:
    """The model every block is scored with, loaded once; and the vLLM engine this run started (to shut down):
    the vllm backend starts one per call on a directory, sized to that call's longest sample."""
    if opts.backend != "vllm":
        return backend.load(model_dir, opts), None
    from pdsr_sdk.scoring.vllm_backend import make_engine

    engine = make_engine(model_dir, dtype=opts.dtype, max_model_len=opts.vllm_max_model_len or longest + 1,
                         kv_cache_gib=opts.vllm_kv_cache_gib)
    return engine, engine


def _file_rows(message: str, first: int) -> str:
    """A backend's message about a block's sample i (``sample 3: ...``, ``row 3: ...``) about the file's row."""
    return re.sub(r"^(?:sample|row) (\d+):", lambda m: f"row {first + int(m.group(1))}:", message)


def _check_kept(path: Path, block: pa.Table, first: int, end: int) -> None:
    import pyarrow.parquet as pq

    kept = pq.read_table(path, columns=block.column_names)
    if not kept.equals(block):
        raise DataError(f"{path}: its rows {first}-{end - 1} differ from those rows of the input (--data) now: the "
                        f"input changed since the run was interrupted. Resume with its input, or start over with "
                        f"--overwrite")


def _merge(out: Path, source: TableBatches, config: ScoreConfig, blocks: int, meta: dict) -> None:
    """The parts, in order, into ``out`` (one block in memory at a time; atomic rename); the parts folder goes."""
    import pyarrow.parquet as pq

    from pdsr_sdk.scoring.table import score_output_schema

    extra = {parts.METADATA_KEY: json.dumps(meta).encode()}
    with atomic_path(out) as tmp:
        writer = None
        for index in range(blocks):
            table = pq.read_table(parts.part_path(out, index))
            table = table.replace_schema_metadata({**(table.schema.metadata or {}), **extra})
            writer = writer or pq.ParquetWriter(tmp, table.schema, compression="zstd")
            writer.write_table(table)
        if writer is None:   # no rows: the input's columns and the score columns
            added = [f for f in score_output_schema(config.column, config.entropy) if f.name not in source.schema.names]
            schema = pa.schema(list(source.schema) + added, metadata={**(source.schema.metadata or {}), **extra})
            writer = pq.ParquetWriter(tmp, schema, compression="zstd")
        writer.close()
    shutil.rmtree(parts.parts_dir(out), ignore_errors=True)


def _sum_stats(stats: list[ScoreStats], backend: str) -> ScoreStats:
    if not stats:
        return ScoreStats(backend=backend, mode="nothing to score", samples=0, micro_batches=0, distinct_shapes=None,
                          shapes=(), real_tokens=0, computed_tokens=0, scored_tokens=0, seconds=0.0,
                          peak_memory_bytes=None, peak_memory_method="n/a", head="n/a")
    shapes = tuple(sorted({s for st in stats for s in st.shapes}))
    peaks = [s.peak_memory_bytes for s in stats if s.peak_memory_bytes is not None]
    first = stats[0]
    return replace(first, samples=sum(s.samples for s in stats), micro_batches=sum(s.micro_batches for s in stats),
                   distinct_shapes=None if first.distinct_shapes is None else len(shapes), shapes=shapes,
                   real_tokens=sum(s.real_tokens for s in stats), computed_tokens=sum(s.computed_tokens for s in stats),
                   scored_tokens=sum(s.scored_tokens for s in stats), seconds=sum(s.seconds for s in stats),
                   peak_memory_bytes=max(peaks) if peaks else None)
