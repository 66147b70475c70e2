"""Length-controlled replay of a trace through policies on the same real vLLM engines, and what the
simulator predicts for it.

Every request generates exactly its recorded length (``ignore_eos`` and a
per-sample max), so the policies differ only in where and when work runs.
Two equal CPU engines (fast-0 on core 0, heavy-0 on core 1, 64 sequences each)
are started once and shared by all policies; a warm-up batch runs first.
Two CPU engines vary by about 8% from run to run, so repeats alternate the
policies (A B A B ...) and the ratio reported is the median of the pairwise
ratios (baseline makespan / policy makespan of the same repeat) with its
spread. Then the cost model is calibrated from this run's segment timings and
``pdsr simulate`` replays the same trace with the same policies: its
predicted ratio is printed beside the measured one. Each round's line also gives the
driver process's CPU time (it shares the cores with the engines) and what vLLM itself
reported holding: each engine's peak of running + waiting requests, and how often it
held more than the dispatcher's slots.

No fixed target: the ratio (``vs baseline``; above 1 is faster) and the simulator's prediction of it are the
output, with each run's trajectories and summary in a temporary folder it names. Time on 2 shared cores: 1-2
minutes to start the engines, then per round each policy's makespan (4-7 s at ``--groups 8 --batch-size 4
--max-length 256``; baseline 37-53 s at the documented ``--groups 64 --batch-size 32 --max-length 2048``).

    python bench/rollout.py                                   # baseline vs v3, tiny model
    python bench/rollout.py --batch-size 32 --runaway-frac 0.02 --max-length 2048 --repeats 3
    python bench/rollout.py --trace lengths.jsonl --model DIR --policies baseline,v3,v2.5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import (at_least, check_model_dir, check_policies, existing_file, number_at_least,  # noqa: E402
                        run_engines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=existing_file,
                   help="length trace (JSONL or trajectories Parquet); default: a synthetic one")
    p.add_argument("--groups", type=at_least(1), default=32, help="synthetic trace: prompt groups")
    p.add_argument("--n", type=at_least(1), default=8, help="synthetic trace: samples per group")
    p.add_argument("--median-length", type=number_at_least(1), default=120.0, help="synthetic trace: median length")
    p.add_argument("--max-length", type=at_least(1), default=1024, help="synthetic trace: max length")
    p.add_argument("--runaway-frac", type=number_at_least(0), default=0.003,
                   help="synthetic trace: share of samples that run to max length (0 to 1)")
    p.add_argument("--seed", type=int, default=0, help="synthetic trace's seed")
    p.add_argument("--batch-size", type=at_least(1), default=16, help="prompts per batch")
    p.add_argument("--policies", default="baseline,v3",
                   help="policies to run (baseline is always run, first); NAME-noseg runs NAME without dynamic "
                        "segments")
    p.add_argument("--model", help="model directory (default: the built-in tiny model)")
    p.add_argument("--dtype", default="auto", help="engine dtype (as EngineSpec.dtype)")
    p.add_argument("--max-num-seqs", type=at_least(1), default=64, help="sequences per engine")
    p.add_argument("--fast-kv-gib", type=number_at_least(0.01), default=None,
                   help="KV cache of the fast engine (CPU build, GiB)")
    p.add_argument("--heavy-kv-gib", type=number_at_least(0.01), default=None,
                   help="KV cache of the heavy engine (CPU build, GiB)")
    p.add_argument("--repeats", type=at_least(1), default=1, help="rounds of all policies, alternating (A B A B ...)")
    args = p.parse_args(argv)
    if args.runaway_frac > 1:
        p.error(f"argument --runaway-frac: {args.runaway_frac:g} is above 1 (a share of the samples)")
    # every name is checked here, before the engines start (minutes), not when its turn comes
    check_policies(p, [name.partition("-noseg")[0] for name in args.policies.split(",") if name.strip()])
    check_model_dir(p, args.model)
    return args


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

    def config(policy: str, out: Path, **extra):
        return load_config(RolloutConfig, None, {
            "model": model, "data.path": str(prompts), "data.target_lengths_column": "target_lengths",
            "sampling.ignore_eos": True, "sampling.n": n, "sampling.max_tokens": longest,
            "batch_size": args.batch_size, "policy": policy, "output.path": str(out),
            "output.overwrite": True, "reward": "none", **extra})

    try:   # from the start: an engine that started is closed when another fails to start or Ctrl-C comes
        t0 = time.perf_counter()
        await asyncio.gather(*(e.start() for e in engines))
        print(f"engines started in {time.perf_counter() - t0:.1f} s; trace: {trace.num_groups} groups x {n}, "
              f"{int(trace.lengths.sum())} tokens, longest {longest}, batch {args.batch_size} prompts")
        await run_rollout_async(config("baseline", work / "warmup.parquet", **{"data.limit": 4}), engines=engines)
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        if policies[0] != "baseline":
            policies = ["baseline"] + [p for p in policies if p != "baseline"]
        runs: dict[str, list] = {p: [] for p in policies}
        for r in range(args.repeats):
            for policy in policies:   # alternate: run-to-run drift of the engines hits every policy alike
                name, noseg, _ = policy.partition("-noseg")
                extra = {"segments.enabled": False} if noseg else {}
                cpu = time.process_time()
                loads: list[tuple[int, ...]] = []
                sampler = asyncio.create_task(sample_loads(engines, loads))
                try:
                    s = await run_rollout_async(config(name, work / f"{policy}-{r}.parquet", **extra), engines=engines)
                finally:
                    sampler.cancel()
                cpu = time.process_time() - cpu
                runs[policy].append((s, work / f"{policy}-{r}.parquet"))
                # the driver shares the machine's cores with the engines: its CPU time is theirs lost
                print(f"  round {r}: {policy:9s} makespan {s.makespan_s:8.2f} s  {s.tokens_per_s:8.1f} tok/s  "
                      f"driver CPU {cpu:6.1f} s  {describe_loads(engines, loads, args.max_num_seqs)}", flush=True)
        kv_tokens = min((e.kv_cache_tokens for e in engines if e.kv_cache_tokens), default=1 << 22)
    finally:
        for e in engines:
            await e.close()

    base = [s.makespan_s for s, _ in runs["baseline"]]
    predicted = simulate_ratios(args, trace, runs, kv_tokens)
    print(f"\n{'policy':10s}{'makespan_s':>12s}{'tokens/s':>10s}{'vs baseline':>13s}{'spread':>17s}{'simulated':>11s}"
          f"{'busy fast':>11s}{'busy heavy':>12s}{'moves':>7s}{'steals':>8s}{'wasted':>8s}")
    for policy, rs in runs.items():
        ratios = sorted(b / s.makespan_s for b, (s, _) in zip(base, rs))
        s = sorted(rs, key=lambda x: x[0].makespan_s)[len(rs) // 2][0]
        busy, st = s.engine_busy_fraction, s.stats
        print(f"{policy:10s}{s.makespan_s:12.2f}{s.tokens_per_s:10.1f}{statistics.median(ratios):12.3f}x"
              f"{'  [' + f'{ratios[0]:.3f}, {ratios[-1]:.3f}' + ']':>17s}{predicted.get(policy, float('nan')):10.3f}x"
              f"{busy.get('fast-0', 0):11.2f}{busy.get('heavy-0', 0):12.2f}{st['moves']:7d}{st['steals']:8d}"
              f"{st['wasted_tokens']:8d}")
    print("\nvs baseline = median over rounds of baseline makespan / policy makespan in the same round (>1 is "
          "faster), [min, max] over rounds; simulated = the same ratio predicted by `pdsr simulate` with a "
          "profile calibrated from this run. -noseg = the policy without dynamic segments.")
    print(f"every run's trajectories and summary: {work}")


async def sample_loads(engines, out: list[tuple[int, ...]], every_s: float = 0.25) -> None:
    """Append, every ``every_s``, each engine's own count of running + waiting requests (what vLLM's
    scheduler last reported), until cancelled."""
    while True:
        out.append(tuple(load.running + load.waiting for load in (e.load() for e in engines)))
        await asyncio.sleep(every_s)


def describe_loads(engines, loads: list[tuple[int, ...]], slots: int) -> str:
    """Per engine: the most requests vLLM held at once, and the share of samples where it held more than the
    dispatcher's slots (requests the dispatcher no longer counts would show there)."""
    if not loads:
        return ""
    parts = []
    for i, e in enumerate(engines):
        held = [x[i] for x in loads]
        parts.append(f"{e.name} peak {max(held)}, over {slots}: {sum(h > slots for h in held) / len(held):.0%}")
    return "vLLM " + "; ".join(parts)


