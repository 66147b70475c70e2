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

Packed micro-batches: :mod:`pdsr_sdk.scoring.packed`; loading the model and finding its
decoder and head: :mod:`pdsr_sdk.scoring.hf_model`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from pdsr_sdk.errors import ConfigValueError
from pdsr_sdk.scoring.backend import BackendOutput, ScoreInputs, ScoreMeter
from pdsr_sdk.scoring.buckets import MicroBatch
from pdsr_sdk.scoring.config import DEFAULT_TOKEN_QUOTA
from pdsr_sdk.scoring.hf_model import Parts, find_parts, last_hidden, load_model, model_device, model_vocab_size
from pdsr_sdk.scoring.packed import check_packing, packed_attention_for, resolve_pack, score_packed_micro_batch

if TYPE_CHECKING:
    from pdsr_sdk.scoring.config import ScoreOptions

__all__ = ["TorchScoring", "load_model", "run_plan", "plan_for", "score_micro_batch", "build_batch", "resolve_pad_id"]


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
            hidden = last_hidden(parts.decoder(**kwargs, return_dict=True))
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


def run_plan(model, plan: Sequence[MicroBatch], seqs: Sequence[np.ndarray], prompt_lens: np.ndarray, *,
             pad_id: int, temperature: float, row_chunk: int, return_entropy: bool, attention_mask: bool,
             on_micro_batch: Callable[[MicroBatch], None] | None = None, packed: bool = False,
             packed_attention: str = "varlen"):
    """Score every micro-batch of ``plan``; returns (per-micro-batch logps, entropies, head description).
    Packed plans run with the attention :func:`packed_attention_for` picks (its name ends the description)."""
    from pdsr_sdk.scoring.varlen_attention import packed_attention as varlen_attention

    probe_len = min(16, len(seqs[plan[0].indices[0]])) if plan else 0
    parts = find_parts(model, seqs[plan[0].indices[0]][:probe_len]) if plan else Parts(None, None, "n/a")
    attention = packed_attention_for(model, packed_attention) if packed else ""
    varlen = attention.startswith("varlen")
    with varlen_attention(model) if varlen else contextlib.nullcontext():
        if packed and plan:
            check_packing(model, seqs[plan[0].indices[0]][:probe_len])
        logps, entropy = _run_micro_batches(model, parts, plan, seqs, prompt_lens, pad_id=pad_id,
                                            temperature=temperature, row_chunk=row_chunk,
                                            return_entropy=return_entropy, attention_mask=attention_mask,
                                            on_micro_batch=on_micro_batch, packed=packed, varlen=varlen)
    head = parts.description + (f", packed ({attention} attention)" if packed else "")
    return logps, (entropy if return_entropy else None), head


def _run_micro_batches(model, parts: Parts, plan: Sequence[MicroBatch], seqs: Sequence[np.ndarray],
                       prompt_lens: np.ndarray, *, pad_id: int, temperature: float, row_chunk: int,
                       return_entropy: bool, attention_mask: bool,
                       on_micro_batch: Callable[[MicroBatch], None] | None, packed: bool, varlen: bool):
    all_logps, all_entropy = [], []
    for mb in plan:
        if packed:
            logps, entropy = score_packed_micro_batch(model, parts, mb, seqs, prompt_lens, temperature=temperature,
                                                      row_chunk=row_chunk, return_entropy=return_entropy,
                                                      varlen=varlen)
        else:
            logps, entropy = score_micro_batch(model, parts, mb, seqs, prompt_lens, pad_id=pad_id,
                                               temperature=temperature, row_chunk=row_chunk,
                                               return_entropy=return_entropy, attention_mask=attention_mask)
        all_logps.append(logps)
        all_entropy.append(entropy)
        if on_micro_batch is not None:
            on_micro_batch(mb)
    return all_logps, all_entropy


def plan_for(lengths: np.ndarray, options: ScoreOptions, packed: bool = False) -> tuple[list[MicroBatch], str]:
    """The micro-batch plan of ``options`` (fixed mbs, else a token quota: the given one, or the default one
    raised to the longest padded row) and its description."""
    from pdsr_sdk.scoring.buckets import plan_fixed, plan_packed, plan_token_quota, round_up

    mbs, max_tokens, bucket = options.mbs, options.max_tokens_per_micro_batch, int(options.length_bucket)
    if len(lengths) == 0:
        return [], "empty"
    quota = f"token quota {max_tokens}"
    if mbs is None and max_tokens is None:
        # one forward over a block of rows padded to its longest ran out of memory (24 GB on 2,000 rows)
        longest = int(lengths.max()) if packed else round_up(int(lengths.max()), bucket)
        max_tokens = max(DEFAULT_TOKEN_QUOTA, longest)
        quota = f"token quota {max_tokens} (default)"
    if packed:
        plan = plan_packed(lengths, mbs=mbs, max_tokens=None if mbs is not None else max_tokens)
        return plan, f"packed, {f'mbs={mbs}' if mbs is not None else quota}"
    if mbs is not None:
        return plan_fixed(lengths, int(mbs), length_bucket=bucket), f"mbs={mbs}"
    grouping = options.token_grouping
    plan, _ = plan_token_quota(lengths, int(max_tokens), length_bucket=bucket, grouping=grouping,
                               max_padding_fraction=options.max_padding_fraction)
    return plan, quota + ("" if grouping == "length" else f", grouping={grouping}")


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


@contextlib.contextmanager
def eval_mode(model: Any):
    """``model`` in eval mode (dropout off) while it is scored, each module's mode put back after: a trainer scores
    its policy between optimizer steps, in train mode, and the old policy's log-probs must not be dropout's draw."""
    modes = [(m, m.training) for m in model.modules()] if hasattr(model, "modules") else []
    if not any(training for _, training in modes):
        yield
        return
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:   # parents first: a child's own mode, set after, wins
            m.train(training)


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
        with eval_mode(model), PeakMemory(str(model_device(model))) as mem:
            meter.start(len(plan))
            try:
                per_mb_logps, per_mb_entropy, head = run_plan(
                    model, plan, inputs.seqs, inputs.prompt_lens, pad_id=pad_id,
                    temperature=float(options.temperature), row_chunk=int(options.row_chunk),
                    return_entropy=options.entropy, attention_mask=options.attention_mask,
                    on_micro_batch=lambda mb: meter.advance(mb.indices), packed=packed,
                    packed_attention=options.packed_attention)
            finally:
                meter.stop()
        stats = plan_stats(plan)
        return BackendOutput(
            partitions=[list(mb.indices) for mb in plan], logps=per_mb_logps, entropy=per_mb_entropy, mode=mode,
            head=head, computed_tokens=stats["computed_tokens"],
            distinct_shapes=stats["distinct_shapes"],
            shapes=tuple(sorted({mb.shape for mb in plan})), peak_memory_bytes=mem.bytes,
            peak_memory_method=mem.method)
