"""``per_token_logps``: log-probs of completion tokens under a model, micro-batched.

Inputs are ragged token-id sequences, or a trainer's padded ones with their
masks (``prompt_mask``, ``completion_mask``: see :mod:`~pdsr_sdk.scoring.masks`). Output: one
float32 array per sample, entry t = log p(completion[t] | prompt,
completion[:t]) with logits divided by ``temperature`` before the softmax
(as verl does). Micro-batching changes only how the forwards are grouped,
never the numbers (beyond float rounding of differently shaped matmuls).

How a call runs is a :class:`~pdsr_sdk.scoring.config.ScoreOptions`; the
model work is a :class:`~pdsr_sdk.scoring.backend.ScoringBackend`'s (see
that module for the order of its calls), this module does the rest: inputs,
row checks, input order, stats.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pdsr_sdk.errors import DataError, DataValueError, RunError
from pdsr_sdk.progress import ProgressFactory
from pdsr_sdk.scoring.backend import BackendOutput, ScoreInputs, ScoreMeter, get_backend
from pdsr_sdk.scoring.config import ScoreOptions
from pdsr_sdk.scoring.memory import format_bytes

@dataclass(frozen=True)
class ScoreStats:
    """What a scoring run did and cost."""

    backend: str
    mode: str  #: "mbs=32", "token quota 8192" or "token quota 16384 (default)"
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
    #: ``pdsr score --resume``: rows an interrupted run had scored (kept, not counted in the numbers above)
    resumed_samples: int = 0
    #: ``pdsr score``: the temperature the logits were divided by, and the one the input's rollout sampled at
    #: (recorded in its metadata; None: not a rollout's file, or greedy), which is the default
    temperature: float = 1.0
    rollout_temperature: float | None = None

    @property
    def padding_efficiency(self) -> float:
        """real tokens / computed tokens (1.0 = no padding)."""
        return self.real_tokens / self.computed_tokens if self.computed_tokens else 1.0

    @property
    def tokens_per_s(self) -> float:
        """Real (prompt + completion) tokens per second of the scoring loop; 0 where it timed nothing (no rows),
        as a rollout's summary says (not inf, which JSON has no number for)."""
        return self.real_tokens / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        unpadded = "n/a (vLLM batches unpadded)" if self.backend == "vllm" else "n/a (unpadded)"
        shapes = unpadded if self.distinct_shapes is None else str(self.distinct_shapes)
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
    #: the width R of the padded completions given with ``completion_mask`` (every mask row as wide), which
    #: :meth:`padded` defaults to; None without one
    completion_width: int | None = None

    def padded(self, width: int | None = None, *, fill: float = -1.0, entropy: bool = False) -> np.ndarray:
        """The log-probs (``entropy=True``: the entropies) as one float32 numpy ``[B, width]`` array in
        :func:`~pdsr_sdk.rollout.padded.trainer_batch`'s layout: row i is sample i's completion from column 0,
        right-padded with ``fill`` (-1, as trainer_batch's ``rollout_log_probs``). Scored with a
        ``completion_mask`` (its 1s run from column 0), those are each row's log-probs at its mask's 1s: ``width``
        defaults to the mask's R, and the array lines up with the padded completions; without one, to the longest
        completion: pass ``trainer_batch(...).tensors["responses"].shape[1]`` to line up with a batch of the
        same samples. Always numpy, whatever the inputs were (``torch.from_numpy`` makes it a tensor). A row
        longer than ``width`` is a DataValueError naming it."""
        from pdsr_sdk.io.padding import pad_rows

        rows = self.logps if not entropy else self.entropy
        if rows is None:
            raise DataValueError("ScoreResult.padded(entropy=True): no entropy was computed (pass entropy=True "
                                 "to per_token_logps)")
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        if width is None:
            width = self.completion_width if self.completion_width is not None else int(lengths.max(initial=0))
        width = int(width)
        if len(lengths) and int(lengths.max()) > width:
            i = int(np.argmax(lengths))
            raise DataValueError(f"ScoreResult.padded: sample {i} has {int(lengths[i])} tokens, over width={width}")
        values = np.concatenate(rows).astype(np.float32) if rows else np.zeros(0, np.float32)
        return pad_rows(values, offsets, width, fill=fill, dtype=np.float32)


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
        raise DataValueError(f"{name}: expected a sequence of token-id sequences, got {type(rows).__name__}")
    arrays = []
    for i, row in enumerate(rows):
        if hasattr(row, "detach") and hasattr(row, "cpu"):
            row = row.detach().cpu().numpy()
        arr = np.asarray(row)
        if arr.ndim != 1:
            raise DataValueError(f"{name}[{i}]: expected a 1-D sequence of token ids, got shape {arr.shape}")
        if arr.size and arr.dtype.kind not in "iu":
            raise DataValueError(f"{name}[{i}]: expected integer token ids, got dtype {arr.dtype}")
        arrays.append(arr.astype(np.int64, copy=False))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
    return Ragged(values.astype(np.int64, copy=False), offsets)