def simulate_ratios(args, trace, runs, kv_tokens: int) -> dict[str, float]:
    """baseline / policy makespan predicted by the simulator, calibrated from this run's segment timings."""
    import pyarrow.parquet as pq

    from pdsr_sdk.sim.calibrate import calibrate
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.driver import run_policy, trace_batches
    from pdsr_sdk.traces import LengthTrace

    paths = [p for rs in runs.values() for _, p in rs]
    fits = calibrate(paths, per_pool=False)   # equal engines: one fit over all segments
    table = pq.read_table(paths[0], columns=["prompt_id", "prompt_length"]).to_pylist()
    plen = {r["prompt_id"]: r["prompt_length"] for r in table}
    replay = LengthTrace(prompt_ids=trace.prompt_ids, prompt_lens=[plen.get(p, 1) for p in trace.prompt_ids],
                         lengths=trace.lengths, offsets=trace.offsets, source="bench")
    profile = {**next(iter(fits.values())).profile(), "max_num_seqs": args.max_num_seqs,
               "kv_cache_tokens": kv_tokens, "max_model_len": int(trace.lengths.max()) + 512}
    out = {}
    for policy in runs:
        name, noseg, _ = policy.partition("-noseg")
        cfg = SimulateConfig(policy=name, fast=1, heavy=1, batch_size=args.batch_size,
                             profiles={"fast": profile, "heavy": profile}, timeline=False,
                             segments={"enabled": not noseg})
        out[policy] = run_policy(trace_batches(replay, cfg), cfg, name, record=False).makespan_s
    return {p: out["baseline"] / v for p, v in out.items()}


if __name__ == "__main__":
    run_engines(main_async(parse_args()))
