"""Benchmark: speculative decoding in the simulator, on a 7B model's H100 profile: v3 with speculation against
baseline without, on the workload family, sweeping the tokens a step yields, and at what bench/spec.py measured.

    .venv/bin/python bench/spec_sim.py [--family seed002,longcot] [--batch-sizes 128,512] [--seeds 101,102,103]
                                       [--tokens-per-step 1.6,2,2.5,3] [--max-batch 32] [--engines 8]
                                       [--acceptance bench/data/spec-acceptance-smollm2.json --methods ngram,group]
                                       [--tail-mean]

Each member's trace (``pdsr trace synth --family NAME``, its pinned seeds) runs one on-policy batch per seed on
equal engines of ``bench/data/profile-h100-7b.yaml`` (a 7B model on one H100: step costs from
``bench/verify_cost.py``'s measurement, KV cache from the H100's memory; the member's ``max_model_len``),
a quarter of them heavy. Speculation (``EngineProfile.speculation``, docs/simulate.md) makes a token cost a
step's price over the tokens the step yields, while at most ``--max-batch`` requests run on the engine; above it
steps are plain. The sweep's steps each draft 4 tokens (a verify step: 1.08x a decode step at batch 1 to 1.41x at
256, measured) and yield ``--tokens-per-step``; ``--acceptance`` adds a run per method (``--methods``) at what
``bench/spec.py`` measured, tokens per step counting the steps that drafted nothing
(:func:`~pdsr_sdk.sim.speculation.speculation_from_acceptance`): by response position where the file has it, and
with ``--tail-mean`` also a run per method at its tail's mean everywhere (``METHOD-tail``).

Prints per member and B: each run's makespan / baseline's (no speculation) as the median [min, max] over the
seeds, and the share of tokens generated while drafting ran.

``--steps K``: partial rollout instead (v3, ``pdsr simulate --steps K --max-partial-share 0.1 --max-staleness 2``
with and without speculation): the fastest over-provision within 10% partial tokens, its steady step over the
on-policy baseline step without speculation, and its partial share.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench_args import at_least, check_members, count_list, existing_file, float_list, int_list, number_at_least

from pdsr_sdk.traces import Measurement

spread = Measurement.spread   # median [min, max] over a member's seeds

PROFILE = Path(__file__).resolve().parent / "data" / "profile-h100-7b.yaml"


def run_member(fam: str, b: int, seed: int, engines: int, specs: dict[str, dict]) -> dict[str, tuple]:
    """Makespan / baseline's and the drafted share of each run on one trace draw."""
    from pdsr_sdk.sim.config import SimulateConfig, load_profile_file
    from pdsr_sdk.sim.driver import run_policy, trace_batches
    from pdsr_sdk.traces import workload

    member = workload(fam)
    gpu = load_profile_file(PROFILE)["fast"]
    prof = {**gpu, "max_model_len": member.measure.profile["max_model_len"]}
    trace = member.trace(groups=b, n=8, seed=seed)
    heavy = engines // 4
    out: dict[str, tuple] = {}

    def run(policy: str, spec: dict | None) -> tuple[float, float]:
        p = dict(prof, speculation=spec)
        cfg = SimulateConfig(fast=engines - heavy, heavy=heavy, batch_size=b, timeline=False,
                             profiles={"fast": p, "heavy": p})
        r = run_policy(trace_batches(trace, cfg), cfg, policy, record=False)
        drafted = sum(getattr(e, "drafted_tokens", 0) for e in r.engines)
        return r.makespan_s, drafted / r.tokens if r.tokens else 0.0

    base, _ = run("baseline", None)
    out["baseline"] = (1.0, 0.0)
    v3, _ = run("v3", None)
    out["v3"] = (v3 / base, 0.0)
    for label, spec in specs.items():
        for policy in ("baseline", "v3"):
            t, share = run(policy, spec)
            out[f"{policy} spec {label}"] = (t / base, share)
    return out


