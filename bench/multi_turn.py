"""Benchmark: multi-turn rollouts (a trace of turns) in the simulator: v3 against baseline over seeds.

    .venv/bin/python bench/multi_turn.py [--seeds 101,102,103,104,105] [--groups 256] [--engines 8]
                                         [--batch-size 128] [--max-num-seqs 256] [--policies v3]

Each seed draws the `multi-turn` member of the workload family (1-8 turns per sample, centred by prompt;
16-256 environment tokens and a 0.1-5 s environment delay, log-uniform, after each turn but the last; n = 8)
and `pdsr simulate` replays it in batches of B prompts on equal engines: each turn is a request through the
scheduler, a parked sample holds no slot while its environment works, and after the trace's delay it continues
on the engine holding its prefix. Per seed: the makespans of baseline, v3 and the true-length reference
(`oracle`), the lower bound, and the slot-holding reference (`baseline-hold`: baseline with each request's
slot kept through its environment's wait) with its share of slot-time held by waiting samples (pdsr's is 0).
Then v3/baseline min / median / max over the seeds (the target: at most 1 at the median and the max).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_args import at_least, int_list

from pdsr_sdk.errors import PdsrError


def run_seed(seed: int, args) -> dict:
    from pdsr_sdk.sim.driver import HOLD_REFERENCE, run_policy, trace_batches
    from pdsr_sdk.traces import workload

    trace = workload("multi-turn").trace(groups=args.groups, seed=seed)
    out: dict = {}
    for label in ["baseline", *args.policies, "oracle"]:
        name = label.partition("-no-")[0]
        cfg = label_config(label, args)
        run = run_policy(trace_batches(trace, cfg), cfg, name, record=False)
        out[label] = run.makespan_s
        out["pdsr_share"] = max(out.get("pdsr_share", 0.0), run.env_slot_share)
        if label == "baseline":
            out["bound"] = run.lower_bound_s
            held = run_policy(trace_batches(trace, cfg), cfg, "baseline", record=False, hold_turn_slots=True)
            out[HOLD_REFERENCE] = held.makespan_s
            out["hold_share"] = held.env_slot_share
    return out


def label_config(label: str, args):
    """The simulator's config of one column: a policy, or ``v3-no-RULE[+RULE]`` (v3 with those rules disabled)."""
    from pdsr_sdk.sim.config import SimulateConfig

    name, _, off = label.partition("-no-")
    settings = {name: {"disable": off.split("+")}} if off else {}
    return SimulateConfig(policy=name, policy_settings=settings, fast=args.engines, heavy=0,
                          batch_size=args.batch_size, n=8, timeline=False,
                          profiles={"fast": {"max_num_seqs": args.max_num_seqs}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int_list, default="101,102,103,104,105",
                        help="trace seeds, comma-separated")
    parser.add_argument("--groups", type=at_least(1), default=256,
                        help="prompt groups per seed (batches of --batch-size)")
    parser.add_argument("--engines", type=at_least(1), default=8, help="equal simulated engines")
    parser.add_argument("--batch-size", type=at_least(1), default=128, help="prompts per batch (B)")
    parser.add_argument("--max-num-seqs", type=at_least(1), default=256, help="sequences per engine")
    parser.add_argument("--policies", default="v3", help="policies besides baseline and oracle (comma-separated); "
                        "v3-no-RULE[+RULE] runs v3 with those rules disabled")
    args = parser.parse_args()
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for label in args.policies:   # an unknown policy or rule is refused here, not after the first seed's runs
        try:
            label_config(label, args)
        except PdsrError as exc:
            parser.error(f"--policies: {label}: {' '.join(str(exc).split())}")   # the config's lines as one
    t0 = time.perf_counter()
    seeds = args.seeds
    rows = []
    names = args.policies
    print(f"multi-turn member, {args.groups} groups x 8 per seed, B = {args.batch_size}, {args.engines} engines of "
          f"{args.max_num_seqs} sequences")
    head = ["seed", "baseline", *names, "oracle", "bound", "baseline-hold", "hold_share", "pdsr_share"]
    print(" ".join(f"{h:>13}" for h in head))
    for seed in seeds:
        r = run_seed(seed, args)
        rows.append(r)
        vals = [r["baseline"], *[r[n] for n in names], r["oracle"], r["bound"], r["baseline-hold"]]
        print(f"{seed:>13}" + "".join(f" {v:13.2f}" for v in vals)
              + f" {r['hold_share']:13.3f} {r['pdsr_share']:13.3f}")
    for name in [*names, "oracle", "baseline-hold"]:
        ratios = sorted(r[name] / r["baseline"] for r in rows)
        print(f"{name}/baseline over {len(rows)} seeds: min {ratios[0]:.3f} median {statistics.median(ratios):.3f} "
              f"max {ratios[-1]:.3f}")
    shares = [r["hold_share"] for r in rows]
    print(f"slot-time held by samples waiting on their environment: pdsr {max(r['pdsr_share'] for r in rows):.3f}, "
          f"slot-holding reference {min(shares):.3f}-{max(shares):.3f}")
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
