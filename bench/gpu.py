"""GPU measurements of issue 16: the fused GAE kernel and packed scoring.

    .venv/bin/python bench/gpu.py                  # both parts
    .venv/bin/python bench/gpu.py --part gae       # or --part score
    .venv/bin/python bench/gpu.py --attn flex_attention
    .venv/bin/python bench/gpu.py --part gae --gae-sweep   # + the kernel's tile x warps x prefetch
    .venv/bin/python bench/gpu.py --json out/gpu.json   # also the numbers as JSON, rewritten as they come

Needs a CUDA device (CI does not run it); without one it says so (and writes that to --json) and exits 0.
``scripts/gpu_check.sh`` runs it, part by part, with the CUDA tests and bench/verify_cost.py.

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
for fixed mbs, token quota, packed (pdsr's varlen attention, and the model's
own attention with transformers' packed mask), and the no-padding ideal, each with the
fraction of the GPU's bf16 dense peak (MFU, from the FLOPs per token at the
samples' token-weighted mean context) and of the ideal. The ideal: equal-length
rows of 1024 random tokens with no padding at all (no mask, no dummy rows),
as many as fill the same token budget per forward, through the decoder +
the fp32 log-softmax over the lm_head in 4096-row chunks (the measurement of
docs/benchmarks.md: about 220k tokens/s on an H100 at 16 x 1024). Targets:
packed >= 0.9 of the ideal. Packed and unpacked bf16 log-probs are compared with an fp32
reference on a subset (max and mean |diff|).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from bench_args import at_least, number_at_least
from verify_cost import timed_ms   # a sibling script (bench/ is on the path when it runs)

#: dense bf16 tensor-core peaks (TFLOP/s) by device-name fragment; --peak-tflops overrides
BF16_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "4090": 165.0}


class Results:
    """The numbers as JSON: rewritten to ``path`` after every measurement, so a run cut off by a timeout
    keeps what it had measured."""

    def __init__(self, path: str | None):
        self.path = path
        self.data: dict = {"script": "bench/gpu.py", "complete": False}

    def write(self) -> None:
        if not self.path:
            return
        import json
        import os

        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.path)

# ------------------------------------------------------------------------------------------------ GAE

def gae_part(args, results: Results) -> None:
    import torch

    from pdsr_sdk.gae import compute_gae
    from pdsr_sdk.gae.reference import reference_gae
    from pdsr_sdk.gae.triton_kernel import triton_gae

    print("GAE (float32 data, interior mask ~0.9 valid, gamma 1.0, lam 0.95)")
    out = results.data.setdefault("gae", {"data": "float32 + bool mask (~0.9 valid), gamma 1.0, lam 0.95",
                                          "bytes_per_token": 17, "target_vs_copy": 0.5, "shapes": []})
    for rows, steps in args.gae_shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        r = torch.randn(rows, steps, device="cuda", generator=gen)
        v = torch.randn(rows, steps, device="cuda", generator=gen)
        m = torch.rand(rows, steps, device="cuda", generator=gen) < 0.9
        adv, ret = torch.empty_like(r), torch.empty_like(r)
        moved = rows * steps * (4 + 4 + 1 + 4 + 4)   # bytes read + written
        src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy_ms = timed_ms(lambda: dst.copy_(src), args.repeat)
        copy_bw = moved / (copy_ms * 1e-3)
        print(f"\n  B={rows} x T={steps}: {moved / 2**20:.0f} MiB moved; device copy of the same bytes "
              f"{copy_ms:.3f} ms ({copy_bw / 1e9:,.0f} GB/s)")
        shape = {"rows": rows, "steps": steps, "bytes_moved": moved, "copy_ms": copy_ms,
                 "copy_gb_s": copy_bw / 1e9, "kernels": []}
        out["shapes"].append(shape)
        results.write()
        cases = []
        for carry in ("float32", "float64"):
            for segs in (None, 1, 2, 4, 8):
                label = f"triton carry {carry}, segments {'auto' if segs is None else segs}"
                cases.append((label, lambda c=carry, s=segs: triton_gae(r, v, m, 1.0, 0.95, carry_dtype=c,
                                                                         out=(adv, ret), segments=s)))
        if args.gae_sweep and (rows, steps) == tuple(args.gae_shapes[0]):
            # the kernel's launch shape on the target case: tile length x warps x prefetching the next tile
            for prefetch in (False, True):
                for block in (1024, 2048, 4096):
                    for warps in (4, 8, 16):
                        cases.append((f"triton f32, block {block}, warps {warps}, prefetch {int(prefetch)}",
                                      lambda b=block, nw=warps, p=prefetch: triton_gae(
                                          r, v, m, 1.0, 0.95, carry_dtype="float32", out=(adv, ret), block=b,
                                          num_warps=nw, prefetch=p)))
        for carry in ("float32", "float64"):
            cases.append((f"torch chunk-scan 128, carry {carry}",
                          lambda c=carry: compute_gae(r, v, m, 1.0, 0.95, backend="torch", chunk_size=128,
                                                      carry_dtype=c, out=(adv, ret))))
        check_rows = min(rows, 4)
        ref_adv, _ = reference_gae(r[:check_rows].cpu().numpy(), v[:check_rows].cpu().numpy(),
                                   m[:check_rows].cpu().numpy(), 1.0, 0.95)
        print(f"    {'kernel':<44} {'ms':>8} {'GB/s':>8} {'vs copy':>8} {'max err (first rows)':>21}")
        for label, fn in cases:
            try:
                ms = timed_ms(fn, args.repeat)
                fn()
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - one failing kernel should not hide the others
                print(f"    {label:<44} failed: {type(exc).__name__}: {str(exc)[:120]}")
                shape["kernels"].append({"kernel": label, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
                results.write()
                continue
            err = float(np.abs(adv[:check_rows].double().cpu().numpy() - ref_adv).max())
            print(f"    {label:<44} {ms:>8.3f} {moved / (ms * 1e-3) / 1e9:>8,.0f} {copy_ms / ms:>8.2f} {err:>21.2e}")
            shape["kernels"].append({"kernel": label, "ms": ms, "gb_s": moved / (ms * 1e-3) / 1e9,
                                     "vs_copy": copy_ms / ms, "max_err_first_rows": err})
            results.write()


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


def score_part(args, results: Results) -> None:
    import torch

    from pdsr_sdk.scoring import per_token_logps
    from pdsr_sdk.scoring.logprob_kernel import chunked_token_logps
    from pdsr_sdk.scoring.hf_model import Parts, last_hidden

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
    out = results.data.setdefault("scoring", {
        "device": name, "attention": args.attn, "model": "Qwen2.5-0.5B-shaped, random bf16 weights",
        "samples": args.samples, "tokens": int(total.sum()), "gflop_per_token": fpt / 1e9,
        "bf16_peak_tflops": peak, "target_packed_vs_ideal": 0.9,
        "ideal": "equal-length rows of 1024 tokens, no padding, filling the budget; decoder forward + fp32 "
                 "log-softmax over the lm_head in 4096-row chunks",
        "ideals": [], "modes": [], "accuracy": []})
    results.write()

    def mfu(tps: float) -> float | None:
        return None if peak is None else tps * fpt / (peak * 1e12)

    def ideal(budget: int) -> float:
        """Tokens/s of rows of 1024 tokens filling the budget: forward + fp32 log-softmax, no padding.
        The no-padding ideal the modes are measured against (see the module's docstring)."""
        rows = max(1, budget // 1024)
        ids = torch.randint(0, vocab, (rows, 1024), device="cuda")
        parts = Parts(model.get_decoder(), model.get_output_embeddings(), "")

        def step():
            with torch.inference_mode():
                hidden = last_hidden(parts.decoder(input_ids=ids, use_cache=False, return_dict=True))
                chunked_token_logps(hidden[:, :-1].reshape(-1, hidden.shape[-1]), ids[:, 1:].reshape(-1),
                                    parts.head, row_chunk=4096)
        n_steps = max(1, int(total.sum()) // (rows * 1024))
        step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n_steps):
            step()
        torch.cuda.synchronize()
        return n_steps * rows * 1024 / (time.perf_counter() - t0)

    # the budgets' modes first (packed against the ideal is the target), fixed mbs last: a run cut off by a
    # timeout loses the least telling numbers
    modes = []
    for budget in args.budgets:
        modes += [(f"token quota {budget}", dict(max_tokens_per_micro_batch=budget, attention_mask=False), budget),
                  (f"packed varlen, quota {budget}", dict(max_tokens_per_micro_batch=budget, pack=True), budget),
                  (f"packed {args.attn} mask, {budget}",
                   dict(max_tokens_per_micro_batch=budget, pack=True, packed_attention="model"), budget)]
    modes += [(f"fixed mbs={mbs}", dict(mbs=mbs), None) for mbs in args.fixed_mbs]
    per_token_logps(model, prompts[:8], completions[:8], mbs=8)   # warm-up
    ideals = {}
    print(f"  {'mode':<28} {'tokens/s':>10} {'of peak':>8} {'of ideal':>9} {'efficiency':>10} {'micro-batches':>13}")
    for budget in args.budgets:
        ideals[budget] = tps = ideal(budget)
        frac = "" if peak is None else f"{mfu(tps):.3f}"
        print(f"  {f'ideal 1024-rows, {budget}':<28} {tps:>10,.0f} {frac:>8} {'1.000':>9} {'1.000':>10}")
        out["ideals"].append({"budget": budget, "rows": max(1, budget // 1024), "row_tokens": 1024,
                              "tokens_per_s": tps, "mfu": mfu(tps)})
        results.write()
    for label, kw, budget in modes:
        try:
            # a trainer scores every step: time the second call, past the allocator's growth and the
            # first choice of kernels for these shapes (the first call is 1.7-1.9x slower on an H100)
            per_token_logps(model, prompts, completions, **kw)
            res = per_token_logps(model, prompts, completions, **kw)
        except Exception as exc:  # noqa: BLE001 - an out-of-memory mode should not hide the others
            print(f"  {label:<28} failed: {type(exc).__name__}: {str(exc)[:120]}")
            out["modes"].append({"mode": label, "options": kw, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
            results.write()
            torch.cuda.empty_cache()
            continue
        st = res.stats
        frac = "" if peak is None else f"{mfu(st.tokens_per_s):.3f}"
        of_ideal = f"{st.tokens_per_s / ideals[budget]:.3f}" if budget in ideals else ""
        print(f"  {label:<28} {st.tokens_per_s:>10,.0f} {frac:>8} {of_ideal:>9} {st.padding_efficiency:>10.3f} "
              f"{st.micro_batches:>13}")
        out["modes"].append({"mode": label, "options": kw, "tokens_per_s": st.tokens_per_s,
                             "mfu": mfu(st.tokens_per_s),
                             "vs_ideal": st.tokens_per_s / ideals[budget] if budget in ideals else None,
                             "padding_efficiency": st.padding_efficiency, "micro_batches": st.micro_batches})
        results.write()

    # accuracy: bf16 packed and unpacked against an fp32 reference (the same weights, upcast) on a subset
    n = min(args.samples, 32)
    sub = (prompts[:n], completions[:n])
    budget = args.budgets[0]
    cases = [("bf16 packed varlen", dict(pack=True)), (f"bf16 packed {args.attn} mask",
                                                        dict(pack=True, packed_attention="model")),
             ("bf16 unpacked", dict(pack=False))]
    got_by_case = [(label, per_token_logps(model, *sub, max_tokens_per_micro_batch=budget, **kw).logps)
                   for label, kw in cases]
    ref = per_token_logps(model.float(), *sub, max_tokens_per_micro_batch=budget, pack=False).logps
    for label, got in got_by_case:
        diff = np.concatenate([np.abs(a - b) for a, b in zip(got, ref)])
        print(f"  {label} vs fp32 reference ({n} samples, {diff.size:,} tokens): max |diff| {diff.max():.3g}, "
              f"mean {diff.mean():.3g}")
        out["accuracy"].append({"case": f"{label} vs fp32 reference", "samples": n, "tokens": int(diff.size),
                                "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean())})
    results.write()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["all", "gae", "score"], default="all", help="which measurement to run")
    ap.add_argument("--repeat", type=at_least(1), default=20, help="timed repeats per GAE kernel (median shown)")
    ap.add_argument("--samples", type=at_least(1), default=512, help="samples scored")
    ap.add_argument("--budgets", type=at_least(1), nargs="+", default=[16384, 65536],
                    help="token budgets per micro-batch")
    ap.add_argument("--gae-sweep", action="store_true",
                    help="also sweep the GAE kernel's tile length x warps x prefetch on the first shape")
    ap.add_argument("--fixed-mbs", type=at_least(1), nargs="*", default=[32, 8], metavar="MBS",
                    help="fixed micro-batch sizes to score with too (none: only the token budgets' modes)")
    ap.add_argument("--attn", default="sdpa", help="attention implementation: sdpa, flex_attention, "
                                                   "flash_attention_2 (if installed), eager")
    ap.add_argument("--peak-tflops", type=number_at_least(0.001), default=None,
                    help="the GPU's dense bf16 peak in TFLOP/s")
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="also write the numbers as JSON to PATH (rewritten after each measurement)")
    args = ap.parse_args()
    args.gae_shapes = [(256, 131072), (128, 65536)]
    results = Results(args.json)
    results.data["part"] = args.part
    try:
        import torch
    except ImportError:
        print("bench/gpu.py: torch is not installed; nothing to measure")
        results.data.update(skipped="torch is not installed", complete=True)
        results.write()
        return
    if not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device here; these measurements need a GPU (CI does not run them)")
        results.data.update(skipped="no CUDA device", complete=True)
        results.write()
        return
    results.data.update(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda)
    results.write()
    if args.part in ("all", "gae"):
        gae_part(args, results)
    if args.part in ("all", "score"):
        score_part(args, results)
    results.data["complete"] = True
    results.write()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
