"""The torch + transformers scoring backend (``backend="torch"``, :class:`TorchScoring`).

Each micro-batch is one right-padded forward of the model's decoder (the
base model without its lm_head) with position ids 0..T-1, so every real
token sees exactly what it would see unpadded. Only the hidden states at
completion positions (position t predicts token t+1) go through the lm_head,
in row chunks, with an fp32 log-softmax (``logprob_kernel``).

Finding the head: ``get_output_embeddings()`` (tied embeddings share the
weight, so this is the same call) and ``get_decoder()`` / ``.model``. The
split is checked once per call against the model's own logits on a few
tokens; if no head/decoder is found, or the check fails (models that post-
process logits: soft-capping, logit scales), the backend falls back to the
model's full logits ([rows, T, vocab] in the model dtype, upcast per chunk)
and says so in the stats (``head``).

Packed micro-batches (``ScoreOptions.pack``): each micro-batch is one row of
the concatenated samples with position ids restarting at 0 for every
sample and no attention mask. transformers (>= 4.53; 5.x here) reads
sample boundaries from such position ids (``find_packed_sequence_indices``)
and builds attention that never crosses them for every implementation: a
block-causal mask for sdpa/eager, a document BlockMask for flex_attention,
varlen (cu_seqlens) for flash_attention_2/3. No token is padding. Each call
checks this once on a probe (two copies of a short sequence packed together
must give the same logits as one); a model that ignores packed position ids
raises ConfigError instead of silently attending across samples.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from pdsr_sdk.errors import ConfigValueError, DataError
from pdsr_sdk.scoring.backend import BackendOutput, ScoreInputs, ScoreMeter
from pdsr_sdk.scoring.buckets import MicroBatch
from pdsr_sdk.scoring.checkpoint import DTYPES as _DTYPES, check_model_dir

if TYPE_CHECKING:
    from pdsr_sdk.scoring.config import ScoreOptions



def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigValueError(f"device: {device!r} requested but torch sees no CUDA device (use 'cpu' or 'auto')")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ConfigValueError(f"device: expected 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    return device


@contextlib.contextmanager
def _quiet_transformers():
    """transformers draws a weight-loading bar on stderr; the SDK never prints."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def load_model(model_dir: str | Path, device: str = "auto", dtype: str = "auto"):
    """Load a local Hugging Face causal LM for scoring (eval mode, on ``device``)."""
    import torch

    path = check_model_dir(model_dir)
    if dtype not in _DTYPES:
        raise ConfigValueError(f"dtype: expected one of {', '.join(_DTYPES)}, got {dtype!r}")
    device = resolve_device(device)
    from transformers import AutoModelForCausalLM

    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    try:
        with _quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types
        raise DataError(f"{path}: cannot load a causal LM from this directory: {exc}") from None
    return model.to(device).eval()


def model_vocab_size(model) -> int:
    """Rows of the input embedding (ids must index it) and of the output head, whichever is smaller."""
    sizes = []
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if emb is not None and hasattr(emb, "weight"):
        sizes.append(int(emb.weight.shape[0]))
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and hasattr(head, "weight"):
        sizes.append(int(head.weight.shape[0]))
    if not sizes:
        sizes.append(int(model.config.vocab_size))
    return min(sizes)


def model_device(model) -> Any:
    return next(model.parameters()).device


@dataclass
class Parts:
    """How hidden states become logits: ``decoder`` + ``head`` (chunked), or the whole model (full logits)."""

    decoder: Any
    head: Any
    description: str

    @property
    def chunked(self) -> bool:
        return self.head is not None


