"""Benchmark: does each v3 rule earn its place (issue 48, item 4)? v3 with one rule disabled against v3 with
every rule, across the workload family, on-policy and with partial rollout.

    .venv/bin/python bench/rules.py --quick                         # smoke: two members, one seed, K = 5
    .venv/bin/python bench/rules.py [--family all] [--modes batch,stream] [--batch-sizes 128]
                                    [--batches 2] [--over-provision 0.25] [--steps K] [--seeds 101,102]

For each member of the workload family (pdsr_sdk.traces.WORKLOADS; its pinned engine profile and its five
pinned seeds) and each rule of ``V3Settings.disable`` (pdsr_sdk.policies.v3.settings.RULES) it runs v3 with
``disable: [rule]`` and v3 with every rule on, on the same trace draw, and takes the ratio disabled / enabled
(above 1: the rule gains, the run is faster with it):

- ``batch`` (on-policy): bench/policies.py's cells (6 + 2 equal engines, B groups of 8 a batch, ``--batches``
  batches), the ratio of the makespans;
- ``stream`` (partial rollout): ``pdsr simulate --steps K --over-provision F --max-staleness 2 --kv-on-update
  keep`` (6 + 2 equal engines, B = 128 groups a step), the ratio of the steady step times (steps 3 to K-1).
  One fixed F (0.25) instead of the partial-share search of bench/stream_oracle.py, which would take hours.

Prints one table per mode: for each rule the median over each member's seeds of the ratio, the median of the
members' medians (the family's median) and the worst member (lowest median). The issue's criterion removes a
rule whose family median is not above 1, or whose worst member is below 0.99. All in virtual time: one run gives
the same numbers on any machine (the machine's noise does not enter).

Runtime on one core: the defaults (B = 128, 1 batch; the stream at each member's pinned K, capped at
``--steps``) take about 20 minutes for the family; --quick a minute.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from bench_args import at_least, count_list, existing_file, family_members, int_list, number_at_least

MODES = ("batch", "stream")
QUICK = dict(family="informative,kv-bound", seeds="101", batches=1, steps=5, modes="batch,stream")
DEFAULTS = dict(family="all", seeds=None, batches=1, steps=5, modes="batch,stream")


def variants(rules: tuple[str, ...], together: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """``{label: disable list}``: ``all`` (every rule on), then one per rule switched off, then (``together``
    given) ``together``: those rules switched off at once (the check of the set that would remain)."""
    out = {"all": [], **{r: [r] for r in rules}}
    if together:
        out["together"] = list(together)
    return out


def rule_ratios(times: dict[str, float]) -> dict[str, float]:
    """Each rule's ratio disabled / enabled from the times (makespan or step time) of the variants of one cell:
    above 1 means the run is faster with the rule on."""
    ref = times["all"]
    return {r: t / ref for r, t in times.items() if r != "all"}


def summarize(cells: dict[str, dict[int, dict[str, float]]]) -> dict[str, dict]:
    """``cells[member][seed][rule]`` (ratios) -> per rule: the members' medians over their seeds, the family's
    median (the median of the members' medians), the worst member (the lowest median) with its value, and whether
    the rule changed any cell (``acts``: some ratio is not exactly 1)."""
    out: dict[str, dict] = {}
    rules = next(iter(next(iter(cells.values())).values())).keys()
    for rule in rules:
        med = {m: float(np.median([per_seed[rule] for per_seed in seeds.values()])) for m, seeds in cells.items()}
        worst = min(med, key=med.get)
        acts = any(per_seed[rule] != 1.0 for seeds in cells.values() for per_seed in seeds.values())
        out[rule] = dict(members=med, family=float(np.median(list(med.values()))), worst=(worst, med[worst]),
                         acts=acts)
    return out


def verdict(row: dict, tolerance: float = 0.01) -> str:
    """The issue's criterion: keep a rule that gains on the family's median (> 1) and costs at most
    ``tolerance`` on every member's median; otherwise remove it."""
    if not row.get("acts", True):
        return "no effect in this mode"
    reasons = []
    if row["family"] <= 1.0:
        reasons.append("no family gain")
    if row["worst"][1] < 1.0 - tolerance:
        reasons.append(f"costs {1 - row['worst'][1]:.1%} on {row['worst'][0]}")
    return "keep" if not reasons else "remove (" + "; ".join(reasons) + ")"


def batch_times(member: str, seed: int, b: int, batches: int, labels: dict[str, list[str]]
                ) -> dict[str, tuple[float, int]]:
    """On-policy makespan and preemptions (all engines) of each variant on one draw of ``member``
    (bench/policies.py's cell: 6 + 2 engines)."""
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.driver import run_policy, trace_batches
    from pdsr_sdk.traces import workload

    m = workload(member)
    prof = dict(m.measure.profile)
    trace = m.trace(groups=b * batches, n=8, seed=seed)
    out = {}
    for label, disable in labels.items():
        cfg = SimulateConfig(fast=6, heavy=2, batch_size=b, timeline=False, profiles={"fast": prof, "heavy": prof},
                             policy_settings={"v3": {"disable": disable}})
        run = run_policy(trace_batches(trace, cfg), cfg, "v3", record=False)
        out[label] = (run.makespan_s, sum(e.preemptions for e in run.engines))
    return out


def stream_times(member: str, seed: int, b: int, f: float, max_steps: int, labels: dict[str, list[str]]
                 ) -> dict[str, tuple[float, int]]:
    """Steady step time and preemptions (all engines, every step) of each variant in a partial-rollout stream of
    ``member``'s draw (6 + 2 engines, B groups a step, over-provision ``f``, staleness at most 2, KV kept over an
    update, K = min(pinned, ``max_steps``))."""
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.steps import run_steps
    from pdsr_sdk.traces import workload

    m = workload(member)
    k = min(m.measure.steps, max_steps)
    prof = dict(m.measure.profile)
    trace = m.trace(groups=(k + 2) * b, n=8, seed=seed)
    out = {}
    for label, disable in labels.items():
        cfg = SimulateConfig(policy="v3", fast=6, heavy=2, steps=k, step_groups=b, max_staleness=2,
                             kv_on_update="keep", timeline=False, profiles={"fast": prof, "heavy": prof},
                             policy_settings={"v3": {"disable": disable}})
        run = run_steps(trace, cfg, "v3", f)
        out[label] = (run.steady_step_s, sum(e.preemptions for e in run.engines))
    return out


def read_log(lines) -> dict[tuple[str, int], dict[str, dict[int, dict[str, float]]]]:
    """The cells of ``--per-seed`` lines (``MODE B=b MEMBER SEED: rule ratio, ...``), by (mode, B): a table from an
    interrupted run's log (``--from-log``)."""
    out: dict = {}
    for line in lines:
        head, sep, body = line.partition(": ")
        parts = head.split()
        if not sep or len(parts) != 4 or parts[0] not in MODES or not parts[1].startswith("B="):
            continue
        ratios = {r: float(v) for r, v in (item.split() for item in body.split(", "))}
        out.setdefault((parts[0], int(parts[1][2:])), {}).setdefault(parts[2], {})[int(parts[3])] = ratios
    return out


def table(mode: str, summary: dict[str, dict], members: list[str], caption: str) -> str:
    """Markdown: rule x member medians, the family's median, the worst member and the criterion's verdict."""
    short = {m: m.replace("uninformative", "uninf").replace("-by-prompt", "-bp").replace("recorded-", "rec-")
             for m in members}
    lines = [caption, "", "| rule | " + " | ".join(short[m] for m in members) + " | family | worst | criterion |",
             "|---|" + "---|" * (len(members) + 3)]
    for rule, row in summary.items():
        cells = " | ".join(f"{row['members'][m]:.3f}" for m in members)
        if rule == "together":   # the set without them: at most 1 (no slower) on the family, 1.01 on every member
            worst = max(row["members"].values())
            check = "holds" if row["family"] <= 1.0 and worst <= 1.01 else f"slower (worst member {worst:.3f})"
        else:
            check = verdict(row)
        lines.append(f"| {rule} | {cells} | {row['family']:.3f} | {short[row['worst'][0]]} {row['worst'][1]:.3f} | "
                     f"{check} |")
    return "\n".join(lines)


def preemption_table(preempted: dict[str, dict[str, list[int]]], members: list[str]) -> str:
    """Markdown: each variant's preemptions (requests evicted from a full KV cache and recomputed, all engines),
    summed over the seeds, per member and over the family. A rule whose time does not pay may still keep engines
    from thrashing; the time counts a recompute's prefill, and this shows how often it happened."""
    lines = ["Preemptions, summed over the seeds", "", "| variant | " + " | ".join(members) + " | family |",
             "|---|" + "---|" * (len(members) + 1)]
    for variant, per_member in preempted.items():
        sums = [sum(per_member[m]) for m in members]
        lines.append(f"| {variant} | " + " | ".join(map(str, sums)) + f" | {sum(sums)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default=None, help="members, comma-separated, or all [default: all]")
    ap.add_argument("--seeds", default=None, help="trace seeds, comma-separated [default: each member's pinned]")
    ap.add_argument("--modes", default=None, help="batch (on-policy), stream (partial rollout) [default: both]")
    ap.add_argument("--rules", default=None, help="rules to disable one at a time [default: every rule]")
    ap.add_argument("--batch-sizes", type=count_list, default="128", help="on-policy B, comma-separated [default: 128]")
    ap.add_argument("--batches", type=at_least(1), default=None, help="on-policy batches per draw [default: 1]")
    ap.add_argument("--step-groups", type=at_least(1), default=128, help="stream B [default: 128]")
    ap.add_argument("--over-provision", type=number_at_least(0), default=0.25, help="stream F [default: 0.25]")
    ap.add_argument("--steps", type=at_least(1), default=None, help="stream K at most this (each member's pinned K "
                                                            "otherwise) [default: 5]")
    ap.add_argument("--together", default=None, help="also these rules disabled at once (row 'together'): the "
                                                     "check of the set that remains once they are removed")
    ap.add_argument("--per-seed", action="store_true", help="also print every cell's ratios")
    ap.add_argument("--from-log", metavar="FILE", type=existing_file,
                    help="print the tables of the --per-seed lines of an earlier run's "
                                                       "output (e.g. one that was interrupted) instead of running")
    ap.add_argument("--quick", action="store_true", help="smoke run: " + ", ".join(f"--{k.replace('_', '-')} {v}"
                                                                                   for k, v in QUICK.items()))
    args = ap.parse_args()
    defaults = QUICK if args.quick else DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        seeds = int_list(args.seeds) if args.seeds else None
    except argparse.ArgumentTypeError as exc:
        ap.error(f"argument --seeds: {exc}")

    if args.from_log:
        with open(args.from_log) as fh:
            for (mode, b), cells in read_log(fh).items():
                n = {m: len(seeds) for m, seeds in cells.items()}
                caption = (f"{mode}, B = {b}, from {args.from_log}; median over "
                           + ", ".join(f"{m} {k}" for m, k in n.items()) + " seeds")
                print("\n" + table(mode, summarize(cells), list(cells), caption) + "\n")
        return

    from pdsr_sdk.policies.v3.settings import RULES
    from pdsr_sdk.traces import workload

    members = family_members(ap, args.family)
    modes = args.modes.split(",")
    if set(modes) - set(MODES):
        ap.error(f"--modes: of {', '.join(MODES)}")
    rules = tuple(args.rules.split(",")) if args.rules is not None else RULES
    rules = tuple(r for r in rules if r)   # --rules "" with --together: the set alone
    if set(rules) - set(RULES):
        ap.error(f"--rules: of {', '.join(RULES)}")
    together = tuple(args.together.split(",")) if args.together else ()
    if set(together) - set(RULES):
        ap.error(f"--together: of {', '.join(RULES)}")
    labels = variants(rules, together)
    runs = [("batch", b) for b in args.batch_sizes] if "batch" in modes else []
    runs += [("stream", args.step_groups)] if "stream" in modes else []
    for mode, b in runs:
        t0 = time.perf_counter()
        cells: dict[str, dict[int, dict[str, float]]] = {}
        preempted: dict[str, dict[str, list[int]]] = {}   # variant -> member -> per seed
        for name in members:
            for seed in seeds or workload(name).measure.seeds:
                got = (batch_times(name, seed, b, args.batches, labels) if mode == "batch" else
                       stream_times(name, seed, b, args.over_provision, args.steps, labels))
                cells.setdefault(name, {})[seed] = rule_ratios({r: t for r, (t, _) in got.items()})
                for r, (_, pre) in got.items():
                    preempted.setdefault(r, {}).setdefault(name, []).append(pre)
                if args.per_seed:
                    print(f"{mode} B={b} {name} {seed}: " + ", ".join(f"{r} {v:.3f}" for r, v in
                                                                      cells[name][seed].items()), flush=True)
                    print(f"{mode} B={b} {name} {seed} preemptions: " + ", ".join(f"{r} {pre}" for r, (_, pre) in
                                                                                  got.items()), flush=True)
        seeds_label = args.seeds or "each member's 5 pinned seeds"
        if mode == "batch":
            caption = (f"On-policy, B = {b}, {args.batches} batches a draw, 6 + 2 equal engines; makespan with the "
                       f"rule disabled / with every rule, median over {seeds_label} ({time.perf_counter() - t0:.0f} s)")
        else:
            caption = (f"Partial rollout, B = {b}, F = {args.over_provision:g}, staleness <= 2, keep, K = min(pinned, "
                       f"{args.steps}), 6 + 2 equal engines; steady step time with the rule disabled / with every "
                       f"rule, median over {seeds_label} ({time.perf_counter() - t0:.0f} s)")
        print("\n" + table(mode, summarize(cells), members, caption) + "\n", flush=True)
        print(preemption_table(preempted, members) + "\n", flush=True)


if __name__ == "__main__":
    main()
