"""``per_token_logps``: log-probs of completion tokens under a model, micro-batched.

Inputs are ragged token-id sequences (no caller-side padding). Output: one
float32 array per sample, entry t = log p(completion[t] | prompt,
completion[:t]) with logits divided by ``temperature`` before the softmax
(as verl does). Micro-batching changes only how the forwards are grouped,
never the numbers (beyond float rounding of differently shaped matmuls).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np

from pdsr_sdk.errors import ConfigError, DataError
from pdsr_sdk.progress import ProgressFactory, silent_progress
from pdsr_sdk.scoring.buckets import (
    MicroBatch,
    plan_fixed,
    plan_single,
    plan_stats,
    plan_token_quota,
    request_blocks,
)
from pdsr_sdk.scoring.config import DEFAULT_LENGTH_BUCKET, DEFAULT_ROW_CHUNK
from pdsr_sdk.scoring.memory import PeakMemory, format_bytes

BACKENDS = ("torch", "vllm")


@dataclass(frozen=True)
class ScoreStats:
    """What a scoring run did and cost."""

    backend: str
    mode: str  #: "single forward", "mbs=32" or "token quota 8192"
    samples: int
    micro_batches: int
    #: distinct (rows, seq_len) forward shapes; None for vLLM (it batches unpadded tokens itself)
    distinct_shapes: int | None
    shapes: tuple[tuple[int, int], ...]  #: the distinct shapes, sorted
    real_tokens: int  #: prompt + completion tokens of all samples
    computed_tokens: int  #: rows x seq_len summed over forwards, padding and dummy rows included
    scored_tokens: int  #: completion tokens (the ones that get a log-prob)
    seconds: float  #: wall time of the scoring loop (model loading excluded)
    peak_memory_bytes: int | None
    peak_memory_method: str
    head: str  #: how logits were formed ("chunked lm_head", or the full-logits fallback and why)

    @property
    def padding_efficiency(self) -> float:
        """real tokens / computed tokens (1.0 = no padding)."""
        return self.real_tokens / self.computed_tokens if self.computed_tokens else 1.0

    @property
    def tokens_per_s(self) -> float:
        """Real (prompt + completion) tokens per second of the scoring loop."""
        return self.real_tokens / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        shapes = "n/a (vLLM batches unpadded)" if self.distinct_shapes is None else str(self.distinct_shapes)
        return (f"{self.tokens_per_s:,.0f} tokens/s ({self.real_tokens:,} tokens, {self.scored_tokens:,} scored, "
                f"{self.seconds:.2f} s); peak memory {format_bytes(self.peak_memory_bytes)} "
                f"[{self.peak_memory_method}]; {self.micro_batches} micro-batches ({self.mode}); "
                f"distinct shapes {shapes}; padding efficiency {self.padding_efficiency:.3f}")

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["shapes"] = [list(s) for s in self.shapes]
        d["padding_efficiency"] = self.padding_efficiency
        d["tokens_per_s"] = self.tokens_per_s
        return d


@dataclass
class ScoreResult:
    """Per-sample float32 arrays in input order, plus run statistics."""

    logps: list[np.ndarray]
    entropy: list[np.ndarray] | None
    stats: ScoreStats = field(repr=False)


# ------------------------------------------------------------------ inputs

@dataclass
class Ragged:
    """Flat int64 ids and offsets: row i is ``values[offsets[i]:offsets[i+1]]``."""

    values: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]: self.offsets[i + 1]]


def as_ragged(rows: Any, name: str) -> Ragged:
    """A sequence of token-id sequences (lists, numpy arrays, tensors) -> :class:`Ragged`."""
    if isinstance(rows, Ragged):
        return rows
    if isinstance(rows, (str, bytes)) or not hasattr(rows, "__len__"):
        raise DataError(f"{name}: expected a sequence of token-id sequences, got {type(rows).__name__}")
    arrays = []
    for i, row in enumerate(rows):
        if hasattr(row, "detach") and hasattr(row, "cpu"):
            row = row.detach().cpu().numpy()
        arr = np.asarray(row)
        if arr.ndim != 1:
            raise DataError(f"{name}[{i}]: expected a 1-D sequence of token ids, got shape {arr.shape}")
        if arr.size and arr.dtype.kind not in "iu":
            raise DataError(f"{name}[{i}]: expected integer token ids, got dtype {arr.dtype}")
        arrays.append(arr.astype(np.int64, copy=False))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
    return Ragged(values.astype(np.int64, copy=False), offsets)


def validate_rows(prompts: Ragged, completions: Ragged, vocab_size: int, *, prompt_name: str = "prompt_ids",
                  completion_name: str = "completion_ids", where: str = "") -> None:
    """DataError naming the row for: count mismatch, empty prompt/completion, id outside [0, vocab)."""
    prefix = f"{where}: " if where else ""
    if len(prompts) != len(completions):
        raise DataError(f"{prefix}{prompt_name} has {len(prompts)} rows but {completion_name} has {len(completions)}")
    for rag, name, what in ((completions, completion_name, "completion: nothing to score"),
                            (prompts, prompt_name, "prompt: the first completion token needs at least one "
                                                   "token of context")):
        empty = np.flatnonzero(rag.lengths == 0)
        if empty.size:
            more = f" ({empty.size} rows in all)" if empty.size > 1 else ""
            raise DataError(f"{prefix}row {int(empty[0])}: empty {what} ({name} has no tokens){more}")
    for rag, name in ((prompts, prompt_name), (completions, completion_name)):
        bad = np.flatnonzero((rag.values < 0) | (rag.values >= vocab_size))
        if bad.size:
            flat = int(bad[0])
            row = int(np.searchsorted(rag.offsets, flat, side="right") - 1)
            raise DataError(f"{prefix}row {row}: token id {int(rag.values[flat])} in {name} (position "
                            f"{flat - int(rag.offsets[row])}) is outside the model's vocabulary "
                            f"[0, {vocab_size}) (vocab size {vocab_size})")


# -------------------------------------------------------------------- core

def per_token_logps(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    mbs: int | None = None,
    max_tokens_per_micro_batch: int | None = None,
    pad_id: int | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
    length_bucket: int = DEFAULT_LENGTH_BUCKET,
    row_chunk: int = DEFAULT_ROW_CHUNK,
    progress: ProgressFactory | None = None,
    backend: str = "torch",
    token_grouping: str = "length",
    max_padding_fraction: float = 0.03,
    attention_mask: bool = True,
    device: str = "auto",
    dtype: str = "auto",
    vllm_max_model_len: int | None = None,
    vllm_kv_cache_gib: float = 1.0,
    names: tuple[str, str] = ("prompt_ids", "completion_ids"),
    source: str = "",
) -> ScoreResult:
    """Per-token log-probs of ``completion_ids[i]`` given ``prompt_ids[i]``, micro-batched.

    Args:
        model: torch backend: a loaded Hugging Face causal LM, or a local model
            directory (loaded with ``device``/``dtype``). vllm backend: a
            ``vllm.LLM`` or a model directory (an engine is started and shut down).
        prompt_ids, completion_ids: ragged token ids, one sequence per sample
            (lists, numpy arrays or tensors); no padding.
        mbs: fixed micro-batch size; the tail block is padded with dummy rows
            to ``mbs`` (one shape per length bucket).
        max_tokens_per_micro_batch: token quota per micro-batch (padded tokens
            with ``token_grouping="length"``, real tokens with ``"none"``);
            exclusive with ``mbs``. Neither: one forward over everything.
        pad_id: padding token (never changes results); default the model's
            ``pad_token_id``, else 0.
        temperature: logits are divided by it before the softmax.
        return_entropy: also compute each position's entropy (torch backend).
        length_bucket: forward sequence lengths are multiples of this.
        row_chunk: completion positions per fp32 lm_head/log-softmax chunk.
        progress: progress factory (see :mod:`pdsr_sdk.progress`); one step per micro-batch.
        backend: ``"torch"`` or ``"vllm"``.
        token_grouping, max_padding_fraction: token-quota grouping (see
            :mod:`pdsr_sdk.scoring.buckets`).
        attention_mask: pass the padding mask to the model (False is exact for
            causal LMs with right padding, and faster: no [rows, 1, T, T] mask).
        device, dtype: where and how to load ``model`` when it is a directory.
        vllm_max_model_len, vllm_kv_cache_gib: engine settings when the vllm
            backend starts its own engine.
        names, source: the inputs' names and origin (a file), used in error messages.

    Returns:
        :class:`ScoreResult` with ``logps`` (float32 arrays in input order),
        ``entropy`` (or None) and ``stats``.

    Raises:
        DataError: mismatched row counts, an empty prompt or completion, a token
            id outside the vocabulary (each names the row), a model directory
            without config.json, a sample longer than the token quota.
        ConfigError: both ``mbs`` and ``max_tokens_per_micro_batch``, bad options.
    """
    _check_options(backend, mbs, max_tokens_per_micro_batch, length_bucket, row_chunk, temperature,
                   return_entropy)
    prompts = as_ragged(prompt_ids, names[0])
    completions = as_ragged(completion_ids, names[1])
    check = dict(prompt_name=names[0], completion_name=names[1], where=source)
    if isinstance(model, (str, Path)):
        from pdsr_sdk.scoring.torch_backend import check_model_dir

        check_model_dir(model)
        validate_rows(prompts, completions, _config_vocab_size(model), **check)  # before loading anything
        if backend == "torch":
            from pdsr_sdk.scoring.torch_backend import load_model

            model = load_model(model, device, dtype)
    if backend == "torch":
        from pdsr_sdk.scoring.torch_backend import model_vocab_size

        validate_rows(prompts, completions, model_vocab_size(model), **check)
    elif not isinstance(model, (str, Path)):
        from pdsr_sdk.scoring.vllm_backend import engine_vocab_size

        validate_rows(prompts, completions, engine_vocab_size(model), **check)

    lengths = prompts.lengths + completions.lengths
    seqs = [np.concatenate([prompts.row(i), completions.row(i)]) for i in range(len(prompts))]
    run = _Run(lengths, progress)
    if backend == "torch":
        plan, mode = _plan(lengths, mbs, max_tokens_per_micro_batch, length_bucket, token_grouping,
                           max_padding_fraction)
        partitions = [list(mb.indices) for mb in plan]
        per_mb_logps, per_mb_entropy, head, mem = _run_torch(
            model, plan, seqs, prompts.lengths, run, pad_id=pad_id, temperature=temperature, row_chunk=row_chunk,
            return_entropy=return_entropy, attention_mask=attention_mask)
        stats_plan = plan_stats(plan)
        shapes = tuple(sorted({mb.shape for mb in plan}))
        distinct: int | None = stats_plan["distinct_shapes"]
        computed = stats_plan["computed_tokens"]
    else:
        # vLLM batches unpadded tokens itself: blocks of consecutive requests, no partitioner
        # (which also keeps numba out of this process, see vllm_backend.make_engine)
        partitions = request_blocks(lengths, mbs=mbs, max_tokens=max_tokens_per_micro_batch)
        mode = (f"mbs={mbs}" if mbs is not None else f"token quota {max_tokens_per_micro_batch}"
                if max_tokens_per_micro_batch is not None else "single block")
        per_mb_logps = _run_vllm(model, partitions, seqs, prompts.lengths, run, dtype=dtype,
                                 max_model_len=vllm_max_model_len, kv_cache_gib=vllm_kv_cache_gib, source=source)
        per_mb_entropy = None
        head = "vLLM prompt logprobs (fp32 log_softmax of the engine's logits)"
        # vLLM's memory is its engine's (KV cache sized up front by VLLM_CPU_KVCACHE_SPACE or
        # gpu_memory_utilization, often in another process): this process's RSS would say nothing
        mem = SimpleNamespace(bytes=None, method="n/a for vLLM (its KV cache is sized up front)")
        distinct, shapes, computed = None, (), int(lengths.sum())

    logps = restore_order_lists(per_mb_logps, partitions)
    entropy = restore_order_lists(per_mb_entropy, partitions) if per_mb_entropy is not None else None
    stats = ScoreStats(
        backend=backend, mode=mode, samples=len(seqs), micro_batches=len(partitions), distinct_shapes=distinct,
        shapes=shapes, real_tokens=int(lengths.sum()), computed_tokens=computed,
        scored_tokens=int(completions.lengths.sum()), seconds=run.seconds, peak_memory_bytes=mem.bytes,
        peak_memory_method=mem.method, head=head)
    return ScoreResult(logps=logps, entropy=entropy, stats=stats)


def _check_options(backend, mbs, max_tokens, length_bucket, row_chunk, temperature, return_entropy) -> None:
    if backend not in BACKENDS:
        raise ConfigError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if mbs is not None and max_tokens is not None:
        raise ConfigError(f"mbs ({mbs}) and max_tokens_per_micro_batch ({max_tokens}) are exclusive: "
                          f"give a fixed micro-batch size or a token quota, not both")
    for key, value in (("mbs", mbs), ("max_tokens_per_micro_batch", max_tokens), ("length_bucket", length_bucket),
                       ("row_chunk", row_chunk)):
        if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{key}: expected an integer >= 1, got {value!r}")
    if not temperature > 0:
        raise ConfigError(f"temperature: expected > 0, got {temperature!r}")
    if backend == "vllm":
        from pdsr_sdk.scoring.vllm_backend import check_options

        check_options(temperature=temperature, return_entropy=return_entropy)


class _Run:
    """Wall time of the scoring loop and the progress bar (one step per micro-batch)."""

    def __init__(self, lengths: np.ndarray, progress: ProgressFactory | None):
        self.lengths = lengths
        self.progress = progress or silent_progress
        self.tokens = 0
        self.t0 = 0.0
        self.seconds = 0.0
        self.bar = None

    def start(self, total: int) -> None:
        self.bar = self.progress("score", total=total, unit="mb")
        self.t0 = time.perf_counter()

    def advance(self, indices: Sequence[int]) -> None:
        self.tokens += int(self.lengths[list(indices)].sum())
        self.bar.update(1)
        elapsed = time.perf_counter() - self.t0
        if elapsed > 0:
            self.bar.set_postfix_str(f"{self.tokens / elapsed:,.0f} tok/s")

    def stop(self) -> None:
        self.seconds = time.perf_counter() - self.t0
        if self.bar is not None:
            self.bar.close()


def _run_torch(model, plan, seqs, prompt_lens, run: _Run, *, pad_id, temperature, row_chunk, return_entropy,
               attention_mask):
    from pdsr_sdk.scoring.torch_backend import model_device, model_vocab_size, run_plan

    vocab = model_vocab_size(model)
    if pad_id is None:
        pad_id = getattr(getattr(model, "config", None), "pad_token_id", None) or 0
        pad_id = pad_id if 0 <= pad_id < vocab else 0
    elif not 0 <= int(pad_id) < vocab:
        raise ConfigError(f"pad_id: {pad_id} is not a token id of the model (vocab size {vocab}); "
                          f"any id in [0, {vocab}) works, it never changes results")
    with PeakMemory(str(model_device(model))) as mem:
        run.start(len(plan))
        try:
            per_mb_logps, per_mb_entropy, head = run_plan(
                model, plan, seqs, prompt_lens, pad_id=int(pad_id), temperature=float(temperature),
                row_chunk=int(row_chunk), return_entropy=return_entropy, attention_mask=attention_mask,
                on_micro_batch=lambda mb: run.advance(mb.indices))
        finally:
            run.stop()
    return per_mb_logps, per_mb_entropy, head, mem


def _run_vllm(model, partitions, seqs, prompt_lens, run: _Run, *, dtype, max_model_len, kv_cache_gib, source):
    from pdsr_sdk.scoring import vllm_backend as vb

    if not partitions:
        return []
    lengths = run.lengths
    owned = None
    try:
        if isinstance(model, (str, Path)):
            max_len = max_model_len or int(lengths.max()) + 1
            owned = model = vb.make_engine(model, dtype=dtype, max_model_len=max_len, kv_cache_gib=kv_cache_gib)
        limit = vb.engine_max_model_len(model)
        too_long = np.flatnonzero(lengths + 1 > limit)
        if too_long.size:
            i = int(too_long[0])
            raise DataError(f"{source + ': ' if source else ''}row {i}: prompt + completion = {int(lengths[i])} "
                            f"tokens does not fit the vLLM engine's max_model_len={limit} (needs length + 1)")
        run.start(len(partitions))
        try:
            return vb.score_blocks(model, partitions, seqs, prompt_lens, on_block=run.advance)
        finally:
            run.stop()
    finally:
        if owned is not None:
            vb.shutdown_engine(owned)


def restore_order_lists(per_micro_batch: list[list[np.ndarray]], partitions: list[list[int]]) -> list[np.ndarray]:
    from pdsr_sdk.batching import restore_order

    if not partitions:
        return []
    return restore_order(per_micro_batch, partitions)


def _plan(lengths: np.ndarray, mbs, max_tokens, length_bucket, grouping, max_padding_fraction
          ) -> tuple[list[MicroBatch], str]:
    if len(lengths) == 0:
        return [], "empty"
    if mbs is not None:
        return plan_fixed(lengths, int(mbs), length_bucket=int(length_bucket)), f"mbs={mbs}"
    if max_tokens is not None:
        plan, _ = plan_token_quota(lengths, int(max_tokens), length_bucket=int(length_bucket), grouping=grouping,
                                   max_padding_fraction=max_padding_fraction)
        return plan, f"token quota {max_tokens}" + ("" if grouping == "length" else f", grouping={grouping}")
    return plan_single(lengths, length_bucket=int(length_bucket)), "single forward"


def _config_vocab_size(model_dir: str | Path) -> int:
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: cannot read the model config: {exc}") from None
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(vocab, int):
        raise DataError(f"{path}: no integer 'vocab_size' in the model config")
    return vocab