def run_partial(fam: str, b: int, seed: int, engines: int, specs: dict[str, dict],
                steps: int, over_provision: float | None = None) -> dict[str, tuple]:
    """Partial rollout within 10% partial tokens: (steady step / on-policy baseline step without speculation,
    partial share, the F picked) of v3 without and with each speculation."""
    from pdsr_sdk.sim.config import SimulateConfig, load_profile_file
    from pdsr_sdk.sim.steps import simulate_steps
    from pdsr_sdk.traces import workload

    member = workload(fam)
    gpu = load_profile_file(PROFILE)["fast"]
    prof = {**gpu, "max_model_len": member.measure.profile["max_model_len"]}
    trace = member.trace(groups=b * (steps + 4) * 2, n=8, seed=seed)
    heavy = engines // 4
    out: dict[str, tuple] = {}
    base_step = None
    for label, spec in [(None, None), *specs.items()]:
        p = dict(prof, speculation=spec)
        search = {"max_partial_share": 0.1} if over_provision is None else {"over_provision": over_provision}
        cfg = SimulateConfig(fast=engines - heavy, heavy=heavy, batch_size=b, step_groups=b, steps=steps,
                             max_staleness=2, policy="v3", timeline=False, profiles={"fast": p, "heavy": p},
                             **search)
        report = simulate_steps(trace, cfg)
        if base_step is None:
            base_step = report.baseline_step_s   # on-policy baseline, no speculation
        pick = report.fastest_within() if over_provision is None else report.runs[0]
        name = "v3 partial" + (f" spec {label}" if label else "")
        out[name] = ((pick.steady_step_s / base_step, pick.partial_share, pick.over_provision) if pick
                     else (float("nan"), float("nan"), float("nan")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="seed002,longcot", help="members, comma-separated")
    ap.add_argument("--batch-sizes", type=count_list, default="128,512", help="B, comma-separated")
    ap.add_argument("--seeds", type=int_list, default="101,102,103", help="trace draws (the family pins 101-105)")
    ap.add_argument("--tokens-per-step", default="1.3,1.45,1.6,2,3",
                    help="tokens a step yields per request while drafting 4 tokens every step, swept ('' for none)")
    ap.add_argument("--acceptance", type=existing_file, default=None,
                    help="bench/spec.py's acceptance file: a run per method")
    ap.add_argument("--methods", default="ngram,group", help="with --acceptance: its methods, comma-separated")
    ap.add_argument("--tail-mean", action="store_true",
                    help="with --acceptance: also a run per method at its tail's mean acceptance everywhere "
                         "(METHOD-tail), against the acceptance by response position")
    ap.add_argument("--max-batch", type=at_least(1), default=32, help="drafting only while at most this many run")
    ap.add_argument("--engines", type=at_least(1), default=8, help="equal simulated engines, a quarter of them heavy")
    ap.add_argument("--steps", type=at_least(1), default=None,
                    help="partial rollout over K steps instead (see above)")
    ap.add_argument("--over-provision", type=number_at_least(0), default=None,
                    help="with --steps: this F instead of the search for the fastest within 10%% partial tokens")
    args = ap.parse_args()
    check_members(ap, args.family.split(","))
    try:
        swept = float_list(args.tokens_per_step) if args.tokens_per_step.strip() else []
    except argparse.ArgumentTypeError as exc:
        ap.error(f"argument --tokens-per-step: {exc}")
    if swept and min(swept) < 1:   # a step yields its own token at least
        ap.error(f"argument --tokens-per-step: {min(swept):g} is below 1")
    specs = {f"{g:g}": {"tokens_per_step": g, "max_batch": args.max_batch} for g in swept}
    if args.acceptance is not None:
        from pdsr_sdk.errors import PdsrError
        from pdsr_sdk.sim.speculation import speculation_from_acceptance

        for method in args.methods.split(","):
            try:
                spec = speculation_from_acceptance(args.acceptance, method, max_batch=args.max_batch)
            except PdsrError as exc:   # not an acceptance file, or no such method in it
                ap.error(f"--acceptance / --methods: {exc}")
            specs[method] = spec
            print(f"{method}: {spec['tokens_per_step']:.4f} tokens a step, draft load {spec['draft_load']:.3f} "
                  f"in the tail, {len(spec.get('by_position', ()))} position bins (from {args.acceptance.name})")
            if args.tail_mean:
                specs[f"{method}-tail"] = speculation_from_acceptance(args.acceptance, method, max_batch=args.max_batch,
                                                                      by_position=False)
    seeds = args.seeds
    print(f"{args.engines} engines (H100, 7B), max_batch {args.max_batch}, seeds {seeds}")
    for fam in args.family.split(","):
        for b in args.batch_sizes:
            if args.steps:
                cells = [run_partial(fam, b, seed, args.engines, specs, args.steps, args.over_provision)
                         for seed in seeds]
                print(f"\n### {fam}, B = {b}, {args.steps} steps\n\n| run | steady step / on-policy baseline | "
                      f"partial share | F |\n|---|---|---|---|")
                for name in cells[0]:
                    print(f"| {name} | {spread([c[name][0] for c in cells])} | {spread([c[name][1] for c in cells])} "
                          f"| {spread([c[name][2] for c in cells])} |", flush=True)
                continue
            cells = [run_member(fam, b, seed, args.engines, specs) for seed in seeds]
            print(f"\n### {fam}, B = {b}\n\n| run | makespan / baseline | drafted share |\n|---|---|---|")
            for name in cells[0]:
                print(f"| {name} | {spread([c[name][0] for c in cells])} | "
                      f"{spread([c[name][1] for c in cells])} |", flush=True)


if __name__ == "__main__":
    main()
