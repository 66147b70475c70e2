"""What verifying k drafted tokens costs: one 7B-shaped transformer layer's forward against tokens per step and batch.

    .venv/bin/python bench/verify_cost.py                          # the table (a CUDA GPU)
    .venv/bin/python bench/verify_cost.py --json out/verify.json   # also as JSON, rewritten as it goes
    .venv/bin/python bench/verify_cost.py --context 4096 --batches 1 8 64 --tokens 1 2 4

For the speculation work (issue 52, item 1): a target model's verify step scores k tokens per sequence (the
last accepted token and k - 1 drafted ones) against a KV cache; decoding is k = 1. Whether drafting pays depends
on how much more a k-token step costs than a 1-token step at the batch size the engine runs, which this measures.

The layer (Llama-2-7B's shape; bf16, random weights, made up here, nothing downloaded): hidden 4096, 32 heads of
128 (no grouped KV), SwiGLU MLP 11008, RMSNorm, rotary embeddings. One step for a batch of B sequences with k new
tokens each, every sequence with --context tokens already in its KV cache: RMSNorm, fused QKV projection, RoPE,
the new keys and values written into the cache, attention of the k queries over the context + k keys (causal
among the new ones, aligned to the end: ``causal_lower_right``), output projection + residual, RMSNorm, gate/up
projection, SiLU, down projection + residual. A full model step is about 32 of these plus the lm_head.

Timing: median of --repeat runs with CUDA events after a warm-up, each point replayed as a CUDA graph (what
serving engines do for decode-sized steps; ``ms``), and eagerly (``ms_eager``, launch overhead included) unless
--no-eager. Per point: milliseconds, the ratio to k = 1 at the same batch, achieved TFLOP/s (matmuls and
attention) and GB/s (weights + the KV cache read once + activations).

Needs a CUDA device; without one it says so (and writes that to --json) and exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np
from bench_args import at_least

HIDDEN, HEADS, HEAD_DIM, MLP = 4096, 32, 128, 11008


def layer_params() -> int:
    return HIDDEN * 3 * HIDDEN + HIDDEN * HIDDEN + HIDDEN * 2 * MLP + MLP * HIDDEN + 2 * HIDDEN


def step_flops(batch: int, k: int, context: int) -> float:
    """Matmul FLOPs (2 per multiply-add) plus attention (QK^T and AV over context + the causal new keys)."""
    matmul = 2.0 * batch * k * (layer_params() - 2 * HIDDEN)
    keys = k * context + k * (k + 1) / 2          # keys seen, summed over the k queries
    return matmul + 2.0 * 2.0 * batch * HEADS * HEAD_DIM * keys


def step_bytes(batch: int, k: int, context: int) -> float:
    """bf16 bytes a step must move at least: the weights once, the KV cache read once, K/V written, x in/out."""
    return 2.0 * (layer_params() + 2 * batch * HEADS * HEAD_DIM * (context + k) + 2 * batch * k * HIDDEN)


class Layer:
    """The 7B-shaped decoder layer with a preallocated KV cache for the largest batch."""

    def __init__(self, max_batch: int, context: int, max_k: int, device: str = "cuda"):
        import torch

        torch.manual_seed(0)
        dt = torch.bfloat16

        def w(rows, cols):
            return (torch.randn(rows, cols, device=device, dtype=dt) / math.sqrt(cols))

        self.context = context
        self.w_qkv, self.w_o = w(3 * HIDDEN, HIDDEN), w(HIDDEN, HIDDEN)
        self.w_gate_up, self.w_down = w(2 * MLP, HIDDEN), w(HIDDEN, MLP)
        self.norm1 = torch.ones(HIDDEN, device=device, dtype=dt)
        self.norm2 = torch.ones(HIDDEN, device=device, dtype=dt)
        cache_shape = (max_batch, HEADS, context + max_k, HEAD_DIM)
        self.k_cache = torch.randn(cache_shape, device=device, dtype=dt)
        self.v_cache = torch.randn(cache_shape, device=device, dtype=dt)
        pos = torch.arange(context, context + max_k, device=device, dtype=torch.float32)
        inv = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2, device=device, dtype=torch.float32) / HEAD_DIM))
        ang = torch.outer(pos, inv)
        self.cos = torch.cat([ang.cos(), ang.cos()], -1).to(dt)     # [max_k, HEAD_DIM]
        self.sin = torch.cat([ang.sin(), ang.sin()], -1).to(dt)
        try:
            from torch.nn.attention.bias import causal_lower_right
            self.causal_lower_right = causal_lower_right
        except ImportError:   # older torch: an explicit mask
            self.causal_lower_right = None

    @staticmethod
    def rms_norm(x, weight, eps=1e-5):
        import torch

        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight

    def rope(self, t, k: int):
        cos, sin = self.cos[:k], self.sin[:k]
        half = HEAD_DIM // 2
        rotated = __import__("torch").cat([-t[..., half:], t[..., :half]], -1)
        return t * cos + rotated * sin

    def forward(self, x):
        """x: [B, k, HIDDEN] -> [B, k, HIDDEN]; writes the k new keys/values after the context."""
        import torch
        import torch.nn.functional as F

        b, k, _ = x.shape
        c = self.context
        h = self.rms_norm(x, self.norm1)
        qkv = (h @ self.w_qkv.t()).view(b, k, 3, HEADS, HEAD_DIM)
        q, kn, vn = (qkv[:, :, i].transpose(1, 2) for i in range(3))     # [B, H, k, D]
        q, kn = self.rope(q, k), self.rope(kn, k)
        self.k_cache[:b, :, c:c + k] = kn
        self.v_cache[:b, :, c:c + k] = vn
        keys, values = self.k_cache[:b, :, :c + k], self.v_cache[:b, :, :c + k]
        if k == 1:
            mask = None
        elif self.causal_lower_right is not None:
            mask = self.causal_lower_right(k, c + k)
        else:
            mask = torch.ones(k, c + k, dtype=torch.bool, device=x.device).tril(c)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + attn.transpose(1, 2).reshape(b, k, HIDDEN) @ self.w_o.t()
        h = self.rms_norm(x, self.norm2)
        gate, up = (h @ self.w_gate_up.t()).split(MLP, -1)
        return x + (F.silu(gate) * up) @ self.w_down.t()


def timed_ms(fn, repeat: int) -> float:
    """Median milliseconds of ``fn`` on the current CUDA stream (after one warm-up call)."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def graph_of(fn):
    """``fn`` captured as a CUDA graph (its replay), after warm-up on a side stream as torch asks."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def write(path: str | None, data: dict) -> None:
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=at_least(0), default=2048, help="tokens already in each sequence's KV cache")
    ap.add_argument("--tokens", type=at_least(1), nargs="+", default=list(range(1, 9)),
                    help="new tokens per sequence (k)")
    ap.add_argument("--batches", type=at_least(1), nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256],
                    help="sequences per step (B)")
    ap.add_argument("--repeat", type=at_least(1), default=20, help="timed repeats per point (median shown)")
    ap.add_argument("--no-eager", action="store_true", help="time only the CUDA graph replay")
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="also write the table as JSON to PATH (rewritten after each point)")
    args = ap.parse_args()
    data: dict = {"script": "bench/verify_cost.py", "complete": False,
                  "layer": {"hidden": HIDDEN, "heads": HEADS, "head_dim": HEAD_DIM, "mlp": MLP, "dtype": "bfloat16",
                            "params": layer_params(), "shape_of": "Llama-2-7B (one of its 32 layers)"},
                  "context": args.context, "tokens": args.tokens, "batches": args.batches, "repeat": args.repeat,
                  "points": []}
    try:
        import torch
    except ImportError:
        print("bench/verify_cost.py: torch is not installed; nothing to measure")
        data.update(skipped="torch is not installed", complete=True)
        write(args.json, data)
        return
    if not torch.cuda.is_available():
        print("bench/verify_cost.py: no CUDA device here; the verify-cost table needs a GPU (CI does not run it)")
        data.update(skipped="no CUDA device", complete=True)
        write(args.json, data)
        return

    data.update(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda)
    layer = Layer(max(args.batches), args.context, max(args.tokens))
    write(args.json, data)
    print(f"verify cost: one 7B-shaped layer (bf16), context {args.context}, {torch.cuda.get_device_name()}")
    print(f"  {'B':>4} {'k':>2} {'ms':>8} {'vs k=1':>7} {'ms eager':>9} {'TFLOP/s':>8} {'GB/s':>7}")
    for batch in sorted(args.batches):
        base = None
        for k in sorted(args.tokens):
            x = torch.randn(batch, k, HIDDEN, device="cuda", dtype=torch.bfloat16)
            point = {"batch": batch, "k": k, "tokens": batch * k, "flops": step_flops(batch, k, args.context),
                     "bytes": step_bytes(batch, k, args.context)}
            with torch.inference_mode():
                try:
                    point["ms"] = timed_ms(graph_of(lambda x=x: layer.forward(x)), args.repeat)
                except Exception as exc:  # noqa: BLE001 - a failed capture still leaves the eager number
                    point["graph_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    torch.cuda.synchronize()
                if not args.no_eager:
                    point["ms_eager"] = timed_ms(lambda x=x: layer.forward(x), args.repeat)
            ms = point.get("ms", point.get("ms_eager"))
            if ms is not None:
                if k == min(args.tokens):
                    base = ms
                point["vs_k1"] = ms / base if base and min(args.tokens) == 1 else None
                point["tflop_s"] = point["flops"] / (ms * 1e-3) / 1e12
                point["gb_s"] = point["bytes"] / (ms * 1e-3) / 1e9
            data["points"].append(point)
            write(args.json, data)
            fmt = lambda v, spec: "" if v is None else format(v, spec)  # noqa: E731
            print(f"  {batch:>4} {k:>2} {fmt(point.get('ms'), '8.3f'):>8} {fmt(point.get('vs_k1'), '7.2f'):>7} "
                  f"{fmt(point.get('ms_eager'), '9.3f'):>9} {fmt(point.get('tflop_s'), '8.1f'):>8} "
                  f"{fmt(point.get('gb_s'), '7.0f'):>7}", flush=True)
    data["complete"] = True
    write(args.json, data)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
