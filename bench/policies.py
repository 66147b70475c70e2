"""Benchmark: every policy against baseline and the two reference schedules, on equal simulated engines.

    .venv/bin/python bench/policies.py [--batches 4] [--seed 11] [--engines 8,64] [--batch-sizes 128,512]
    .venv/bin/python bench/policies.py --seed 15,16,17,18,19,20,21,22,23,24 --engines 8 --batch-sizes 128

Four trace families made with `pdsr trace synth` (pdsr_sdk.traces.synth_trace):
informative (its defaults), uninformative (--prompt-sigma 0.05 --noise-sigma 0.7
--runaway-frac 0.35 --max-length 1024), the same with each prompt's own runaway
rate (--runaway-concentration 5: a small model's runs to the cap cluster by
prompt) and KV-bound long reasoning (--median-length 3400 --max-length 32768,
max_model_len 40960). Engines are equal
(256 sequences, 262,144 KV tokens each), a quarter of them heavy. Prints a
markdown table per family: makespan / baseline's for each policy, the share of
the oracle's gain v3 takes, and preemptions of baseline and v3 (measured in one
run of the simulator; the machine's noise does not enter virtual time). With
several seeds each cell is the median over the trace draws, and v3's range and
the draws it wins show how much one draw can say (preemptions are then summed
over the draws).

With --trace FILE (a JSONL length trace, e.g. from `pdsr trace convert` of a real
rollout) the family is that trace instead: each draw (seed) takes B x batches of
its groups, whole, at random with replacement, so one recorded batch gives many
draws with its own lengths, runs to the cap and probe/sibling relation. Seed 0
takes the groups in their recorded order (repeated if too few).
bench/data/smollm2-gsm8k-128x8.jsonl is one: SmolLM2-135M-Instruct on the first
128 GSM8K test prompts, 8 samples each, vLLM CPU, temperature 1, 512 tokens
(44% of the samples run to the cap; probe/sibling rank correlation 0.03).
"""

from __future__ import annotations

import argparse

import numpy as np

FAMILIES = {
    "informative": dict(),
    "uninformative": dict(prompt_sigma=0.05, noise_sigma=0.7, runaway_frac=0.35, max_length=1024),
    "uninformative-by-prompt": dict(prompt_sigma=0.05, noise_sigma=0.7, runaway_frac=0.35, runaway_concentration=5,
                                    max_length=1024),
    "kv-bound": dict(median_length=3400, max_length=32768),
}
POLICIES = "all,oracle-probe,oracle"   # every registered policy for real engines, then the references


def resampled_trace(trace, groups: int, seed: int):
    """``groups`` whole groups of the recorded ``trace`` (a rectangular LengthTrace), drawn with replacement
    (seed 0: in recorded order, repeated as needed)."""
    k = trace.num_groups
    pick = np.arange(groups) % k if seed == 0 else np.random.default_rng(seed).integers(0, k, size=groups)
    reasons = trace.finish_reasons
    return type(trace).from_matrix(
        trace.matrix()[pick], prompt_ids=[f"{trace.prompt_ids[i]}#{j}" for j, i in enumerate(pick)],
        prompt_lens=np.asarray(trace.prompt_lens)[pick],
        finish_reasons=None if reasons is None else reasons.reshape(k, -1)[pick], source=f"{trace.source} (draw {seed})")


def run_cell(fam: str, n_eng: int, b: int, batches: int, seed: int, policies: list[str], recorded=None):
    """One family x engines x B cell on one trace draw: each policy's makespan / baseline's, v3's share of the
    oracle's gain (None under 1% of baseline) and the preemptions of baseline and v3 (a list). With
    ``recorded`` (a LengthTrace) the draw resamples its groups instead of synthesising ``fam``."""
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.driver import run_policy, trace_batches
    from pdsr_sdk.traces import synth_trace

    heavy = n_eng // 4
    prof = dict(max_num_seqs=256, kv_cache_tokens=262144, max_model_len=40960 if fam == "kv-bound" else 32768)
    trace = (resampled_trace(recorded, b * batches, seed) if recorded is not None
             else synth_trace(groups=b * batches, n=8, seed=seed, **FAMILIES[fam]))
    cfg = SimulateConfig(fast=n_eng - heavy, heavy=heavy, batch_size=b, timeline=False,
                         profiles={"fast": prof, "heavy": prof})
    tb = trace_batches(trace, cfg)
    runs = {p: run_policy(tb, cfg, p, record=False) for p in policies}
    base = runs["baseline"].makespan_s
    ratios = {p: runs[p].makespan_s / base for p in policies}
    share = None
    if "oracle" in runs and "v3" in runs and base - runs["oracle"].makespan_s > 0.01 * base:
        share = (base - runs["v3"].makespan_s) / (base - runs["oracle"].makespan_s)
    pre = [sum(getattr(e, "preemptions", 0) for e in runs[p].engines) for p in ("baseline", "v3") if p in runs]
    return ratios, share, pre


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--seed", default="11", help="trace seed, or several (comma-separated): each cell then shows the "
                                                 "median over the draws, and v3's range and wins over baseline")
    ap.add_argument("--engines", default="8,64")
    ap.add_argument("--batch-sizes", default="128,512")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--trace", metavar="FILE", help="a recorded JSONL length trace instead of the synthetic "
                                                   "families (each seed resamples its groups)")
    ap.add_argument("--policies", default=POLICIES)
    args = ap.parse_args()

    from pdsr_sdk.policies.resolve import policy_names

    policies = policy_names(args.policies)
    recorded = None
    if args.trace:
        from pdsr_sdk.traces.io import read_trace

        recorded = read_trace(args.trace)   # read once: every cell and draw resamples it
        recorded.require_rectangular("bench/policies.py --trace")
    seeds = [int(x) for x in args.seed.split(",")]
    many = len(seeds) > 1
    for fam in [args.trace] if args.trace else args.families.split(","):
        print(f"\n{fam}:" + (f" (median over seeds {args.seed})" if many else "") + "\n")
        extra = " v3 min-max | v3 faster than baseline |" if many else ""
        print("| engines | B | " + " | ".join(policies) + " | v3 share of oracle gain | preemptions base / v3 |" + extra)
        print("|---|---|" + "---|" * len(policies) + "---|---|" + ("---|---|" if many else ""))
        for n_eng in map(int, args.engines.split(",")):
            for b in map(int, args.batch_sizes.split(",")):
                cells = [run_cell(fam, n_eng, b, args.batches, seed, policies, recorded) for seed in seeds]
                ratios = {p: float(np.median([c[0][p] for c in cells])) for p in policies}
                shares = [c[1] for c in cells if c[1] is not None]
                share = f"{np.median(shares):.2f}" if len(shares) == len(cells) else "n/a"
                row = f"| {n_eng} | {b} | " + " | ".join(f"{ratios[p]:.3f}" for p in policies)
                pre = "/".join(str(sum(c[2][i] for c in cells)) for i in range(len(cells[0][2])))   # over the draws
                row += f" | {share} | {pre} |"
                if many and "v3" in ratios:
                    v3 = [c[0]["v3"] for c in cells]
                    row += f" {min(v3):.3f}-{max(v3):.3f} | {sum(r < 1 for r in v3)} of {len(v3)} |"
                print(row, flush=True)


if __name__ == "__main__":
    main()
