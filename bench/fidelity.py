"""Benchmark: simulator fidelity against real vLLM CPU engines (length-controlled replay).

    .venv/bin/python bench/fidelity.py [--groups 32] [--n 4] [--batch-size 16] [--out-dir runs/fidelity]

Needs vLLM (the CPU build) and takes a few minutes (``--groups 8 --n 2 --batch-size 4 --policies
baseline,v2``: about 2). Two engines, fast-0 on core 0 and heavy-0 on core 1, serve the built-in tiny model.
A synthetic trace (seeded) becomes a prompts file whose ``lengths`` column forces each sample's response
length (``sampling.ignore_eos``). After one unmeasured warm-up batch (a fresh engine's first steps are many
times slower), for each policy ``run_rollout`` runs the trace on the real engines; then the cost model is
calibrated per pool from all the runs' segment timings (``pdsr simulate calibrate``), and the simulator
replays the same trace (same prompts, prompt lengths, batches and settings) with the calibrated profile.
Prints per policy the measured and simulated makespan and the relative error (target: within 15%). The
machine may be shared: measured times include any contention, which the simulator cannot know about.
Everything goes to --out-dir: the prompts, each policy's trajectories, real.json (the measured side, which
--reuse reads back when the flags are the same) and profile.yaml (the calibrated cost model).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

from bench_args import at_least, check_policies, number_at_least, run_engines, writable_dir

POLICIES = ("baseline", "v1", "v2", "v2.5")
TARGET = 0.15
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def max_model_len(args) -> int:
    """The engines' context: 2048 (what the measurements were made with), more for a longer --max-length (the
    prompts are up to about 250 tokens)."""
    return max(2048, args.max_length + 512)


def write_prompts(trace, path: Path, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("w") as fh:
        for g in range(trace.num_groups):
            lo, hi = int(trace.offsets[g]), int(trace.offsets[g + 1])
            # prompts of varied length, so prefill cost is visible to the fit
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 120)))
            fh.write(json.dumps({"id": trace.prompt_ids[g], "prompt": f"Question {g}: {words}?",
                                 "lengths": trace.lengths[lo:hi].tolist()}) + "\n")


async def run_real(args, prompts: Path, out_dir: Path) -> dict[str, dict]:
    from pdsr_sdk.config import load_config
    from pdsr_sdk.engines.vllm_engine import VllmEngine
    from pdsr_sdk.models.tiny import ensure_tiny_model
    from pdsr_sdk.rollout.config import EngineSpec, RolloutConfig
    from pdsr_sdk.rollout.run import run_rollout_async

    model = str(ensure_tiny_model())
    specs = [EngineSpec(name="fast-0", pool="fast", devices=[0], max_num_seqs=args.max_num_seqs,
                        max_model_len=max_model_len(args)),
             EngineSpec(name="heavy-0", pool="heavy", devices=[1], max_num_seqs=args.max_num_seqs,
                        max_model_len=max_model_len(args))]
    engines = [VllmEngine.from_spec(s, model=model) for s in specs]
    results = {}
    try:   # from the start: an engine that started is closed when another fails to start or Ctrl-C comes
        await asyncio.gather(*(e.start() for e in engines))
        # warm-up, not measured: a fresh engine's first steps (new batch shapes) are many times slower
        warm = {"model": model, "data.path": str(prompts), "data.target_lengths_column": "lengths",
                "data.apply_chat_template": False, "data.limit": args.batch_size, "sampling.ignore_eos": True,
                "sampling.n": args.n, "sampling.max_tokens": args.max_length, "batch_size": args.batch_size,
                "policy": "baseline", "reward": "none", "output.path": str(out_dir / "warmup.parquet"),
                "output.overwrite": True}
        t = time.perf_counter()
        await run_rollout_async(load_config(RolloutConfig, None, warm), engines=engines)
        print(f"  warm-up batch (not measured): {time.perf_counter() - t:.1f} s", flush=True)
        for policy in args.policies:
            overrides = {
                "model": model, "data.path": str(prompts), "data.target_lengths_column": "lengths",
                "data.apply_chat_template": False, "sampling.ignore_eos": True, "sampling.n": args.n,
                "sampling.max_tokens": args.max_length, "batch_size": args.batch_size, "policy": policy,
                "reward": "none", "output.path": str(out_dir / f"{policy}.parquet"), "output.overwrite": True,
            }
            cfg = load_config(RolloutConfig, None, overrides)
            t = time.perf_counter()
            summary = await run_rollout_async(cfg, engines=engines)
            print(f"  real {policy:9s} makespan {summary.makespan_s:7.2f} s ({time.perf_counter() - t:.1f} s wall)",
                  flush=True)
            results[policy] = {"makespan_s": summary.makespan_s, "path": str(cfg.output.path),
                               "segments": cfg.segments.model_dump(), "stats": summary.stats}
    finally:
        for e in engines:
            await e.close()
    return results


#: the flags the real runs depend on: --reuse takes a real.json only where they are the same
SETTINGS = ("groups", "n", "batch_size", "median_length", "max_length", "max_num_seqs", "seed", "policies")


def reused_runs(path: Path, settings: dict, parser: argparse.ArgumentParser) -> dict | None:
    """The real runs in ``path`` if they were made with ``settings`` (None if there is no such file); a file
    of other settings is refused, naming them, since replaying another trace would compare different work."""
    if not path.exists():
        return None
    saved = json.loads(path.read_text())
    if saved.get("settings") != settings:
        was = saved.get("settings") or "not recorded (an older file)"
        parser.error(f"--reuse: {path} was made with other settings ({was}; now {settings}); "
                     f"run without --reuse to measure again")
    return saved["runs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=at_least(1), default=32, help="synthetic trace: prompts")
    parser.add_argument("--n", type=at_least(1), default=4, help="samples per prompt")
    parser.add_argument("--batch-size", type=at_least(1), default=16, help="prompts per batch")
    parser.add_argument("--median-length", type=number_at_least(1), default=120.0,
                        help="synthetic trace: median response length")
    parser.add_argument("--max-length", type=at_least(1), default=480, help="synthetic trace: longest response")
    parser.add_argument("--max-num-seqs", type=at_least(1), default=8, help="sequences per engine")
    parser.add_argument("--seed", type=int, default=0, help="synthetic trace's and prompts' seed")
    parser.add_argument("--policies", default=",".join(POLICIES), help="policies to run, comma-separated")
    parser.add_argument("--out-dir", type=writable_dir, default="runs/fidelity",
                        help="where the prompts, each policy's trajectories, real.json and profile.yaml go")
    parser.add_argument("--per-pool", action="store_true", help="calibrate each pool separately")
    parser.add_argument("--reuse", action="store_true",
                        help="reuse the real runs in --out-dir (real.json) of a run with the same settings")
    args = parser.parse_args()
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    check_policies(parser, args.policies)   # before the engines start (minutes), not at the policy's turn

    from pdsr_sdk.engines.vllm_env import apply_cpu_defaults

    apply_cpu_defaults()
    import pyarrow.parquet as pq

    from pdsr_sdk.sim.calibrate import calibrate, profile_yaml
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.driver import run_policy, trace_batches
    from pdsr_sdk.traces import LengthTrace, synth_trace

    folder = args.out_dir
    settings = {key: getattr(args, key) for key in SETTINGS}
    real = reused_runs(folder / "real.json", settings, parser) if args.reuse else None   # before writing there
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:   # what writable_dir cannot see: a read-only mount, no space
        parser.error(f"--out-dir: {folder}: {exc.strerror or exc}")
    trace = synth_trace(groups=args.groups, n=args.n, seed=args.seed, median_length=args.median_length,
                        max_length=args.max_length, runaway_frac=0.02)
    prompts = folder / "prompts.jsonl"
    write_prompts(trace, prompts, args.seed)
    print(f"trace: {args.groups} prompts x {args.n}, {int(trace.lengths.sum())} tokens, batches of "
          f"{args.batch_size}; engines fast-0 (core 0) and heavy-0 (core 1), {args.max_num_seqs} seqs each",
          flush=True)
    if real is None:
        real = run_engines(run_real(args, prompts, folder))
        (folder / "real.json").write_text(json.dumps({"settings": settings, "runs": real}, indent=2, default=str))

    paths = [r["path"] for r in real.values()]
    # both engines are the same model on one core each: one fit over all segments (--per-pool: one per pool)
    fits = calibrate(paths, per_pool=args.per_pool)
    (folder / "profile.yaml").write_text(profile_yaml(fits, paths))
    for f in fits.values():
        c = f.coefficients
        print(f"  calibrated {f.pool}: c0 {c['c0_s']:.3g} s, c1 {c['c1_s_per_seq']:.3g} s/seq, "
              f"c2 {c['c2_s_per_token']:.3g} s/token, prefill {c['prefill_s_per_token']:.3g} s/token "
              f"({f.spans} spans, {f.outliers} outliers, R^2 {f.r2:.3f}, median span error "
              f"{100 * f.median_rel_error:.1f}%)")

    # the same trace with the prompt lengths the real runs tokenized
    table = pq.read_table(paths[0], columns=["prompt_id", "prompt_length"]).to_pylist()
    plen = {r["prompt_id"]: r["prompt_length"] for r in table}
    replay = LengthTrace(prompt_ids=trace.prompt_ids, prompt_lens=[plen[p] for p in trace.prompt_ids],
                         lengths=trace.lengths, offsets=trace.offsets, source="fidelity")
    profiles = {pool: {**fits[pool].profile(), "max_num_seqs": args.max_num_seqs, "kv_cache_tokens": 1 << 22,
                       "max_model_len": max_model_len(args)} for pool in fits}
    keys = ("probe_timeouts", "offloaded_prompts", "breaks", "moves", "steals")
    print(f"\n{'policy':9s} {'measured_s':>10s} {'simulated_s':>11s} {'rel_error':>9s}   counters measured / simulated "
          f"({', '.join(keys)})")
    errors = []
    for policy, r in real.items():
        cfg = SimulateConfig(policy=policy, fast=1, heavy=1, batch_size=args.batch_size, n=args.n,
                             profiles=profiles, segments=r["segments"], timeline=False)
        sim = run_policy(trace_batches(replay, cfg), cfg, policy, record=False)
        err = (sim.makespan_s - r["makespan_s"]) / r["makespan_s"]
        errors.append(abs(err))
        counts = "  ".join(f"{r['stats'].get(k, 0)}/{sim.stats.get(k, 0)}" for k in keys)
        print(f"{policy:9s} {r['makespan_s']:10.2f} {sim.makespan_s:11.2f} {100 * err:+8.1f}%   {counts}")
    worst = max(errors)
    print(f"\nworst |error| {100 * worst:.1f}% (target {100 * TARGET:.0f}%: {'met' if worst <= TARGET else 'NOT met'})")


if __name__ == "__main__":
    main()
