"""Attention for packed rows without a mask: each sample attends to itself alone.

A packed micro-batch is one row of concatenated samples. transformers keeps
attention inside each sample by building a block-causal mask over the whole
row for sdpa / eager (N x N for N tokens: the cost that made packed scoring
0.1-0.4x of the unpacked token quota on an H100) or a document BlockMask for
flex_attention. This module computes only the diagonal blocks instead:

- :func:`flash_varlen` (CUDA, fp16 / bf16, torch with ``torch.nn.attention.varlen``):
  one flash-attention varlen call over the row, the sample bounds as cu_seqlens;
- :func:`segment_loop` (any device and dtype): one causal sdpa call per sample.

:func:`attention_forward` is registered with transformers' ``AttentionInterface``
as :data:`ATTN_NAME` and :func:`packed_attention` switches a model to it for the
length of a packed forward; the sample bounds reach it as the
``cu_seq_lens_q`` / ``max_length_q`` keywords transformers passes through to
every attention layer (the same ones its flash-attention varlen path reads),
else from the position ids. :func:`block_causal_reference` is the float64
masked-softmax twin the tests hold both to.
"""

from __future__ import annotations

import contextlib
import inspect
from functools import lru_cache
from typing import Any, Iterator

import numpy as np

__all__ = ["ATTN_NAME", "packed_bounds", "segment_loop", "flash_varlen", "flash_varlen_available",
           "block_causal_reference", "attention_forward", "supports_packed_attention", "packed_attention"]

#: The name under which :func:`attention_forward` is registered with transformers.
ATTN_NAME = "pdsr_varlen"

#: dtypes flash attention's varlen kernel takes
_FLASH_DTYPES = ("float16", "bfloat16")


def packed_bounds(position_ids: np.ndarray) -> np.ndarray:
    """cu_seqlens (int64, [0, ..., N]) of one packed row from its position ids: a sample starts where the position
    id does not continue the one before (transformers' rule, ``find_packed_sequence_indices``)."""
    pos = np.asarray(position_ids).reshape(-1)
    if pos.size == 0:
        return np.zeros(1, dtype=np.int64)
    starts = np.flatnonzero(np.diff(pos) != 1) + 1
    return np.concatenate([[0], starts, [pos.size]]).astype(np.int64)


def _expand_heads(x, groups: int):
    """[.., H_kv, ..] heads repeated for grouped-query attention (dim -3 of [H, T, D] / [B, H, T, D])."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=-3)


def segment_loop(query, key, value, bounds: np.ndarray, scale: float):
    """Causal attention of each sample on its own: ``query`` [H, N, D], ``key`` / ``value`` [H_kv, N, D]
    (H a multiple of H_kv), ``bounds`` the cu_seqlens; returns [H, N, D] in the query's dtype."""
    import torch
    import torch.nn.functional as F

    groups = query.shape[0] // key.shape[0]
    out = torch.empty_like(query)
    for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if end > start:
            out[:, start:end] = F.scaled_dot_product_attention(
                query[None, :, start:end], _expand_heads(key[None, :, start:end], groups),
                _expand_heads(value[None, :, start:end], groups), is_causal=True, scale=scale)[0]
    return out


@lru_cache(maxsize=1)
def _varlen_api() -> tuple[Any, frozenset[str]] | None:
    """torch's ``varlen_attn`` and its keyword names (they changed between releases), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def flash_varlen_available(device_type: str, dtype_name: str) -> bool:
    """Whether :func:`flash_varlen` can run: torch has the varlen API, the tensors are CUDA fp16 / bf16, and the
    device is Ampere or newer (flash attention's floor)."""
    if device_type != "cuda" or dtype_name not in _FLASH_DTYPES or _varlen_api() is None:
        return False
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


def flash_varlen(query, key, value, cu_seqlens, max_len: int, scale: float):
    """Causal varlen flash attention over a packed row: ``query`` [H, N, D], ``key`` / ``value`` [H_kv, N, D],
    ``cu_seqlens`` an int32 tensor on the device, ``max_len`` the longest sample; returns [H, N, D]."""
    api = _varlen_api()
    if api is None:
        raise RuntimeError("torch.nn.attention.varlen is not available in this torch")
    varlen_attn, params = api
    groups = query.shape[0] // key.shape[0]
    kwargs: dict[str, Any] = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)          # (left, right): causal
    else:
        kwargs["is_causal"] = True
    if "enable_gqa" in params:
        kwargs["enable_gqa"] = groups > 1
    else:
        key, value = _expand_heads(key, groups), _expand_heads(value, groups)
    q = query.transpose(0, 1)
    if "scale" in params:
        kwargs["scale"] = scale
    else:                                        # the kernel's own scale is 1 / sqrt(D)
        q = q * (scale * query.shape[-1] ** 0.5)
    out = varlen_attn(q.contiguous(), key.transpose(0, 1).contiguous(), value.transpose(0, 1).contiguous(),
                      cu_seqlens, cu_seqlens, int(max_len), int(max_len), **kwargs)
    return out.transpose(0, 1)


