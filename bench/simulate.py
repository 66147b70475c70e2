"""Benchmark: simulator speed at scale, and at the small scale of the example trace.

    .venv/bin/python bench/simulate.py [--policy v2.5|all] [--groups 12500] [--fast 750] [--heavy 250]
                                       [--batch-size 1250] [--profile]

Large case: a synthetic trace of 12,500 prompts x 8 samples = 100,000
requests on 1,000 simulated engines (750 fast, 250 heavy, default profiles),
in batches of 1,250 prompts (10 GRPO steps), default dynamic segments.
Target: under 10 s per policy on one core. Small case: `pdsr simulate
--policy all` on examples/traces/synth_256x8.jsonl with 8 engines: every
policy for real engines and the reference schedules oracle (two variants)
and oracle-probe, as the command runs them (target: a couple of seconds,
trace reading included). Prints wall and CPU times (the machine
may be shared: CPU time is the process's own), simulated
events (timer firings) and the ratio to the target. ``--profile`` prints the
top functions of a cProfile run of the large case.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

from bench_args import at_least

TARGET_S = 10.0
SMALL_TARGET_S = 2.0
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "synth_256x8.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="v2.5", help="policy or 'all' (default v2.5)")
    parser.add_argument("--groups", type=at_least(1), default=12500, help="large case: prompts of the synthetic trace")
    parser.add_argument("--n", type=at_least(1), default=8, help="large case: samples per prompt")
    parser.add_argument("--fast", type=at_least(0), default=750, help="large case: fast simulated engines")
    parser.add_argument("--heavy", type=at_least(0), default=250, help="large case: heavy simulated engines")
    parser.add_argument("--batch-size", type=at_least(1), default=1250, help="large case: prompts per batch")
    parser.add_argument("--profile", action="store_true", help="cProfile the large case")
    args = parser.parse_args()

    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.driver import policy_names, run_names, run_policy, trace_batches
    from pdsr_sdk.errors import PdsrError
    from pdsr_sdk.traces import read_trace, synth_trace

    try:   # the large case's settings, checked before the small case runs
        cfg = SimulateConfig(policy=args.policy, fast=args.fast, heavy=args.heavy, batch_size=args.batch_size,
                             timeline=False)
    except PdsrError as exc:
        parser.error(str(exc))
    # small case: the example trace, every policy, 8 engines, as `pdsr simulate --policy all` runs it
    t, c = time.perf_counter(), time.process_time()
    small = SimulateConfig(policy="all", fast=6, heavy=2, batch_size=128)
    tb = trace_batches(read_trace(EXAMPLE), small)
    names = run_names(small)
    events = sum(run_policy(tb, small, name).events for name in names)
    dt, cpu = time.perf_counter() - t, time.process_time() - c
    print(f"small: {EXAMPLE.name}, {tb.num_samples} samples, {len(names)} policies ({', '.join(names)}), 8 engines: "
          f"wall {dt:.2f} s, cpu {cpu:.2f} s "
          f"({events} events); target {SMALL_TARGET_S:.0f} s -> {SMALL_TARGET_S / cpu:.2f}x (cpu)")

    trace = synth_trace(groups=args.groups, n=args.n, seed=0)
    tb = trace_batches(trace, cfg)
    print(f"large: {tb.num_samples} requests ({args.groups} prompts x {args.n}), {args.fast + args.heavy} engines "
          f"({args.fast} fast, {args.heavy} heavy), {len(tb.batches)} batches of {args.batch_size} prompts")
    for name in policy_names(args.policy):
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
        t, c = time.perf_counter(), time.process_time()
        run = run_policy(tb, cfg, name, record=False)
        dt, cpu = time.perf_counter() - t, time.process_time() - c
        if args.profile:
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        print(f"  {name:9s} wall {dt:6.2f} s  cpu {cpu:6.2f} s  {run.events:8d} events  {run.events / cpu:7.0f} "
              f"events/cpu-s  makespan {run.makespan_s:7.1f} s (virtual)  target {TARGET_S:.0f} s -> "
              f"{TARGET_S / cpu:.2f}x (cpu)")


if __name__ == "__main__":
    main()
