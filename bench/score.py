"""Benchmark of `pdsr score` micro-batching on a GRPO-like length distribution.

    .venv/bin/python bench/score.py                 # tiny model, ~1-2 minutes on 2 cores
    .venv/bin/python bench/score.py --model DIR     # any local HF causal LM

Part 1 (one run, same data, same model): tokens/s and padding efficiency
(real tokens / tokens computed, padding and dummy rows included) for one
forward over everything (if its estimated memory fits --single-limit-gib),
fixed micro-batches of --mbs in input order (tail padded to mbs rows),
token-quota micro-batches (--max-tokens, grouped by length, original order
restored), and packed micro-batches of the same token budget (pdsr's per-sample
attention, and the model's own with transformers' packed mask; one row of
concatenated samples each, no padding). Plans for every mode are also shown without running them.
Targets: token quota >= 0.9 padding efficiency and >= 1.5x the tokens/s of
fixed mbs.

Part 2: peak memory of the log-prob step alone (hidden states -> per-token
log-probs) with a random lm_head of --vocab entries, chunked vs naive full
logits (``log_softmax(lm_head(hidden).float())`` then gather). Method: the
process's resident-set high-water mark (Linux VmHWM, reset through
/proc/self/clear_refs, after malloc_trim) minus the RSS before the step;
inputs and weights exist before, and each case runs once untimed first, so
only the step's own buffers count.
Buffers of 1 MiB or more are mmapped (mallopt M_MMAP_THRESHOLD) in this
process so that memory freed by earlier steps cannot hide in the heap, and
part 2 runs in a fresh process (the model runs leave allocator state behind).
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_args import at_least, check_model_dir, number_at_least


def grpo_lengths(n: int, seed: int, completion_median: float, sigma: float, clip: tuple[int, int]):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(100, 301, n)
    completion = np.clip(rng.lognormal(np.log(completion_median), sigma, n), *clip).astype(np.int64)
    return prompt, completion


def single_forward_gib(n: int, seq_len: int, hidden: int, layers_live: int = 6) -> float:
    """Rough memory of one padded forward: a [n, 1, T, T] mask, SDPA scores of one layer, activations."""
    mask = n * seq_len * seq_len  # bool
    scores = n * 4 * seq_len * seq_len * 4  # one layer's fp32 attention scores (math path with a mask)
    acts = layers_live * n * seq_len * hidden * 4 * 2
    return (mask + scores + acts) / 2**30


def _mmap_large_buffers() -> None:
    """Serve allocations >= 1 MiB by mmap (glibc), so RSS follows live tensors: freed buffers leave at once."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def main() -> None:
    from pdsr_sdk.scoring.checkpoint import DTYPES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="local HF causal LM directory (default: the built-in tiny model)")
    ap.add_argument("--samples", type=at_least(1), default=512, help="samples scored")
    ap.add_argument("--completion-median", type=number_at_least(1), default=150.0,
                    help="median completion length (lognormal)")
    ap.add_argument("--sigma", type=number_at_least(0), default=1.0, help="lognormal sigma of completion lengths")
    ap.add_argument("--max-completion", type=at_least(8), default=1024, help="completion length cap")
    ap.add_argument("--mbs", type=at_least(1), default=32, help="rows of a fixed micro-batch")
    ap.add_argument("--max-tokens", type=at_least(1), default=8192, help="token quota per micro-batch")
    ap.add_argument("--length-bucket", type=at_least(1), default=64, help="rows are padded to a multiple of this")
    ap.add_argument("--single-limit-gib", type=number_at_least(0), default=4.0,
                    help="run the one-forward mode only if its estimated memory is below this")
    ap.add_argument("--dtype", choices=DTYPES, default="float32", help="the model's weights")
    ap.add_argument("--threads", type=at_least(1), default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--no-attention-mask", action="store_true",
                    help="run without the padding mask (exact for causal LMs; SDPA's causal kernel)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the samples' lengths and tokens")
    ap.add_argument("--repeat", type=at_least(1), default=1,
                    help="runs of token quota and packed, interleaved; the best of each is shown")
    ap.add_argument("--vocab", type=at_least(2), default=32768, help="vocab of the random lm_head in part 2")
    ap.add_argument("--mem-tokens", type=at_least(4), default=4096,
                    help="completion positions in part 2 (and a quarter)")
    ap.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hidden", type=int, default=256, help=argparse.SUPPRESS)
    args = ap.parse_args()
    check_model_dir(ap, args.model)
    if args.max_tokens < 300 + args.max_completion:   # the longest sample must fit one micro-batch
        ap.error(f"argument --max-tokens: {args.max_tokens} is below the longest sample (prompts up to 300 tokens "
                 f"+ --max-completion {args.max_completion})")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_only:
        memory_part(args.hidden, args.vocab, args.mem_tokens)
        return
    from pdsr_sdk.models.tiny import ensure_tiny_model
    from pdsr_sdk.scoring import per_token_logps
    from pdsr_sdk.scoring.buckets import plan_fixed, plan_single, plan_stats, plan_token_quota
    from pdsr_sdk.scoring.memory import format_bytes
    from pdsr_sdk.scoring.torch_backend import load_model, model_vocab_size

    model_dir = args.model or ensure_tiny_model()
    model = load_model(model_dir, "cpu", args.dtype)
    vocab = model_vocab_size(model)
    hidden_size = int(model.config.hidden_size)
    print(f"model: {'built-in tiny model' if args.model is None else model_dir} ({args.dtype}, vocab {vocab}, "
          f"hidden {hidden_size}); torch threads {torch.get_num_threads()}")

    p_len, c_len = grpo_lengths(args.samples, args.seed, args.completion_median, args.sigma, (8, args.max_completion))
    rng = np.random.default_rng(args.seed + 1)
    prompts = [rng.integers(0, vocab, int(k)) for k in p_len]
    completions = [rng.integers(0, vocab, int(k)) for k in c_len]
    total = p_len + c_len
    q = np.percentile(total, [50, 90, 99])
    print(f"data: {args.samples} samples, prompt U[100, 300], completion lognormal(median {args.completion_median:g}, "
          f"sigma {args.sigma:g}) clipped to [8, {args.max_completion}]; prompt+completion p50 {q[0]:.0f}, "
          f"p90 {q[1]:.0f}, p99 {q[2]:.0f}, max {total.max()}, {total.sum():,} tokens")

    # ---------------------------------------------------------------- plans
    b = args.length_bucket
    plans = {
        "single forward": plan_single(total, length_bucket=b),
        f"fixed mbs={args.mbs}": plan_fixed(total, args.mbs, length_bucket=b),
        f"token quota {args.max_tokens}": plan_token_quota(total, args.max_tokens, length_bucket=b)[0],
        f"token quota {args.max_tokens}, global KK (verl rule)":
            plan_token_quota(total, args.max_tokens, length_bucket=b, grouping="none")[0],
    }
    print("\nplans (no model run): padding efficiency = real tokens / computed tokens")
    print(f"  {'mode':<44} {'micro-batches':>13} {'shapes':>7} {'computed':>11} {'efficiency':>10}")
    for name, plan in plans.items():
        st = plan_stats(plan)
        print(f"  {name:<44} {st['micro_batches']:>13} {st['distinct_shapes']:>7} {st['computed_tokens']:>11,} "
              f"{total.sum() / st['computed_tokens']:>10.3f}")

    # ----------------------------------------------------------------- runs
    common = dict(attention_mask=not args.no_attention_mask, length_bucket=b)
    per_token_logps(model, prompts[:4], completions[:4], mbs=4, **common)  # warm-up (allocator, kernels)
    runs = {}
    seq_len = plans["single forward"][0].seq_len
    est = single_forward_gib(args.samples, seq_len, hidden_size)
    if est <= args.single_limit_gib:
        runs["single forward"] = per_token_logps(model, prompts, completions, **common)
    else:
        print(f"\nsingle forward: not run, one padded forward of {args.samples} x {seq_len} needs about "
              f"{est:.0f} GiB (mask, attention scores, activations) > --single-limit-gib {args.single_limit_gib:g}")
    runs[f"fixed mbs={args.mbs}"] = per_token_logps(model, prompts, completions, mbs=args.mbs, **common)
    runs[f"token quota {args.max_tokens}"] = per_token_logps(model, prompts, completions,
                                                             max_tokens_per_micro_batch=args.max_tokens, **common)
    packed_modes = ((f"packed, quota {args.max_tokens}", dict(pack=True)),
                    (f"packed, model's mask, {args.max_tokens}", dict(pack=True, packed_attention="model")))
    for name, kw in packed_modes:
        runs[name] = per_token_logps(model, prompts, completions, max_tokens_per_micro_batch=args.max_tokens, **kw)
    for _ in range(args.repeat - 1):   # interleaved repeats; the best of each mode is kept (shared machines)
        for name, kw in ((f"token quota {args.max_tokens}", dict(**common)), *packed_modes):
            again = per_token_logps(model, prompts, completions, max_tokens_per_micro_batch=args.max_tokens, **kw)
            if again.stats.seconds < runs[name].stats.seconds:
                runs[name] = again
    print(f"\nruns (torch backend, chunked fp32 log-softmax, attention mask "
          f"{'off' if args.no_attention_mask else 'on'}):")
    print(f"  {'mode':<28} {'tokens/s':>9} {'seconds':>8} {'efficiency':>10} {'micro-batches':>13} {'shapes':>7} "
          f"{'peak RSS growth':>15}")
    for name, res in runs.items():
        st = res.stats
        print(f"  {name:<28} {st.tokens_per_s:>9,.0f} {st.seconds:>8.1f} {st.padding_efficiency:>10.3f} "
              f"{st.micro_batches:>13} {st.distinct_shapes:>7} {format_bytes(st.peak_memory_bytes):>15}")
    fixed, quota = runs[f"fixed mbs={args.mbs}"], runs[f"token quota {args.max_tokens}"]
    ratio = quota.stats.tokens_per_s / fixed.stats.tokens_per_s
    worst = max(float(np.max(np.abs(a - b_) / np.maximum(1, np.abs(b_))))
                for a, b_ in zip(quota.logps, fixed.logps))
    print(f"\ntoken quota vs fixed mbs: {ratio:.2f}x tokens/s (target >= 1.5x); padding efficiency "
          f"{quota.stats.padding_efficiency:.3f} (target >= 0.9); results agree to {worst:.1e} (relative)")
    for name, _ in packed_modes:
        packed = runs[name]
        worst = max(float(np.max(np.abs(a - b_) / np.maximum(1, np.abs(b_))))
                    for a, b_ in zip(packed.logps, quota.logps))
        print(f"{name} vs token quota (same budget): {packed.stats.tokens_per_s / quota.stats.tokens_per_s:.2f}x "
              f"tokens/s, padding efficiency {packed.stats.padding_efficiency:.3f}; results agree to {worst:.1e} "
              f"(relative; {packed.stats.head})")

    # --------------------------------------------------------------- memory
    # in a fresh process: the model runs above leave allocator state that blurs RSS deltas
    import subprocess
    import sys

    sys.stdout.flush()
    subprocess.run([sys.executable, __file__, "--memory-only", "--vocab", str(args.vocab), "--mem-tokens",
                    str(args.mem_tokens), "--hidden", str(hidden_size)]
                   + (["--threads", str(args.threads)] if args.threads else []), check=True)