def block_causal_reference(query: np.ndarray, key: np.ndarray, value: np.ndarray, bounds: np.ndarray,
                           scale: float) -> np.ndarray:
    """float64 twin: softmax over a dense mask where token i sees token j iff both are in one sample and j <= i.
    ``query`` [H, N, D], ``key`` / ``value`` [H_kv, N, D]."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (query, key, value))
    groups = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, groups, axis=0), np.repeat(v, groups, axis=0)
    n = q.shape[1]
    sample = np.searchsorted(np.asarray(bounds)[1:], np.arange(n), side="right")
    idx = np.arange(n)
    allowed = (sample[:, None] == sample[None, :]) & (idx[None, :] <= idx[:, None])
    scores = np.einsum("hid,hjd->hij", q, k) * scale
    scores = np.where(allowed[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("hij,hjd->hid", weights, v)


def attention_forward(module, query, key, value, attention_mask, scaling: float | None = None,
                      dropout: float = 0.0, **kwargs):
    """transformers' attention-function signature, for a packed batch of one row: ``query`` [1, H, N, D],
    ``key`` / ``value`` [1, H_kv, N, D]; returns ([1, N, H, D], None). Called by every attention layer during a
    forward run under :func:`packed_attention`."""
    if query.shape[0] != 1:
        raise ValueError(f"{ATTN_NAME} attention takes one packed row, got a batch of {query.shape[0]}")
    if key.shape[2] != query.shape[2]:
        raise ValueError(f"{ATTN_NAME} attention runs without a KV cache (use_cache=False): {key.shape[2]} keys "
                         f"for {query.shape[2]} queries")
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    cu = kwargs.get("cu_seq_lens_q")
    max_len = kwargs.get("max_length_q")
    if cu is None:
        position_ids = kwargs.get("position_ids")
        n = query.shape[2]
        pos = np.arange(n) if position_ids is None else position_ids.reshape(-1).cpu().numpy()
        bounds = packed_bounds(pos)
        cu, max_len = bounds, int(np.diff(bounds).max(initial=0))
    if flash_varlen_available(query.device.type, str(query.dtype).removeprefix("torch.")):
        import torch

        cu_t = torch.as_tensor(cu, device=query.device, dtype=torch.int32)
        out = flash_varlen(query[0], key[0], value[0], cu_t, int(max_len), scale)
    else:
        bounds = cu.cpu().numpy() if hasattr(cu, "cpu") else np.asarray(cu)
        out = segment_loop(query[0], key[0], value[0], bounds, scale)
    return out.transpose(0, 1)[None].contiguous(), None


@lru_cache(maxsize=1)
def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, attention_forward)


def supports_packed_attention(model) -> bool:
    """Whether :func:`packed_attention` can stand in for ``model``'s attention: it takes transformers'
    attention functions (``_supports_attention_backend``) and uses neither sliding windows nor logit
    soft-capping, which this module does not implement."""
    config = getattr(model, "config", None)
    if config is None or not getattr(model, "_supports_attention_backend", False):
        return False
    if not hasattr(model, "set_attn_implementation"):
        return False
    layer_types = getattr(config, "layer_types", None) or ()
    if "sliding_attention" in layer_types:
        return False
    if getattr(config, "attn_logit_softcapping", None):
        return False
    return True


@contextlib.contextmanager
def packed_attention(model) -> Iterator[None]:
    """Run ``model``'s attention layers as :func:`attention_forward` inside the block, restoring its own
    implementation after (also on an error)."""
    _register()
    before = model.config._attn_implementation
    model.set_attn_implementation(ATTN_NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(before)
