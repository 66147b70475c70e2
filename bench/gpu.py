"""GPU measurements of issue 16: the fused GAE kernel and packed scoring.

    .venv/bin/python bench/gpu.py                  # both parts
    .venv/bin/python bench/gpu.py --part gae       # or --part score
    .venv/bin/python bench/gpu.py --attn flex_attention

Needs a CUDA device (CI does not run it); without one it says so and exits 0.

Part 1, GAE (float32 data with an interior mask): the Triton kernel
(``backend="triton"``, float32 and float64 carries, a sweep of segments per
row) and the torch chunk-scan (chunk 128, float32 and float64 carries)
against a device copy of the same bytes (read rewards, values and mask,
write advantages and returns: 17 bytes per token). Prints milliseconds, the
bandwidth and the ratio to the copy's (target: >= 0.5 at B=256 x T=131072),
and the error against the float64 reference on a few rows.

Part 2, scoring (a Qwen2.5-0.5B-shaped model with random bf16 weights, built
from its config: nothing is downloaded; 512 GRPO-like samples, prompt
U[100, 300], completion lognormal median 600 clipped to [8, 4096]): tokens/s
for fixed mbs, token quota, packed, and the no-padding ideal (rows of 1024
random tokens filling the same token budget, forward + fp32 log-softmax in
row chunks), each with the fraction of the GPU's bf16 dense peak and of the
ideal. Packed and unpacked bf16 log-probs are compared with an fp32
reference on a subset (max and mean |diff|).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

#: dense bf16 tensor-core peaks (TFLOP/s) by device-name fragment; --peak-tflops overrides
BF16_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "4090": 165.0}


def _timed(fn, repeat: int) -> float:
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


# ------------------------------------------------------------------------------------------------ GAE

def gae_part(args) -> None:
    import torch

    from pdsr_sdk.gae import compute_gae
    from pdsr_sdk.gae.reference import reference_gae
    from pdsr_sdk.gae.triton_kernel import triton_gae

    print("GAE (float32 data, interior mask ~0.9 valid, gamma 1.0, lam 0.95)")
    for rows, steps in args.gae_shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        r = torch.randn(rows, steps, device="cuda", generator=gen)
        v = torch.randn(rows, steps, device="cuda", generator=gen)
        m = torch.rand(rows, steps, device="cuda", generator=gen) < 0.9
        adv, ret = torch.empty_like(r), torch.empty_like(r)
        moved = rows * steps * (4 + 4 + 1 + 4 + 4)   # bytes read + written
        src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy_ms = _timed(lambda: dst.copy_(src), args.repeat)
        copy_bw = moved / (copy_ms * 1e-3)
        print(f"\n  B={rows} x T={steps}: {moved / 2**20:.0f} MiB moved; device copy of the same bytes "
              f"{copy_ms:.3f} ms ({copy_bw / 1e9:,.0f} GB/s)")
        cases = []
        for carry in ("float32", "float64"):
            for segs in (None, 1, 2, 4, 8):
                label = f"triton carry {carry}, segments {'auto' if segs is None else segs}"
                cases.append((label, lambda c=carry, s=segs: triton_gae(r, v, m, 1.0, 0.95, carry_dtype=c,
                                                                         out=(adv, ret), segments=s)))
        for carry in ("float32", "float64"):
            cases.append((f"torch chunk-scan 128, carry {carry}",
                          lambda c=carry: compute_gae(r, v, m, 1.0, 0.95, backend="torch", chunk_size=128,
                                                      carry_dtype=c, out=(adv, ret))))
        check_rows = min(rows, 4)
        ref_adv, _ = reference_gae(r[:check_rows].cpu().numpy(), v[:check_rows].cpu().numpy(),
                                   m[:check_rows].cpu().numpy(), 1.0, 0.95)
        print(f"    {'kernel':<38} {'ms':>8} {'GB/s':>8} {'vs copy':>8} {'max err (first rows)':>21}")
        for label, fn in cases:
            ms = _timed(fn, args.repeat)
            fn()
            torch.cuda.synchronize()
            err = float(np.abs(adv[:check_rows].double().cpu().numpy() - ref_adv).max())
            print(f"    {label:<38} {ms:>8.3f} {moved / (ms * 1e-3) / 1e9:>8,.0f} {copy_ms / ms:>8.2f} {err:>21.2e}")


# -------------------------------------------------------------------------------------------- scoring

def qwen_like_model(attn: str, dtype):
    """Qwen2.5-0.5B's shape (494M parameters) with random weights, on the GPU."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                      rope_theta=1e6, tie_word_embeddings=True, rms_norm_eps=1e-6)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def flops_per_token(model, mean_context: float) -> float:
    """2 x matmul parameters (the lm_head once, the input embedding not) + causal attention (QK^T and AV)."""
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    matmul = params - cfg.vocab_size * cfg.hidden_size * (0 if cfg.tie_word_embeddings else 1)
    return 2.0 * matmul + 2.0 * 2.0 * cfg.num_hidden_layers * cfg.hidden_size * mean_context / 2.0