def find_parts(model, probe_ids: np.ndarray) -> Parts:
    """Split ``model`` into decoder and lm_head, verified on ``probe_ids`` (a short real sequence)."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    decoder = None
    if hasattr(model, "get_decoder"):
        try:
            decoder = model.get_decoder()
        except Exception:  # noqa: BLE001 - some models raise instead of returning None
            decoder = None
    if decoder is None:
        decoder = getattr(model, "model", None)
    if head is None or decoder is None or decoder is model:
        return Parts(None, None, "full logits (no separate decoder and lm_head found)")
    ids = torch.as_tensor(probe_ids[None, :], device=model_device(model))
    with torch.inference_mode():
        expected = model(input_ids=ids, use_cache=False).logits
        got = head(_last_hidden(decoder(input_ids=ids, use_cache=False, return_dict=True)))
    if got.shape != expected.shape:
        return Parts(None, None, f"full logits (lm_head gives shape {tuple(got.shape)}, model {tuple(expected.shape)})")
    eps = torch.finfo(expected.dtype).eps
    scale = float(expected.float().abs().max()) + 1.0
    err = float((got.float() - expected.float()).abs().max())
    if not err <= 16 * eps * scale:
        return Parts(None, None, f"full logits (decoder + lm_head differ from the model's logits by {err:.3g}: "
                                 f"the model post-processes its logits)")
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    return Parts(decoder, head, "chunked lm_head" + (" (tied embeddings)" if tied else ""))


def _last_hidden(out) -> Any:
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def build_batch(mb: MicroBatch, seqs: Sequence[np.ndarray], pad_id: int):
    """Right-padded ids [rows, T] and mask; dummy rows are one pad token (kept attendable: no all-masked rows)."""
    ids = np.full((mb.rows, mb.seq_len), pad_id, dtype=np.int64)
    mask = np.zeros((mb.rows, mb.seq_len), dtype=np.int64)
    for r, i in enumerate(mb.indices):
        seq = seqs[i]
        ids[r, : len(seq)] = seq
        mask[r, : len(seq)] = 1
    mask[len(mb.indices):, 0] = 1
    return ids, mask


def score_micro_batch(model, parts: Parts, mb: MicroBatch, seqs: Sequence[np.ndarray], prompt_lens: np.ndarray,
                      *, pad_id: int, temperature: float, row_chunk: int, return_entropy: bool,
                      attention_mask: bool) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Log-probs (and entropies) of the completion tokens of ``mb``'s samples, in ``mb.indices`` order."""
    import torch

    from pdsr_sdk.scoring.logprob_kernel import chunked_token_logps

    device = model_device(model)
    ids_np, mask_np = build_batch(mb, seqs, pad_id)
    # completion token t of sample i sits at position p_i + t; position p_i + t - 1 predicts it
    row_parts, pos_parts, sizes = [], [], []
    for r, i in enumerate(mb.indices):
        p, total = int(prompt_lens[i]), len(seqs[i])
        row_parts.append(np.full(total - p, r, dtype=np.int64))
        pos_parts.append(np.arange(p - 1, total - 1, dtype=np.int64))
        sizes.append(total - p)
    rows = np.concatenate(row_parts)
    pos = np.concatenate(pos_parts)
    targets = torch.as_tensor(ids_np[rows, pos + 1], device=device)
    rows_t = torch.as_tensor(rows, device=device)
    pos_t = torch.as_tensor(pos, device=device)

    ids = torch.as_tensor(ids_np, device=device)
    position_ids = torch.arange(mb.seq_len, device=device).expand(mb.rows, -1)
    kwargs = dict(input_ids=ids, position_ids=position_ids, use_cache=False)
    if attention_mask:
        kwargs["attention_mask"] = torch.as_tensor(mask_np, device=device)
    with torch.inference_mode():
        if parts.chunked:
            hidden = _last_hidden(parts.decoder(**kwargs, return_dict=True))
            selected = hidden[rows_t, pos_t]
            del hidden
            logps, entropy = chunked_token_logps(selected, targets, parts.head, temperature=temperature,
                                                 row_chunk=row_chunk, return_entropy=return_entropy)
        else:
            logits = model(**kwargs).logits
            selected = logits[rows_t, pos_t]
            del logits
            logps, entropy = chunked_token_logps(selected, targets, None, temperature=temperature,
                                                 row_chunk=row_chunk, return_entropy=return_entropy)
    splits = np.cumsum(sizes)[:-1]
    out_logps = np.split(logps.cpu().numpy(), splits)
    out_entropy = np.split(entropy.cpu().numpy(), splits) if entropy is not None else None
    return out_logps, out_entropy


def packed_inputs(mb: MicroBatch, seqs: Sequence[np.ndarray], prompt_lens: np.ndarray):
    """One packed row: ids [1, N], position ids [1, N] (0.. per sample), the predicting positions of the
    completion tokens (in ``mb.indices`` order) and the completion sizes."""
    ids = np.concatenate([seqs[i] for i in mb.indices])[None, :]
    position_ids = np.concatenate([np.arange(len(seqs[i]), dtype=np.int64) for i in mb.indices])[None, :]
    pos_parts, sizes, offset = [], [], 0
    for i in mb.indices:
        p, total = int(prompt_lens[i]), len(seqs[i])
        pos_parts.append(np.arange(offset + p - 1, offset + total - 1, dtype=np.int64))
        sizes.append(total - p)
        offset += total
    return ids, position_ids, np.concatenate(pos_parts), sizes