def validate_rows(prompts: Ragged, completions: Ragged, vocab_size: int, *, prompt_name: str = "prompt_ids",
                  completion_name: str = "completion_ids", where: str = "", first_row: int = 0) -> None:
    """DataValueError naming the row for: count mismatch, empty prompt, id outside [0, vocab). An empty completion
    is fine (a failed sample of ``pdsr rollout`` has none): it gets an empty array. ``first_row``: the number of
    row 0 in the messages (the rows are a block of a file)."""
    prefix = f"{where}: " if where else ""
    if len(prompts) != len(completions):
        raise DataValueError(f"{prefix}{prompt_name} has {len(prompts)} rows but {completion_name} has "
                             f"{len(completions)}")
    empty = np.flatnonzero(prompts.lengths == 0)
    if empty.size:
        more = f" ({empty.size} rows in all)" if empty.size > 1 else ""
        raise DataValueError(f"{prefix}row {first_row + int(empty[0])}: empty prompt: the first completion token "
                             f"needs at least one token of context ({prompt_name} has no tokens){more}")
    for rag, name in ((prompts, prompt_name), (completions, completion_name)):
        bad = np.flatnonzero((rag.values < 0) | (rag.values >= vocab_size))
        if bad.size:
            flat = int(bad[0])
            row = int(np.searchsorted(rag.offsets, flat, side="right") - 1)
            raise DataValueError(f"{prefix}row {first_row + row}: token id {int(rag.values[flat])} in {name} (position "
                            f"{flat - int(rag.offsets[row])}) is outside the model's vocabulary "
                            f"[0, {vocab_size}) (vocab size {vocab_size})")


# -------------------------------------------------------------------- core