def memory_part(hidden_size: int, vocab: int, mem_tokens: int) -> None:
    import torch

    from pdsr_sdk.scoring.logprob_kernel import chunked_token_logps
    from pdsr_sdk.scoring.memory import PeakMemory, format_bytes

    _mmap_large_buffers()
    print(f"\nlog-prob step memory (fresh process): random lm_head {hidden_size} -> {vocab} (fp32); peak RSS "
          f"growth of the step alone")
    torch.manual_seed(0)
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    unit = vocab * 4  # bytes of one fp32 row of logits
    print(f"  {'positions':>9}  {'method':<26} {'peak':>10}  {'reference size':<36} {'max |diff| vs naive':>19}")
    with torch.inference_mode():
        for n_tok in (mem_tokens // 4, mem_tokens):
            hid = torch.randn(n_tok, hidden_size)
            targets = torch.randint(0, vocab, (n_tok,))
            cases = [("naive full logits",
                      lambda: torch.log_softmax(head(hid).float(), -1).gather(-1, targets[:, None])[:, 0],
                      f"2 x tokens x vocab x 4 B = {format_bytes(2 * n_tok * unit)}")]
            for rc in (256, 1024):
                cases.append((f"chunked row_chunk={rc}",
                              lambda rc=rc: chunked_token_logps(hid, targets, head, row_chunk=rc)[0],
                              f"row_chunk x vocab x 4 B = {format_bytes(rc * unit)}"))
            cases.append(("chunked 1024 + entropy",
                          lambda: chunked_token_logps(hid, targets, head, row_chunk=1024, return_entropy=True)[0],
                          f"2 x row_chunk x vocab x 4 B = {format_bytes(2 * 1024 * unit)}"))
            ref = None
            for name, fn, size in cases:
                fn()  # warm-up: one-time kernel buffers are not the step's memory
                with PeakMemory("cpu") as mem:
                    out = fn()
                ref = out if ref is None else ref
                print(f"  {n_tok:>9}  {name:<26} {format_bytes(mem.bytes):>10}  {size:<36} "
                      f"{float((out - ref).abs().max()):>19.1e}")
                del out
            hid = targets = ref = None  # frees them (the lambdas read these names, so no `del`)


if __name__ == "__main__":
    main()
