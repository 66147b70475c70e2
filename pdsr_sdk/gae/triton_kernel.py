"""Fused Triton GAE kernels for CUDA tensors (``backend="triton"``, see
:mod:`pdsr_sdk.gae.triton_backend`; this module imports triton).

The masked recurrence (see :mod:`pdsr_sdk.gae`) is written as a map on the
state ``(g, n)`` -- g the running advantage, n the value of the next valid
token -- applied backwards in time. A valid token t maps

    g -> w g + gamma n + (r_t - V_t),   n -> V_t          (w = gamma * lam)

and a masked token is the identity, so a masked reward or value never
enters the state. Any run of tokens composes to one map of the same shape,
five numbers ``(alpha, beta, a, delta, c)``::

    g -> alpha g + beta n + a,          n -> delta n + c

and composition is associative, so a tile of BLOCK tokens is one
``tl.associative_scan`` (reverse, in registers): position t holds the map
of tokens t..end-of-tile, and applied to the state entering the tile from
the right it gives the advantage at t directly.

Kernel layout (one launch in the common case):

- :func:`_gae_scan_kernel`, one program per (row, segment): it walks its
  segment's tiles from the last to the first, carrying ``(g, n)`` from tile
  to tile in registers (one scalar update per tile), and writes advantages
  and returns. Each input byte is read once and each output byte written
  once; no program ever waits for another (no look-back, no atomics).
  With one program per row an SM holds only a few warps, too few to hide
  memory latency, so each iteration first issues the loads of the next
  (earlier) tile, then scans this one (``prefetch``). On an H100 at
  B=256 x T=131072 tiles of 2048 with prefetch reached 0.54 of a device
  copy's bandwidth, 1024 without it 0.43 (bench/gpu.py).
- With enough rows (at least one per SM) every row is one segment.
  Fewer rows leave the GPU idle, so each row is cut into S segments and
  :func:`_gae_summary_kernel` first computes each segment's composite map
  (5 numbers per segment, read-only pass over segments 1..S-1); the scan
  kernel's program for segment j then folds the summaries of segments
  j+1..S-1 into its entry state (a small pass over per-segment carries)
  before scanning. That costs (S-1)/S of an extra read, only on batches too
  small to fill the GPU anyway.

Precision: ``carry_dtype`` sets the dtype of the maps and states; "auto" is
the data's dtype (float32 data: float32, like the numba backend and verl's
loop). gamma and w are passed as a tensor of the carry dtype, so float64
carries do not round them to float32.

CPU tensors are accepted only under Triton's interpreter (``TRITON_INTERPRET=1``
set before triton is imported), which the tests use on machines without a
GPU.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from pdsr_sdk.errors import ConfigError
from pdsr_sdk.gae.triton_check import check_device

#: tokens per tile (a power of two); 2048 x float32 is 8 KiB per array and tile
DEFAULT_BLOCK = 2048
DEFAULT_WARPS = 4
#: load the next tile before scanning this one (bench/gpu.py --part gae sweeps block x warps x prefetch)
DEFAULT_PREFETCH = True


@triton.jit
def _compose(al, bl, xl, dl, cl, ae, be, xe, de, ce):
    """Map L (later tokens, applied first) followed by map E (earlier tokens)."""
    return (ae * al, ae * bl + be * dl, ae * xl + be * cl + xe, de * dl, de * cl + ce)


@triton.jit
def _load_tile(r_ptr, v_ptr, m_ptr, base, offs, lo, steps, CARRY: tl.constexpr):
    """Rewards, values and validity of a tile (tokens outside [lo, steps) are invalid and not read)."""
    inside = (offs < steps) & (offs >= lo)
    r = tl.load(r_ptr + base + offs, mask=inside, other=0.0).to(CARRY)
    v = tl.load(v_ptr + base + offs, mask=inside, other=0.0).to(CARRY)
    valid = (tl.load(m_ptr + base + offs, mask=inside, other=0) != 0) & inside
    return r, v, valid, inside


@triton.jit
def _maps(r, v, valid, gamma, w):
    """The five per-token map coefficients of a tile (identity at masked and out-of-row tokens)."""
    zero = tl.zeros_like(v)
    one = zero + 1.0
    alpha = tl.where(valid, zero + w, one)
    beta = tl.where(valid, zero + gamma, zero)
    a = tl.where(valid, r - v, zero)
    delta = tl.where(valid, zero, one)
    c = tl.where(valid, v, zero)
    return alpha, beta, a, delta, c


@triton.jit
def _first(x, idx):
    """Element 0 of a 1-D tile as a scalar."""
    return tl.sum(tl.where(idx == 0, x, tl.zeros_like(x)), axis=0)


@triton.jit
def _gae_summary_kernel(r_ptr, v_ptr, m_ptr, p_ptr, sum_ptr, steps, stride_row, tiles_per_seg, n_tiles,
                        n_segs, CARRY: tl.constexpr, BLOCK: tl.constexpr):
    """Composite map of segment ``program_id(1) + 1`` of row ``program_id(0)`` into sum_ptr[row, seg, 0:5]."""
    row = tl.program_id(0)
    seg = tl.program_id(1) + 1
    base = row.to(tl.int64) * stride_row
    gamma = tl.load(p_ptr)
    w = tl.load(p_ptr + 1)
    idx = tl.arange(0, BLOCK)
    first_tile = seg * tiles_per_seg
    last_tile = tl.minimum(first_tile + tiles_per_seg, n_tiles) - 1
    al = gamma * 0.0 + 1.0
    bl = gamma * 0.0
    xl = gamma * 0.0
    dl = gamma * 0.0 + 1.0
    cl = gamma * 0.0
    for k in range(0, last_tile - first_tile + 1):
        offs = (last_tile - k) * BLOCK + idx
        r, v, valid, inside = _load_tile(r_ptr, v_ptr, m_ptr, base, offs, 0, steps, CARRY)
        alpha, beta, a, delta, c = _maps(r, v, valid, gamma, w)
        alpha, beta, a, delta, c = tl.associative_scan((alpha, beta, a, delta, c), 0, _compose, reverse=True)
        al, bl, xl, dl, cl = _compose(al, bl, xl, dl, cl, _first(alpha, idx), _first(beta, idx),
                                      _first(a, idx), _first(delta, idx), _first(c, idx))
    out = sum_ptr + (row.to(tl.int64) * n_segs + seg) * 5
    tl.store(out, al)
    tl.store(out + 1, bl)
    tl.store(out + 2, xl)
    tl.store(out + 3, dl)
    tl.store(out + 4, cl)


@triton.jit
def _gae_scan_kernel(r_ptr, v_ptr, m_ptr, p_ptr, sum_ptr, adv_ptr, ret_ptr, steps, stride_row, tiles_per_seg,
                     n_tiles, n_segs, CARRY: tl.constexpr, BLOCK: tl.constexpr, PREFETCH: tl.constexpr):
    """Advantages and returns of segment ``program_id(1)`` of row ``program_id(0)``."""
    row = tl.program_id(0)
    seg = tl.program_id(1)
    base = row.to(tl.int64) * stride_row
    gamma = tl.load(p_ptr)
    w = tl.load(p_ptr + 1)
    idx = tl.arange(0, BLOCK)
    # entry state: zero after the row's end, folded through the later segments' maps
    g = gamma * 0.0
    n = gamma * 0.0
    for k in range(0, n_segs - 1 - seg):
        s = sum_ptr + (row.to(tl.int64) * n_segs + (n_segs - 1 - k)) * 5
        g_new = tl.load(s) * g + tl.load(s + 1) * n + tl.load(s + 2)
        n = tl.load(s + 3) * n + tl.load(s + 4)
        g = g_new
    first_tile = seg * tiles_per_seg
    last_tile = tl.minimum(first_tile + tiles_per_seg, n_tiles) - 1
    lo = first_tile * BLOCK
    offs = last_tile * BLOCK + idx
    r, v, valid, inside = _load_tile(r_ptr, v_ptr, m_ptr, base, offs, lo, steps, CARRY)
    for k in range(0, last_tile - first_tile + 1):
        if PREFETCH:
            # issue the next (earlier) tile's loads before this tile's scan, so memory latency overlaps
            # the scan (one program per row leaves few warps per SM to hide it otherwise)
            r_n, v_n, valid_n, inside_n = _load_tile(r_ptr, v_ptr, m_ptr, base, offs - BLOCK, lo, steps, CARRY)
        else:
            r_n, v_n, valid_n, inside_n = r, v, valid, inside
        alpha, beta, a, delta, c = _maps(r, v, valid, gamma, w)
        alpha, beta, a, delta, c = tl.associative_scan((alpha, beta, a, delta, c), 0, _compose, reverse=True)
        adv = alpha * g + beta * n + a
        tl.store(adv_ptr + base + offs, adv.to(adv_ptr.dtype.element_ty), mask=inside)
        tl.store(ret_ptr + base + offs, (adv + v).to(ret_ptr.dtype.element_ty), mask=inside)
        n = _first(delta, idx) * n + _first(c, idx)
        g = _first(adv, idx)
        offs = offs - BLOCK
        if PREFETCH:
            r, v, valid, inside = r_n, v_n, valid_n, inside_n
        else:
            r, v, valid, inside = _load_tile(r_ptr, v_ptr, m_ptr, base, offs, lo, steps, CARRY)


def auto_segments(rows: int, n_tiles: int, device: torch.device) -> int:
    """Segments per row: 1 when the rows alone give every SM a program (each input read once),
    else enough segments for about two programs per SM."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if rows >= sms:
        return 1
    return max(1, min(n_tiles, math.ceil(2 * sms / max(rows, 1))))