def score_part(args) -> None:
    import torch

    from pdsr_sdk.scoring import per_token_logps
    from pdsr_sdk.scoring.logprob_kernel import chunked_token_logps
    from pdsr_sdk.scoring.torch_backend import Parts, _last_hidden

    name = torch.cuda.get_device_name()
    peak = args.peak_tflops or next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)
    model = qwen_like_model(args.attn, torch.bfloat16)
    rng = np.random.default_rng(0)
    p_len = rng.integers(100, 301, args.samples)
    c_len = np.clip(rng.lognormal(np.log(600), 1.0, args.samples), 8, 4096).astype(np.int64)
    vocab = model.config.vocab_size
    prompts = [rng.integers(0, vocab, int(k)) for k in p_len]
    completions = [rng.integers(0, vocab, int(k)) for k in c_len]
    total = p_len + c_len
    mean_ctx = float((total ** 2).sum() / total.sum())   # token-weighted mean context
    fpt = flops_per_token(model, mean_ctx)
    print(f"\nscoring: {name}, attention {args.attn}; Qwen2.5-0.5B-shaped random bf16 model; {args.samples} samples, "
          f"{int(total.sum()):,} tokens; {fpt / 1e9:.2f} GFLOP/token; bf16 peak "
          f"{'unknown (pass --peak-tflops)' if peak is None else f'{peak:g} TFLOP/s'}")

    def ideal(budget: int) -> float:
        """Tokens/s of rows of 1024 tokens filling the budget: forward + fp32 log-softmax, no padding."""
        rows = max(1, budget // 1024)
        ids = torch.randint(0, vocab, (rows, 1024), device="cuda")
        parts = Parts(model.get_decoder(), model.get_output_embeddings(), "")

        def step():
            with torch.inference_mode():
                hidden = _last_hidden(parts.decoder(input_ids=ids, use_cache=False, return_dict=True))
                chunked_token_logps(hidden[:, :-1].reshape(-1, hidden.shape[-1]), ids[:, 1:].reshape(-1),
                                    parts.head, row_chunk=512)
        n_steps = max(1, int(total.sum()) // (rows * 1024))
        step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n_steps):
            step()
        torch.cuda.synchronize()
        return n_steps * rows * 1024 / (time.perf_counter() - t0)

    modes = [("fixed mbs=32", dict(mbs=32), None), ("fixed mbs=8", dict(mbs=8), None)]
    for budget in args.budgets:
        modes += [(f"token quota {budget}", dict(max_tokens_per_micro_batch=budget, attention_mask=False), budget),
                  (f"packed, quota {budget}", dict(max_tokens_per_micro_batch=budget, pack=True), budget)]
    per_token_logps(model, prompts[:8], completions[:8], mbs=8)   # warm-up
    ideals = {b: ideal(b) for b in args.budgets}
    print(f"  {'mode':<28} {'tokens/s':>10} {'of peak':>8} {'of ideal':>9} {'efficiency':>10} {'micro-batches':>13}")
    for budget, tps in ideals.items():
        frac = "" if peak is None else f"{tps * fpt / (peak * 1e12):.3f}"
        print(f"  {f'ideal 1024-rows, {budget}':<28} {tps:>10,.0f} {frac:>8} {'1.000':>9} {'1.000':>10}")
    for label, kw, budget in modes:
        try:
            res = per_token_logps(model, prompts, completions, **kw)
        except Exception as exc:  # noqa: BLE001 - an out-of-memory mode should not hide the others
            print(f"  {label:<28} failed: {type(exc).__name__}: {str(exc)[:120]}")
            torch.cuda.empty_cache()
            continue
        st = res.stats
        frac = "" if peak is None else f"{st.tokens_per_s * fpt / (peak * 1e12):.3f}"
        of_ideal = f"{st.tokens_per_s / ideals[budget]:.3f}" if budget in ideals else ""
        print(f"  {label:<28} {st.tokens_per_s:>10,.0f} {frac:>8} {of_ideal:>9} {st.padding_efficiency:>10.3f} "
              f"{st.micro_batches:>13}")

    # accuracy: bf16 packed and unpacked against an fp32 reference (the same weights, upcast) on a subset
    n = min(args.samples, 32)
    sub = (prompts[:n], completions[:n])
    budget = args.budgets[0]
    bf16_packed = per_token_logps(model, *sub, max_tokens_per_micro_batch=budget, pack=True).logps
    bf16_padded = per_token_logps(model, *sub, max_tokens_per_micro_batch=budget, pack=False).logps
    ref = per_token_logps(model.float(), *sub, max_tokens_per_micro_batch=budget, pack=False).logps
    for label, got in (("bf16 packed", bf16_packed), ("bf16 unpacked", bf16_padded)):
        diff = np.concatenate([np.abs(a - b) for a, b in zip(got, ref)])
        print(f"  {label} vs fp32 reference ({n} samples, {diff.size:,} tokens): max |diff| {diff.max():.3g}, "
              f"mean {diff.mean():.3g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["all", "gae", "score"], default="all")
    ap.add_argument("--repeat", type=int, default=20, help="timed repeats per GAE kernel (median shown)")
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--budgets", type=int, nargs="+", default=[16384, 65536], help="token budgets per micro-batch")
    ap.add_argument("--attn", default="sdpa", help="attention implementation: sdpa, flex_attention, "
                                                   "flash_attention_2 (if installed), eager")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak in TFLOP/s")
    args = ap.parse_args()
    args.gae_shapes = [(256, 131072), (128, 65536)]
    try:
        import torch
    except ImportError:
        print("bench/gpu.py: torch is not installed; nothing to measure")
        return
    if not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device here; these measurements need a GPU (CI does not run them)")
        return
    if args.part in ("all", "gae"):
        gae_part(args)
    if args.part in ("all", "score"):
        score_part(args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
