"""Benchmark: every policy against baseline and the two reference schedules, on equal simulated engines,
across the workload family.

    .venv/bin/python bench/policies.py --quick                  # 8 engines, B = 128, 2 batches, 3 policies
    .venv/bin/python bench/policies.py [--family seed002,heavy] [--seed 11] [--engines 8,64]
                                       [--batch-sizes 128,512] [--batches 4] [--policies all,oracle-probe,oracle]
                                       [--settings '{"migration": {"quantile": 0.97}}']

The workloads are the members of the family (pdsr_sdk.traces.WORKLOADS, `pdsr trace synth --family
list`; docs/notes/workload-family.md): informative (`pdsr trace synth`'s defaults), uninformative,
uninformative-by-prompt, kv-bound, seed002, heavy, longcot, multi-turn, recorded-gsm8k, recorded-math,
recorded-gsm8k-2048 and recorded-math-2048
(bench/data/smollm2-gsm8k-128x8.jsonl and smollm2-math500-128x8.jsonl, resampled by seed). Each member runs on its
pinned engine profile (KV tokens, max_model_len) and its pinned seeds (five: 101-105); --seed replaces them. Engines are
equal, a quarter of them heavy. Prints a markdown table per member: for each policy its makespan / baseline's as the
median [min, max] over the seeds, v3's median share of the oracle's gain, preemptions of baseline and v3 (summed
over the seeds: measured in one run of the simulator; the machine's noise does not enter virtual time),
and the seeds on which v3 beats baseline.

Runtime, on one core: --quick runs the whole family in about 4 minutes (kv-bound takes half of it); the
defaults (8 and 64 engines, B = 128 and 512, 4 batches, every policy) take hours: pick members with
--family.

With --trace FILE (a JSONL length trace, e.g. from `pdsr trace convert` of a real rollout) the workload
is that trace instead, on the family's equal engines: each draw (seed) takes B x batches of its groups,
whole, at random with replacement (pdsr_sdk.traces.resample_trace), so one recorded batch gives many
draws with its own lengths, runs to the cap and probe/sibling relation. Seed 0 takes the groups in their
recorded order (repeated if too few). recorded-gsm8k is bench/data/smollm2-gsm8k-128x8.jsonl drawn so:
SmolLM2-135M-Instruct on the first 128 GSM8K test prompts, 8 samples each, vLLM CPU, temperature 1, 512
tokens (44% of the samples run to the cap; probe/sibling rank correlation 0.03).

--settings JSON gives v3 these settings in every cell (nested keys, as a config file's ``policy_settings.v3``):
run it once with and once without to see what a setting does across the family (docs/notes/v3-rules.md).
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_args import at_least, check_policies, count_list, existing_file, family_members, int_list

from pdsr_sdk.traces import Measurement

spread = Measurement.spread   # median [min, max] over a member's seeds

POLICIES = "all,oracle-probe,oracle"   # every registered policy for real engines, then the references
QUICK = dict(engines="8", batch_sizes="128", batches=2, policies="baseline,v3,oracle")


def run_cell(fam: str, n_eng: int, b: int, batches: int, seed: int, policies: list[str], recorded=None,
             settings: dict | None = None):
    """One member x engines x B cell on one trace draw: each policy's makespan / baseline's, v3's share of the
    oracle's gain (None under 1% of baseline) and the preemptions of baseline and v3 (a list). With
    ``recorded`` (a LengthTrace) the draw resamples its groups on the family's equal engines instead; with
    ``settings``, v3 runs with them."""
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.driver import run_policy, trace_batches
    from pdsr_sdk.traces import resample_trace, workload
    from pdsr_sdk.traces.family import EQUAL_ENGINE

    heavy = n_eng // 4
    if recorded is not None:
        prof, trace = dict(EQUAL_ENGINE), resample_trace(recorded, b * batches, seed)
    else:
        member = workload(fam)
        prof, trace = dict(member.measure.profile), member.trace(groups=b * batches, n=8, seed=seed)
    cfg = SimulateConfig(fast=n_eng - heavy, heavy=heavy, batch_size=b, timeline=False,
                         profiles={"fast": prof, "heavy": prof}, policy_settings={"v3": settings} if settings else {})
    tb = trace_batches(trace, cfg)
    runs = {p: run_policy(tb, cfg, p, record=False) for p in policies}
    base = runs["baseline"].makespan_s
    ratios = {p: runs[p].makespan_s / base for p in policies}
    share = None
    if "oracle" in runs and "v3" in runs and base - runs["oracle"].makespan_s > 0.01 * base:
        share = (base - runs["v3"].makespan_s) / (base - runs["oracle"].makespan_s)
    pre = [sum(getattr(e, "preemptions", 0) for e in runs[p].engines) for p in ("baseline", "v3") if p in runs]
    return ratios, share, pre


def check_settings(text: str | None, ap: argparse.ArgumentParser) -> dict | None:
    """--settings parsed and validated as v3's settings (an error names the key), or None."""
    if text is None:
        return None
    import json

    from pdsr_sdk.errors import PdsrError
    from pdsr_sdk.policies.resolve import type_policy_settings

    try:
        settings = json.loads(text)
        if not isinstance(settings, dict):
            raise ValueError("not a JSON mapping")
        type_policy_settings("v3", {"v3": settings}, simulation=True, origin="--settings")
    except (ValueError, PdsrError) as exc:
        ap.error(f"--settings: {exc}")
    return settings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", "--families", dest="family", default="all",
                    help="members of the workload family, comma-separated, or all (default)")
    ap.add_argument("--seed", type=int_list, default=None,
                    help="trace seeds, comma-separated (default: each member's five pinned "
                                                 "seeds)")
    ap.add_argument("--quick", action="store_true",
                    help=f"small cells: --engines {QUICK['engines']} --batch-sizes {QUICK['batch_sizes']} --batches "
                         f"{QUICK['batches']} --policies {QUICK['policies']} (flags given still win)")
    ap.add_argument("--batches", type=at_least(1), default=None, help="batches per draw [default: 4]")
    ap.add_argument("--engines", type=count_list, default=None,
                    help="equal simulated engines, a quarter of them heavy, comma-separated [default: 8,64]")
    ap.add_argument("--batch-sizes", type=count_list, default=None, help="B, comma-separated [default: 128,512]")
    ap.add_argument("--trace", metavar="FILE", type=existing_file,
                    help="a recorded JSONL length trace instead of the family (each seed "
                                                   "resamples its groups; default seeds 101-105)")
    ap.add_argument("--policies", default=None,
                    help=f"policies and references, comma-separated; baseline among them [default: {POLICIES}]")
    ap.add_argument("--settings", default=None, metavar="JSON",
                    help="v3's settings in every cell, a JSON mapping of nested keys [default: its preset]")
    args = ap.parse_args()
    defaults = QUICK if args.quick else dict(engines="8,64", batch_sizes="128,512", batches=4, policies=POLICIES)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, count_list(value) if key in ("engines", "batch_sizes") else value)

    from pdsr_sdk.policies.resolve import policy_names
    from pdsr_sdk.errors import PdsrError
    from pdsr_sdk.traces import workload
    from pdsr_sdk.traces.family import SEEDS

    try:
        policies = policy_names(args.policies)
    except PdsrError as exc:
        ap.error(f"--policies: {exc}")
    check_policies(ap, policies, simulation=True)   # an unknown name, listing the valid ones
    settings = check_settings(args.settings, ap)
    if "baseline" not in policies:
        ap.error("--policies: baseline is what every policy is measured against; name it")
    recorded = None
    if args.trace:
        from pdsr_sdk.traces.io import read_trace

        try:
            recorded = read_trace(args.trace)   # read once: every cell and draw resamples it
            recorded.require_rectangular("bench/policies.py --trace")
        except PdsrError as exc:
            ap.error(f"--trace: {exc}")
        members = [str(args.trace)]
    else:
        members = family_members(ap, args.family)
    for fam in members:
        seeds = (args.seed if args.seed else
                 list(SEEDS) if recorded is not None else list(workload(fam).measure.seeds))
        many = len(seeds) > 1
        print(f"\n{fam}: seeds {', '.join(map(str, seeds))}" + (" (median [min, max] over them)" if many else "")
              + "\n")
        extra = " v3 faster than baseline |" if many else ""
        print("| engines | B | " + " | ".join(policies)
              + " | v3 share of oracle gain | preemptions base / v3 |" + extra)
        print("|---|---|" + "---|" * len(policies) + "---|---|" + ("---|" if many else ""))
        for n_eng in args.engines:
            for b in args.batch_sizes:
                cells = [run_cell(fam, n_eng, b, args.batches, seed, policies, recorded, settings)
                         for seed in seeds]
                shares = [c[1] for c in cells if c[1] is not None]
                share = f"{np.median(shares):.2f}" if len(shares) == len(cells) else "n/a"
                row = f"| {n_eng} | {b} | " + " | ".join(spread([c[0][p] for c in cells]) for p in policies)
                pre = "/".join(str(sum(c[2][i] for c in cells)) for i in range(len(cells[0][2])))   # over the draws
                row += f" | {share} | {pre} |"
                if many and "v3" in policies:
                    row += f" {sum(c[0]['v3'] < 1 for c in cells)} of {len(cells)} |"
                elif many:
                    row += " |"
                print(row, flush=True)


if __name__ == "__main__":
    main()
