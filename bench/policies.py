"""Benchmark: every policy against baseline and the two reference schedules, on equal simulated engines.

    .venv/bin/python bench/policies.py [--batches 4] [--seed 11] [--engines 8,64] [--batch-sizes 128,512]

Four trace families made with `pdsr trace synth` (pdsr_sdk.traces.synth_trace):
informative (its defaults), uninformative (--prompt-sigma 0.05 --noise-sigma 0.7
--runaway-frac 0.35 --max-length 1024), the same with each prompt's own runaway
rate (--runaway-concentration 5: a small model's runs to the cap cluster by
prompt) and KV-bound long reasoning (--median-length 3400 --max-length 32768,
max_model_len 40960). Engines are equal
(256 sequences, 262,144 KV tokens each), a quarter of them heavy. Prints a
markdown table per family: makespan / baseline's for each policy, the share of
the oracle's gain v3 takes, and preemptions of baseline and v3 (measured in one
run of the simulator; the machine's noise does not enter virtual time).
"""

from __future__ import annotations

import argparse
import time

FAMILIES = {
    "informative": dict(),
    "uninformative": dict(prompt_sigma=0.05, noise_sigma=0.7, runaway_frac=0.35, max_length=1024),
    "uninformative-by-prompt": dict(prompt_sigma=0.05, noise_sigma=0.7, runaway_frac=0.35, runaway_concentration=5,
                                    max_length=1024),
    "kv-bound": dict(median_length=3400, max_length=32768),
}
POLICIES = "all,oracle-probe,oracle"   # every registered policy for real engines, then the references


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--engines", default="8,64")
    ap.add_argument("--batch-sizes", default="128,512")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--policies", default=POLICIES)
    args = ap.parse_args()

    from pdsr_sdk.policies.resolve import policy_names
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.driver import run_policy, trace_batches
    from pdsr_sdk.traces import synth_trace

    policies = policy_names(args.policies)
    for fam in args.families.split(","):
        print(f"\n{fam}:\n")
        print("| engines | B | " + " | ".join(policies) + " | v3 share of oracle gain | preemptions base / v3 |")
        print("|---|---|" + "---|" * len(policies) + "---|---|")
        for n_eng in map(int, args.engines.split(",")):
            for b in map(int, args.batch_sizes.split(",")):
                heavy = n_eng // 4
                prof = dict(max_num_seqs=256, kv_cache_tokens=262144,
                            max_model_len=40960 if fam == "kv-bound" else 32768)
                trace = synth_trace(groups=b * args.batches, n=8, seed=args.seed, **FAMILIES[fam])
                cfg = SimulateConfig(fast=n_eng - heavy, heavy=heavy, batch_size=b, timeline=False,
                                     profiles={"fast": prof, "heavy": prof})
                tb = trace_batches(trace, cfg)
                t = time.perf_counter()
                runs = {p: run_policy(tb, cfg, p, record=False) for p in policies}
                base = runs["baseline"].makespan_s
                cells = [f"{runs[p].makespan_s / base:.3f}" for p in policies]
                share = "n/a"
                if "oracle" in runs and "v3" in runs and base - runs["oracle"].makespan_s > 0.01 * base:
                    share = f"{(base - runs['v3'].makespan_s) / (base - runs['oracle'].makespan_s):.2f}"
                pre = "/".join(str(sum(getattr(e, "preemptions", 0) for e in runs[p].engines))
                               for p in ("baseline", "v3") if p in runs)
                print(f"| {n_eng} | {b} | " + " | ".join(cells) + f" | {share} | {pre} |", flush=True)
                del t


if __name__ == "__main__":
    main()