def per_token_logps(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    options: ScoreOptions | Mapping[str, Any] | None = None,
    *,
    progress: ProgressFactory | None = None,
    names: tuple[str, str] = ("prompt_ids", "completion_ids"),
    source: str = "",
    prompt_mask: Any = None,
    completion_mask: Any = None,
    **option_keywords: Any,
) -> ScoreResult:
    """Per-token log-probs of ``completion_ids[i]`` given ``prompt_ids[i]``, micro-batched.

    Args:
        model: what the backend scores with. torch: a loaded Hugging Face
            causal LM (scored in eval mode, no dropout; its modules' modes are
            put back after); vllm: a ``vllm.LLM``. Either: a local model directory
            (str or Path, with config.json), loaded per ``options.device`` /
            ``options.dtype`` (vllm starts an engine and shuts it down).
        prompt_ids, completion_ids: token ids, one sequence per sample (lists,
            numpy arrays or tensors, or a [B, P] / [B, R] array or tensor), taken
            as they are: padding would be scored as tokens, unless masked. A
            prompt needs at least one token; an empty completion gets an empty array.
        prompt_mask, completion_mask: a trainer's padding masks, the shape of
            the ids (tensors, numpy arrays or lists of rows; 1 or True: a real
            token, 0: padding), as verl's ``attention_mask[:, :P]`` and
            ``attention_mask[:, P:]`` or TRL's ``prompt_mask`` and
            ``completion_mask``. Each row is scored on its real tokens only,
            which must be one run: at the end of a prompt (left padding), from
            column 0 of a completion (right padding). With ``completion_mask``,
            ``ScoreResult.padded()`` puts the log-probs back in the [B, R] layout.
        options: a :class:`ScoreOptions` (or a mapping of its keys; None =
            the defaults): backend, micro-batching (``mbs`` or
            ``max_tokens_per_micro_batch``, neither = a quota of 16,384
            raised to the longest row),
            ``temperature``, ``entropy`` and the rest; see its fields.
        progress: progress factory (see :mod:`pdsr_sdk.progress`); one step per micro-batch.
        names, source: the inputs' names and origin (a file), used in error messages.
        **option_keywords: option keys as keywords, applied over ``options``
            (``per_token_logps(model, p, c, mbs=8, backend="vllm")``);
            ``return_entropy`` is accepted for ``entropy``.

    Returns:
        :class:`ScoreResult` with ``logps`` (float32 arrays in input order),
        ``entropy`` (or None) and ``stats``.

    Raises:
        DataValueError (a DataError and a ValueError): mismatched row counts, an empty prompt, a token
            id outside the vocabulary (each names the row), a model directory
            without config.json (a DataError), a sample longer than the token quota;
            a mask whose shape or row length is not its ids', a value other than
            0/1, a row not padded on its side, a prompt row with no real token
            (each names the mask and the row).
        ConfigValueError (a ConfigError and a ValueError): an unknown or invalid option (the message names the key),
            both ``mbs`` and ``max_tokens_per_micro_batch``, an option the
            backend cannot honour.
    """
    opts = ScoreOptions.resolve(options, option_keywords)
    backend = get_backend(opts.backend)
    backend.check(opts)
    from pdsr_sdk.scoring.masks import unpad   # each row's real tokens, where masks say which

    prompts = as_ragged(prompt_ids, names[0]) if prompt_mask is None else \
        unpad(prompt_ids, prompt_mask, names[0], "prompt_mask", "left")[0]
    completions, width = (as_ragged(completion_ids, names[1]), None) if completion_mask is None else \
        unpad(completion_ids, completion_mask, names[1], "completion_mask", "right")
    check = dict(prompt_name=names[0], completion_name=names[1], where=source)
    model_dir = None
    if isinstance(model, (str, Path)):
        from pdsr_sdk.scoring.checkpoint import check_model_dir

        model_dir = check_model_dir(model)
        validate_rows(prompts, completions, _config_vocab_size(model_dir), **check)  # before loading anything
        check_context(prompts.lengths + completions.lengths, _context(model_dir), source)
        model = backend.load(model_dir, opts)
    vocab = backend.vocab_size(model)
    if vocab is not None:
        validate_rows(prompts, completions, int(vocab), **check)
    if model_dir is None:
        check_context(prompts.lengths + completions.lengths, _context(model), source)

    meter = ScoreMeter(prompts.lengths + completions.lengths, progress)
    result = score_checked(backend, model, prompts, completions, opts, meter, source)
    result.completion_width = width
    return result


def score_checked(backend: Any, model: Any, prompts: Ragged, completions: Ragged, opts: ScoreOptions,
                  meter: ScoreMeter, source: str = "") -> ScoreResult:
    """Score rows already checked (:func:`validate_rows`) with a loaded ``model``: the backend's work, its output
    checked and put back in input order, and the stats. ``meter``'s lengths are prompt + completion lengths."""
    lengths = prompts.lengths + completions.lengths
    seqs = [np.concatenate([prompts.row(i), completions.row(i)]) for i in range(len(prompts))]
    inputs = ScoreInputs(seqs=seqs, prompt_lens=prompts.lengths, lengths=lengths, source=source)
    try:
        out = backend.score(model, inputs, opts, meter)
    except DataValueError as exc:
        # a backend's sample errors (too long for the token quota) name the sample; name the file too
        if source and not str(exc).startswith(f"{source}:"):
            raise DataValueError(f"{source}: {exc}") from None
        raise
    check_backend_output(out, completions.lengths, opts)

    logps = restore_order_lists(out.logps, out.partitions)
    entropy = restore_order_lists(out.entropy, out.partitions) if out.entropy is not None else None
    stats = ScoreStats(
        backend=opts.backend, mode=out.mode, samples=len(seqs), micro_batches=len(out.partitions),
        distinct_shapes=out.distinct_shapes, shapes=tuple(out.shapes), real_tokens=int(lengths.sum()),
        computed_tokens=int(out.computed_tokens), scored_tokens=int(completions.lengths.sum()),
        seconds=meter.seconds, peak_memory_bytes=out.peak_memory_bytes,
        peak_memory_method=out.peak_memory_method, head=out.head)
    return ScoreResult(logps=logps, entropy=entropy, stats=stats)


