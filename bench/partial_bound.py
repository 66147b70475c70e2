"""Benchmark: can any schedule meet issue 48's partial-rollout targets on each member of the workload family?

    .venv/bin/python bench/partial_bound.py --jobs 2                 # every member, B = 128 and 512, 5 seeds
    .venv/bin/python bench/partial_bound.py --family heavy --batch-sizes 128 --jobs 2
    .venv/bin/python bench/partial_bound.py --trace my-trace.jsonl --batch-sizes 128   # a trace of your own

A partial-rollout stream's steady step cannot be shorter, on average, than the engine time of the tokens it
consumes: every consumed token is generated once, in this step or an earlier one, and in a steady state the
steps generate as many tokens as they consume. The **work bound** is that time at full occupancy (each token at
its least cost: the per-step cost shared by the engine's full batch, its own attention over its context, the
prompt prefilled once per engine; ``pdsr simulate``'s ``work_bound_s``) over the engines. Over the on-policy step
at the same B it is the least step / on-policy step that any schedule of these engines reaches while it consumes
the responses as drawn (a schedule that restarts long responses for fresh, shorter draws consumes fewer tokens;
that is the token ratio of docs/benchmarks.md).

The **partial-budget floor** (:mod:`pdsr_sdk.sim.partial_floor`) adds what the 10% budget on partial tokens costs
at least: most of a long response must then be made within the step that consumes it, so its engine runs few
enough requests that its steps are short, and those tokens cost more than a full engine's share. It is the least
equal step in which the engines make the work and that extra; it assumes steps of equal length.

The **step-count floor** (:mod:`pdsr_sdk.sim.step_floor`) counts the steps those tokens take instead: a response
makes one token a step, each step pays ``c0``, and a long request's attention makes its steps long, so the
engines cannot share a long response's short steps with more requests than the stream has work for; and a step
holds no more context than the KV cache, which bounds the requests a step shares where contexts are long. It holds for
any placement, migration and order, under the same equal-step assumption. Both floors are lower bounds; the
higher decides.

For each member (its pinned profile, K and seeds; 6 + 2 equal engines, S = 2) it runs the stream once without
over-provision (F = 0, nothing carried, nothing restarted: the consumed tokens are the trace's) and prints, per B,
the work bound, the two floors and F = 0's step, each over the on-policy step and as the median [min, max] over the
seeds, beside the target for the member's kind: where the higher floor's median is above the worst-member target,
no schedule of these engines (in equal steps) meets it on that member. Then, per B, the median over the
members the median target covers (`informative`, `seed002`, `heavy`, the recorded traces) of their higher
floors' medians: above the median target, no schedule meets that either. All in virtual time (the machine's speed does
not enter). Runtime: 25 minutes for the family (eleven members, B = 128 and 512, five seeds) with `--jobs 2` on
two cores.
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_args import at_least, check_members, count_list, existing_file, int_list

from pdsr_sdk.traces import Measurement

spread = Measurement.spread   # median [min, max] over a member's seeds

#: issue 48's targets, step / on-policy step at the fastest F within 10% partial tokens: (median, worst member)
TARGETS = {128: (0.45, 0.50), 512: (0.62, 0.66)}
#: the partial-token budget the targets are set under
BUDGET = 0.1
#: the KV-bound long-reasoning members' own target (B = 128 only)
KV_BOUND = ("kv-bound", "longcot")
KV_TARGET = 0.75


def bound_cell(name: str, seed: int, b: int) -> tuple[float, float, float, float]:
    """(work bound, partial-budget floor, F = 0's steady step, step-count floor), each over the on-policy step,
    for one draw of member ``name``."""
    from pdsr_sdk.traces import workload

    member = workload(name)
    k = member.measure.steps
    return bounds(member.trace(groups=(k + 1) * b, n=8, seed=seed), b, k, dict(member.measure.profile))


def bounds(trace, b: int, k: int, prof: dict) -> tuple[float, float, float, float]:
    """:func:`bound_cell`'s four numbers for the first (K + 1) x B groups of ``trace``, K steps of B groups on
    6 + 2 equal engines of profile ``prof``."""
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.steps import simulate_steps, stream_floors, stream_lengths

    groups = (k + 1) * b
    if trace.num_groups < groups:
        raise SystemExit(f"{trace.source or 'the trace'}: {k} steps of {b} groups need {groups} groups; it has "
                         f"{trace.num_groups}")
    cfg = SimulateConfig(policy="v3", fast=6, heavy=2, steps=k, step_groups=b, over_provision=0.0,
                         max_staleness=2, kv_on_update="keep", timeline=False, profiles={"fast": prof, "heavy": prof})
    report = simulate_steps(trace, cfg)
    run = report.runs[0]
    base = report.baseline_step_s
    lengths, prompts = stream_lengths(trace, cfg, groups)
    floor, steps = stream_floors(lengths, prompts, run.work_bound_s, cfg, steps=k + 1, budget=BUDGET)
    return run.work_bound_s / base, floor / base, run.steady_step_s / base, steps / base


def _cell(args: tuple[str, int, int]) -> tuple[str, int, int, tuple[float, float, float, float]]:
    name, seed, b = args
    return name, seed, b, bound_cell(name, seed, b)


def target_for(name: str, b: int) -> tuple[float, float] | None:
    """The member's (median, worst) target at ``b`` (None: the issue sets none there)."""
    if name in KV_BOUND:
        return (KV_TARGET, KV_TARGET) if b == 128 else None
    if name.startswith("uninformative") or name == "multi-turn":
        return None
    return TARGETS.get(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="all", help="members, comma-separated, or all [default: all]")
    ap.add_argument("--batch-sizes", type=count_list, default="128,512", help="B, comma-separated [default: 128,512]")
    ap.add_argument("--seeds", type=int_list, default=None,
                    help="trace seeds, comma-separated [default: each member's pinned]")
    ap.add_argument("--jobs", type=int, default=1, help="cells run at once, in worker processes (one a core)")
    ap.add_argument("--trace", type=existing_file, default=None,
                    help="a length trace of your own (`pdsr trace synth`, or one recorded "
                                                  "from a run) instead of the family: its first (K + 1) x B groups")
    ap.add_argument("--steps", type=at_least(1), default=10, help="with --trace: K [default: 10]")
    ap.add_argument("--profile", default=None, help="with --trace: an engine profile file (`pdsr simulate "
                                                    "--profile`; its fast pool) [default: the family's equal engine]")
    args = ap.parse_args()
    if args.trace is not None:
        return own_trace(args)

    from pdsr_sdk.traces import WORKLOADS, workload

    # multi-turn: no staleness bound applies (its samples are never restarted) and the issue sets it no target
    names = ([n for n in WORKLOADS.names() if n != "multi-turn"] if args.family == "all"
             else args.family.split(","))
    check_members(ap, names)
    sizes = args.batch_sizes
    cells = [(n, s, b) for n in names for b in sizes
             for s in (args.seeds if args.seeds else workload(n).measure.seeds)]
    out: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
    ex = None
    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        ex = ProcessPoolExecutor(args.jobs)
    try:
        for name, seed, b, r in (ex.map(_cell, cells) if ex is not None else map(_cell, cells)):
            out.setdefault((name, b), []).append(r)   # each cell's line as it is done: the progress of a long run
            print(f"# {name} seed {seed} B {b}: work bound {r[0]:.4f}, partial-budget floor {r[1]:.4f}, step-count "
                  f"floor {r[3]:.4f}, F = 0 {r[2]:.4f}", flush=True)
    finally:
        if ex is not None:
            ex.shutdown()

    print("\n| member | B | work bound / on-policy step | partial-budget floor | step-count floor "
          "| F = 0 step / on-policy step | target (median / worst) | any schedule |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, b), rs in out.items():
        floor = [max(r[1], r[3]) for r in rs]
        target = target_for(name, b)
        if target is None:
            verdict, shown = "no target", "-"
        else:
            shown = f"{target[0]:.2f} / {target[1]:.2f}"
            verdict = "out of reach" if float(np.median(floor)) > target[1] else "within reach"
        print(f"| `{name}` | {b} | {spread([r[0] for r in rs])} | {spread([r[1] for r in rs])} "
              f"| {spread([r[3] for r in rs])} | {spread([r[2] for r in rs])} | {shown} | {verdict} |")
    for b in sizes:
        covered = [float(np.median([max(r[1], r[3]) for r in rs])) for (name, bb), rs in out.items()
                   if bb == b and name not in KV_BOUND and target_for(name, b) is not None]
        if covered and b in TARGETS:
            med = float(np.median(covered))
            print(f"\nB = {b}: the median over {len(covered)} members of the higher floor is {med:.3f} "
                  f"against the median target {TARGETS[b][0]:.2f}: "
                  + ("out of reach" if med > TARGETS[b][0] else "within reach"))


def own_trace(args: argparse.Namespace) -> None:
    """``--trace``: the work bound, the two floors and F = 0's step for the given trace, a row per B."""
    from pdsr_sdk.sim.config import load_profile_file
    from pdsr_sdk.traces import read_trace
    from pdsr_sdk.traces.family import EQUAL_ENGINE

    from pdsr_sdk.errors import PdsrError

    try:   # a file that is no trace or no profile: one line naming it
        trace = read_trace(args.trace)
        pools = load_profile_file(args.profile) if args.profile else {"fast": dict(EQUAL_ENGINE)}
    except PdsrError as exc:
        raise SystemExit(f"error: {exc}") from None
    prof = dict(pools.get("fast") or pools["heavy"])
    print(f"{args.trace}: 6 + 2 equal engines, K = {args.steps}, S = 2, within {BUDGET:.0%} partial tokens; "
          f"step / on-policy step")
    print("\n| B | work bound | partial-budget floor | step-count floor | F = 0 step |")
    print("|---|---|---|---|---|")
    for b in args.batch_sizes:
        bound, floor, f0, steps = bounds(trace, b, args.steps, prof)
        print(f"| {b} | {bound:.3f} | {floor:.3f} | {steps:.3f} | {f0:.3f} |", flush=True)


if __name__ == "__main__":
    main()
