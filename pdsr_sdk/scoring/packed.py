"""Packed micro-batches for the torch backend (``ScoreOptions.pack``).

Each micro-batch is one row of
the concatenated samples with position ids restarting at 0 for every
sample and no attention mask. transformers (>= 4.53; 5.x here) reads
sample boundaries from such position ids (``find_packed_sequence_indices``)
and builds attention that never crosses them for every implementation: a
block-causal mask for sdpa/eager, a document BlockMask for flex_attention,
varlen (cu_seqlens) for flash_attention_2/3. By default (``ScoreOptions.packed_attention`` 'varlen') the
model runs with :mod:`~pdsr_sdk.scoring.varlen_attention` instead, which computes only each sample's own causal
block (sdpa's packed mask is N x N over the row). No token is padding. Each call
checks this once on a probe (two copies of a short sequence packed together
must give the same logits as one); a model that ignores packed position ids
raises ConfigError instead of silently attending across samples.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from pdsr_sdk.errors import ConfigValueError
from pdsr_sdk.scoring.buckets import MicroBatch
from pdsr_sdk.scoring.hf_model import Parts, last_hidden, model_device
from pdsr_sdk.scoring.varlen_attention import packed_bounds

__all__ = ["packed_inputs", "score_packed_micro_batch", "check_packing", "PACK_MEASURED_FASTER", "resolve_pack",
           "packed_attention_for"]


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
                             return_entropy: bool, varlen: bool = False
                             ) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Like :func:`score_micro_batch`, for a packed micro-batch (one row, no padding, no attention mask).
    ``varlen``: the model runs under :func:`~pdsr_sdk.scoring.varlen_attention.packed_attention`, which reads
    the sample bounds passed here."""
    import torch

    from pdsr_sdk.scoring.logprob_kernel import chunked_token_logps

    device = model_device(model)
    ids_np, pos_ids_np, pos, sizes = packed_inputs(mb, seqs, prompt_lens)
    targets = torch.as_tensor(ids_np[0, pos + 1], device=device)
    pos_t = torch.as_tensor(pos, device=device)
    kwargs: dict[str, Any] = dict(input_ids=torch.as_tensor(ids_np, device=device),
                                  position_ids=torch.as_tensor(pos_ids_np, device=device), use_cache=False)
    if varlen:
        # the sample bounds, computed once here rather than in every layer (transformers passes these through)
        bounds = packed_bounds(pos_ids_np)
        cu = torch.as_tensor(bounds, device=device, dtype=torch.int32)
        longest = int(np.diff(bounds).max())
        kwargs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    with torch.inference_mode():
        if parts.chunked:
            selected = last_hidden(parts.decoder(**kwargs, return_dict=True))[0, pos_t]
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
#: the no-padding ideal. H200 (the same bench, 2026-11-30) with packed attention 'varlen' (flash-attention
#: varlen, pdsr_sdk.scoring.varlen_attention): packed 1.00x / 0.98x the token quota's tokens/s at 65536 / 16384
#: (0.94 / 0.91 of the ideal); CPU (bench/score.py --samples 128, a loaded 2-core machine): 0.83x. Unpacked on both.
PACK_MEASURED_FASTER: dict[tuple[str, str], bool] = {("torch", "cpu"): False, ("torch", "cuda"): False}


def resolve_pack(pack: bool | None, device_type: str, backend: str = "torch") -> bool:
    """``pack``, or for None the measured rule :data:`PACK_MEASURED_FASTER` (unknown devices: unpacked)."""
    if pack is not None:
        return bool(pack)
    return PACK_MEASURED_FASTER.get((backend, device_type), False)


def packed_attention_for(model, choice: str) -> str:
    """Which attention a packed forward of ``model`` uses for ``ScoreOptions.packed_attention`` ``choice``:
    'varlen flash' / 'varlen per-sample sdpa' (:mod:`~pdsr_sdk.scoring.varlen_attention`), or the model's own
    implementation's name, with transformers' packed mask ('model', or a model varlen cannot serve)."""
    from pdsr_sdk.scoring.varlen_attention import flash_varlen_available, supports_packed_attention

    own = str(getattr(getattr(model, "config", None), "_attn_implementation", "?"))
    if choice != "varlen" or not supports_packed_attention(model):
        return own
    dtype = str(getattr(model, "dtype", "")).removeprefix("torch.")
    return "varlen flash" if flash_varlen_available(model_device(model).type, dtype) else "varlen per-sample sdpa"