def check_backend_output(out: Any, completion_lengths: np.ndarray, opts: ScoreOptions) -> None:
    """A RunError naming the backend unless its :class:`~pdsr_sdk.scoring.backend.BackendOutput` puts every sample in
    exactly one partition with one log-prob (and entropy, when asked for) per completion token: a backend of one's
    own that got this wrong wrote misaligned columns, or failed inside Arrow."""
    def bad(what: str) -> RunError:
        return RunError(f"scoring backend {opts.backend!r} returned {what}; see "
                        f"pdsr_sdk.scoring.backend.BackendOutput")

    if not isinstance(out, BackendOutput):
        raise bad(f"a {type(out).__name__}, not a BackendOutput")
    placed = sorted(int(i) for part in out.partitions for i in part)
    if placed != list(range(len(completion_lengths))):
        missing = sorted(set(range(len(completion_lengths))) - set(placed))
        twice = sorted(i for i, c in Counter(placed).items() if c > 1)
        raise bad(f"partitions that do not hold each of the {len(completion_lengths)} samples exactly once "
                  f"(missing: {missing[:8]}, more than once: {twice[:8]})")
    columns = [("logps", out.logps)] + ([("entropy", out.entropy)] if opts.entropy or out.entropy is not None else [])
    for name, per_part in columns:
        if per_part is None or len(per_part) != len(out.partitions):
            raise bad(f"{name} for {0 if per_part is None else len(per_part)} partitions, not {len(out.partitions)}")
        for k, (part, values) in enumerate(zip(out.partitions, per_part)):
            if len(values) != len(part):
                raise bad(f"{name} for {len(values)} samples in partition {k} of {len(part)}")
            for i, row in zip(part, values):
                if len(row) != completion_lengths[i]:
                    raise bad(f"{len(row)} {name} values for sample {i} (row {i}), which has "
                              f"{int(completion_lengths[i])} completion tokens")


def restore_order_lists(per_micro_batch: list[list[np.ndarray]], partitions: list[list[int]]) -> list[np.ndarray]:
    from pdsr_sdk.batching import restore_order

    if not partitions:
        return []
    return restore_order(per_micro_batch, partitions)


def _context(model: Any) -> tuple[int | None, str]:
    """The model's context (a model directory's config.json, or a loaded model's ``config``), as
    :func:`~pdsr_sdk.models.context.model_context` reads it; (None, "") where neither says."""
    from pdsr_sdk.models.context import config_context, model_context

    if isinstance(model, Path):
        return model_context(model)
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    return config_context(to_dict(), f"{type(model).__name__}.config") if callable(to_dict) else (None, "")


def check_context(lengths: np.ndarray, limit: tuple[int | None, str], source: str = "") -> None:
    """A DataValueError naming the first row whose prompt + completion is over the model's context ``limit``
    (a number and where it comes from): its positions were never trained, and its log-probs would mean nothing."""
    tokens, where = limit
    too_long = np.flatnonzero(lengths > tokens) if tokens is not None else ()
    if len(too_long):
        i = int(too_long[0])
        raise DataValueError(f"{source + ': ' if source else ''}row {i}: prompt + completion = {int(lengths[i])} "
                             f"tokens, over the model's context of {tokens} tokens ({where}) ({len(too_long)} "
                             f"row(s) in all)")


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