def score_packed_micro_batch(model, parts: Parts, mb: MicroBatch, seqs: Sequence[np.ndarray],
                             prompt_lens: np.ndarray, *, temperature: float, row_chunk: int,
                             return_entropy: bool) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Like :func:`score_micro_batch`, for a packed micro-batch (one row, no padding, no attention mask)."""
    import torch

    from pdsr_sdk.scoring.logprob_kernel import chunked_token_logps

    device = model_device(model)
    ids_np, pos_ids_np, pos, sizes = packed_inputs(mb, seqs, prompt_lens)
    targets = torch.as_tensor(ids_np[0, pos + 1], device=device)
    pos_t = torch.as_tensor(pos, device=device)
    kwargs = dict(input_ids=torch.as_tensor(ids_np, device=device),
                  position_ids=torch.as_tensor(pos_ids_np, device=device), use_cache=False)
    with torch.inference_mode():
        if parts.chunked:
            selected = _last_hidden(parts.decoder(**kwargs, return_dict=True))[0, pos_t]
        else:
            selected = model(**kwargs).logits[0, pos_t]
        logps, entropy = chunked_token_logps(selected, targets, parts.head, temperature=temperature,
                                             row_chunk=row_chunk, return_entropy=return_entropy)
    splits = np.cumsum(sizes)[:-1]
    out_logps = np.split(logps.cpu().numpy(), splits)
    out_entropy = np.split(entropy.cpu().numpy(), splits) if entropy is not None else None
    return out_logps, out_entropy


def check_packing(model, probe_ids: np.ndarray) -> None:
    """ConfigError unless two copies of ``probe_ids`` packed in one row (position ids restarting at 0)
    give the logits of one copy: i.e. the model keeps attention inside each packed sample."""
    import torch

    k = len(probe_ids)
    if k < 2:
        probe_ids = np.concatenate([probe_ids, probe_ids])   # attention across the boundary must show
        k = len(probe_ids)
    device = model_device(model)
    ids = torch.as_tensor(np.concatenate([probe_ids, probe_ids])[None, :], device=device)
    pos = torch.arange(k, device=device).repeat(2)[None, :]
    with torch.inference_mode():
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits.float()[0]
    eps = torch.finfo(model.dtype if hasattr(model, "dtype") else torch.float32).eps
    scale = float(logits.abs().max()) + 1.0
    err = float((logits[:k] - logits[k:]).abs().max())
    if not err <= 64 * eps * scale:
        impl = getattr(getattr(model, "config", None), "_attn_implementation", "?")
        raise ConfigValueError(f"pack: this model (attention implementation {impl!r}) does not keep attention inside "
                          f"packed samples (a packed copy of a probe differs by {err:.3g}); use pack=False")


#: The rule behind ``pack=None``: (backend, device type) -> packed forwards were measured faster there.
#: CPU (fp32, tiny Qwen2, bench/score.py --samples 128, 2 cores): packed 0.26x the tokens/s of the padded
#: token quota at 8192 tokens (sdpa computes the whole N x N block-diagonal mask there; docs/benchmarks.md).
#: CUDA (H100, bf16 Qwen2.5-0.5B shape, 564k tokens, bench/gpu.py, 2026-11-27): packed 0.12x / 0.39x the
#: tokens/s of the token quota at 65536 / 16384 tokens with sdpa (the same dense block-diagonal mask), and
#: with flex_attention's document mask still 0.94x / 0.84x of sdpa's token quota, which reached 0.88-0.94 of
#: the no-padding ideal. Unpacked on both.
PACK_MEASURED_FASTER: dict[tuple[str, str], bool] = {("torch", "cpu"): False, ("torch", "cuda"): False}


def resolve_pack(pack: bool | None, device_type: str, backend: str = "torch") -> bool:
    """``pack``, or for None the measured rule :data:`PACK_MEASURED_FASTER` (unknown devices: unpacked)."""
    if pack is not None:
        return bool(pack)
    return PACK_MEASURED_FASTER.get((backend, device_type), False)


def run_plan(model, plan: Sequence[MicroBatch], seqs: Sequence[np.ndarray], prompt_lens: np.ndarray, *,
             pad_id: int, temperature: float, row_chunk: int, return_entropy: bool, attention_mask: bool,
             on_micro_batch: Callable[[MicroBatch], None] | None = None, packed: bool = False):
    """Score every micro-batch of ``plan``; returns (per-micro-batch logps, entropies, head description)."""
    probe_len = min(16, len(seqs[plan[0].indices[0]])) if plan else 0
    parts = find_parts(model, seqs[plan[0].indices[0]][:probe_len]) if plan else Parts(None, None, "n/a")
    if packed and plan:
        check_packing(model, seqs[plan[0].indices[0]][:probe_len])
    all_logps, all_entropy = [], []
    for mb in plan:
        if packed:
            logps, entropy = score_packed_micro_batch(model, parts, mb, seqs, prompt_lens, temperature=temperature,
                                                      row_chunk=row_chunk, return_entropy=return_entropy)
        else:
            logps, entropy = score_micro_batch(model, parts, mb, seqs, prompt_lens, pad_id=pad_id,
                                               temperature=temperature, row_chunk=row_chunk,
                                               return_entropy=return_entropy, attention_mask=attention_mask)
        all_logps.append(logps)
        all_entropy.append(entropy)
        if on_micro_batch is not None:
            on_micro_batch(mb)
    return all_logps, (all_entropy if return_entropy else None), parts.description


def plan_for(lengths: np.ndarray, options: ScoreOptions, packed: bool = False) -> tuple[list[MicroBatch], str]:
    """The micro-batch plan of ``options`` (fixed mbs, token quota or one forward) and its description."""
    from pdsr_sdk.scoring.buckets import plan_fixed, plan_packed, plan_single, plan_token_quota

    mbs, max_tokens, bucket = options.mbs, options.max_tokens_per_micro_batch, int(options.length_bucket)
    if len(lengths) == 0:
        return [], "empty"
    if packed:
        plan = plan_packed(lengths, mbs=mbs, max_tokens=max_tokens)
        what = f"mbs={mbs}" if mbs is not None else f"token quota {max_tokens}" if max_tokens is not None else "one row"
        return plan, f"packed, {what}"
    if mbs is not None:
        return plan_fixed(lengths, int(mbs), length_bucket=bucket), f"mbs={mbs}"
    if max_tokens is not None:
        grouping = options.token_grouping
        plan, _ = plan_token_quota(lengths, int(max_tokens), length_bucket=bucket, grouping=grouping,
                                   max_padding_fraction=options.max_padding_fraction)
        return plan, f"token quota {max_tokens}" + ("" if grouping == "length" else f", grouping={grouping}")
    return plan_single(lengths, length_bucket=bucket), "single forward"


def resolve_pad_id(model, pad_id: int | None) -> int:
    """``pad_id``, else the model's ``pad_token_id`` if it is a token id, else 0; ConfigError if outside the vocab."""
    vocab = model_vocab_size(model)
    if pad_id is None:
        pad_id = getattr(getattr(model, "config", None), "pad_token_id", None) or 0
        return int(pad_id) if 0 <= pad_id < vocab else 0
    if not 0 <= int(pad_id) < vocab:
        raise ConfigValueError(f"pad_id: {pad_id} is not a token id of the model (vocab size {vocab}); "
                          f"any id in [0, {vocab}) works, it never changes results")
    return int(pad_id)