def triton_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float, *,
               carry_dtype: str = "auto", out: tuple[torch.Tensor, torch.Tensor] | None = None,
               block: int = DEFAULT_BLOCK, segments: int | None = None,
               num_warps: int = DEFAULT_WARPS, prefetch: bool = DEFAULT_PREFETCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE of contiguous [B, T] CUDA tensors (float32/float64 rewards and values, bool mask).

    ``block`` is the tile length (a power of two), ``segments`` the number of
    independent pieces per row (None: :func:`auto_segments`), ``prefetch`` loads
    each tile while the tile after it is scanned.
    """
    check_device(rewards.device)
    if block < 1 or block & (block - 1):
        raise ConfigError(f"block: expected a power of two, got {block}")
    rows, steps = rewards.shape
    adv = out[0] if out is not None else torch.empty_like(rewards)
    ret = out[1] if out is not None else torch.empty_like(rewards)
    if rows == 0 or steps == 0:
        return adv, ret
    if carry_dtype == "auto":
        carry_dtype = "float64" if rewards.dtype == torch.float64 else "float32"
    carry = torch.float64 if carry_dtype == "float64" else torch.float32
    params = torch.tensor([gamma, gamma * lam], dtype=carry, device=rewards.device)
    r, v = rewards.contiguous(), values.contiguous()
    m = mask.contiguous()
    m = m.view(torch.uint8) if m.dtype == torch.bool else (m != 0).view(torch.uint8)
    # out may alias rewards/values: every tile is read before it is written, by the same program
    adv_k = adv if adv.is_contiguous() else torch.empty_like(rewards)
    ret_k = ret if ret.is_contiguous() else torch.empty_like(rewards)
    n_tiles = triton.cdiv(steps, block)
    n_segs = auto_segments(rows, n_tiles, rewards.device) if segments is None else max(1, min(int(segments),
                                                                                             n_tiles))
    tiles_per_seg = triton.cdiv(n_tiles, n_segs)
    n_segs = triton.cdiv(n_tiles, tiles_per_seg)
    summaries = torch.zeros((rows, n_segs, 5), dtype=carry, device=rewards.device)
    ctype = tl.float64 if carry == torch.float64 else tl.float32
    if n_segs > 1:
        _gae_summary_kernel[(rows, n_segs - 1)](r, v, m, params, summaries, steps, steps, tiles_per_seg, n_tiles,
                                                n_segs, CARRY=ctype, BLOCK=block, num_warps=num_warps)
    _gae_scan_kernel[(rows, n_segs)](r, v, m, params, summaries, adv_k, ret_k, steps, steps, tiles_per_seg,
                                     n_tiles, n_segs, CARRY=ctype, BLOCK=block, PREFETCH=bool(prefetch),
                                     num_warps=num_warps)
    if adv_k is not adv:
        adv.copy_(adv_k)
    if ret_k is not ret:
        ret.copy_(ret_k)
    return adv, ret
