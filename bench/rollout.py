"""Length-controlled replay of a trace through every policy on the same real vLLM engines.

Every request generates exactly its recorded length (``ignore_eos`` and a
per-sample max), so the policies differ only in where and when work runs.
Two CPU engines (fast-0 on core 0, heavy-0 on core 1) are started once and
shared by all policies; a warm-up batch runs first. Prints makespan,
tokens/s and the ratio to baseline per policy, measured in one run.

    python bench/rollout.py                       # synthetic trace, tiny model
    python bench/rollout.py --trace lengths.jsonl --model DIR --batch-size 16
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", help="length trace (JSONL or trajectories Parquet); default: a synthetic one")
    p.add_argument("--groups", type=int, default=32, help="synthetic trace: prompt groups")
    p.add_argument("--n", type=int, default=8, help="synthetic trace: samples per group")
    p.add_argument("--median-length", type=float, default=120.0, help="synthetic trace: median length")
    p.add_argument("--max-length", type=int, default=1024, help="synthetic trace: max length")
    p.add_argument("--runaway-frac", type=float, default=0.003, help="synthetic trace: share of samples that run to max length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16, help="prompts per batch")
    p.add_argument("--policies", default="baseline,baseline-noseg,v1,v2,v2.5,lpt",
                   help="policies to run; NAME-noseg runs NAME without dynamic segments")
    p.add_argument("--model", help="model directory (default: the built-in tiny model)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--fast-kv-gib", type=float, default=None, help="KV cache of the fast engine (CPU build, GiB)")
    p.add_argument("--heavy-kv-gib", type=float, default=None, help="KV cache of the heavy engine (CPU build, GiB)")
    p.add_argument("--repeats", type=int, default=1, help="runs per policy (median reported)")
    return p.parse_args()


async def main_async(args) -> None:
    from pdsr_sdk.config import load_config
    from pdsr_sdk.engines.vllm_engine import VllmEngine
    from pdsr_sdk.models.tiny import ensure_tiny_model
    from pdsr_sdk.rollout.config import EngineSpec, RolloutConfig
    from pdsr_sdk.rollout.data import load_tokenizer
    from pdsr_sdk.rollout.replay import write_replay_prompts
    from pdsr_sdk.rollout.run import run_rollout_async
    from pdsr_sdk.traces import read_trace, synth_trace

    model = args.model or str(ensure_tiny_model())
    trace = read_trace(args.trace) if args.trace else synth_trace(
        groups=args.groups, n=args.n, seed=args.seed, median_length=args.median_length,
        max_length=args.max_length, runaway_frac=args.runaway_frac, prompt_len_min=20, prompt_len_max=120)
    n = trace.samples_per_group
    work = Path(tempfile.mkdtemp(prefix="pdsr-bench-rollout-"))
    prompts = write_replay_prompts(trace, work / "prompts.jsonl", load_tokenizer(model))
    longest = int(trace.lengths.max())
    specs = [EngineSpec(name="fast-0", pool="fast", devices=[0], max_num_seqs=args.max_num_seqs,
                        max_model_len=longest + 512, dtype=args.dtype, kv_cache_gib=args.fast_kv_gib),
             EngineSpec(name="heavy-0", pool="heavy", devices=[1], max_num_seqs=args.max_num_seqs,
                        max_model_len=longest + 512, dtype=args.dtype, kv_cache_gib=args.heavy_kv_gib)]
    engines = [VllmEngine.from_spec(s, model=model) for s in specs]
    t0 = time.perf_counter()
    await asyncio.gather(*(e.start() for e in engines))
    print(f"engines started in {time.perf_counter() - t0:.1f} s; trace: {trace.num_groups} groups x {n}, "
          f"{int(trace.lengths.sum())} tokens, longest {longest}, batch {args.batch_size} prompts")

    def config(policy: str, out: Path, **extra):
        return load_config(RolloutConfig, None, {
            "model": model, "data.path": str(prompts), "data.target_lengths_column": "target_lengths",
            "sampling.ignore_eos": True, "sampling.n": n, "sampling.max_tokens": longest,
            "batch_size": args.batch_size, "policy.name": policy, "output.path": str(out),
            "output.overwrite": True, "reward": "none", **extra})

    try:
        await run_rollout_async(config("baseline", work / "warmup.parquet", **{"data.limit": 4}), engines=engines)
        rows = []
        for policy in args.policies.split(","):
            runs = []
            name, noseg, _ = policy.partition("-noseg")
            extra = {"segments.enabled": False} if noseg else {}
            for r in range(args.repeats):
                s = await run_rollout_async(config(name, work / f"{policy}-{r}.parquet", **extra), engines=engines)
                runs.append(s)
            runs.sort(key=lambda s: s.makespan_s)
            s = runs[len(runs) // 2]
            rows.append((policy, s))
            print(f"  {policy:9s} makespan {s.makespan_s:8.2f} s  {s.tokens_per_s:8.1f} tok/s", flush=True)
    finally:
        for e in engines:
            await e.close()

    base = dict(rows).get("baseline")
    print()
    print(f"{'policy':10s}{'makespan_s':>12s}{'tokens/s':>10s}{'vs baseline':>13s}{'busy fast':>11s}"
          f"{'busy heavy':>12s}{'offload':>9s}{'breaks':>8s}{'moves':>7s}{'steals':>8s}{'wasted':>8s}")
    for policy, s in rows:
        ratio = base.makespan_s / s.makespan_s if base else float("nan")
        busy = s.engine_busy_fraction
        st = s.stats
        print(f"{policy:10s}{s.makespan_s:12.2f}{s.tokens_per_s:10.1f}{ratio:12.2f}x{busy.get('fast-0', 0):11.2f}"
              f"{busy.get('heavy-0', 0):12.2f}{st['offloaded_prompts']:9d}{st['breaks']:8d}{st['moves']:7d}"
              f"{st['steals']:8d}{st['wasted_tokens']:8d}")
    print("\nvs baseline = baseline makespan / policy makespan (>1 is faster). Same engines, same trace, one run."
          "\n-noseg = the same policy with each request run to its end in one go (no dynamic segments).")


if __name__ == "__main__":
    asyncio.run(main_async(parse_args()))