class TorchScoring:
    """The ``torch`` scoring backend: right-padded (or packed) transformers forwards per micro-batch plan."""

    def check(self, options: ScoreOptions) -> None:
        pass  # every option applies (device/dtype are checked by load())

    def load(self, model_dir: Path, options: ScoreOptions) -> Any:
        return load_model(model_dir, options.device, options.dtype)

    def vocab_size(self, model: Any) -> int:
        return model_vocab_size(model)

    def score(self, model: Any, inputs: ScoreInputs, options: ScoreOptions, meter: ScoreMeter) -> BackendOutput:
        from pdsr_sdk.scoring.buckets import plan_stats
        from pdsr_sdk.scoring.memory import PeakMemory

        packed = resolve_pack(options.pack, model_device(model).type)
        plan, mode = plan_for(inputs.lengths, options, packed)
        pad_id = resolve_pad_id(model, options.pad_id)
        with PeakMemory(str(model_device(model))) as mem:
            meter.start(len(plan))
            try:
                per_mb_logps, per_mb_entropy, head = run_plan(
                    model, plan, inputs.seqs, inputs.prompt_lens, pad_id=pad_id,
                    temperature=float(options.temperature), row_chunk=int(options.row_chunk),
                    return_entropy=options.entropy, attention_mask=options.attention_mask,
                    on_micro_batch=lambda mb: meter.advance(mb.indices), packed=packed)
            finally:
                meter.stop()
        stats = plan_stats(plan)
        return BackendOutput(
            partitions=[list(mb.indices) for mb in plan], logps=per_mb_logps, entropy=per_mb_entropy, mode=mode,
            head=head + (", packed" if packed else ""), computed_tokens=stats["computed_tokens"],
            distinct_shapes=stats["distinct_shapes"],
            shapes=tuple(sorted({mb.shape for mb in plan})), peak_memory_bytes=mem.bytes,
            peak_memory_method=mem.method)
