"""Benchmark: how far better predictions could take partial rollout across steps (issue 20's B = 512 target),
across the workload family.

    .venv/bin/python bench/stream_oracle.py --quick                # every member, B = 128, v3's own order
    .venv/bin/python bench/stream_oracle.py [--family informative,seed002] [--seeds 7,37] [--step-groups 512]
                                            [--orders v3,group_median,sample] [--updates all,staggered]

For each member of the workload family (pdsr_sdk.traces.WORKLOADS, `pdsr trace synth --family list`;
docs/notes/workload-family.md) and each of its pinned seeds (five: 101-105; --seeds replaces them) it runs
the partial-share search of `pdsr simulate --steps K --max-staleness 2 --max-partial-share 0.1
--kv-on-update keep` (6 + 2 equal engines of the member's pinned profile, its pinned K) with v3 and with
v3 told what no real engine knows, in the place of its ranked pool's order (``V3Policy.rank_key``):

- ``group_median``: each group ranked by the median of its recorded lengths, longest first: a perfect
  per-prompt predictor (a prompt's difficulty, as many earlier epochs of it would tell);
- ``group_max``: each group by its longest recorded response (also knowing the noise of this draw);
- ``sample``: every sample by its own recorded length, longest first (knowing the noise of each sample).

Everything else is v3's (placement, siblings first on an engine, the lane, segments). Prints, per member and order,
the fastest over-provision within 10% partial tokens as the median [min, max] over the seeds: its F, steady step /
on-policy step, partial share, the ratio per consumed token, and the work bound (the steady step's consumed tokens
at full occupancy, ``pdsr simulate``'s ``work_bound_s``) over the on-policy step; ``--updates all,staggered`` also
runs each search with `pdsr simulate --update staggered` (its search goes on to F = 1.5), both on traces of (K + 2)
x B groups; ``--updates auto`` runs both in one search and takes the faster (the update it took beside each seed).
``--orders v3,sample`` adds the true-length reference (with --per-seed, one row per seed too). All in virtual time:
one run gives the same numbers on any machine. A search takes about 2-3 minutes per order and trace at B = 512 on
one core (kv-bound longer), so the defaults take hours. --quick (B = 128, v3's order only) takes 1 to 9 minutes a
trace (kv-bound and heavy the longest), about two hours for the whole family's forty traces on one core; --jobs N
runs N searches at once.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Literal

from bench_args import at_least, family_members, int_list, share

from pydantic import Field

from pdsr_sdk.dispatch.types import Sample
from pdsr_sdk.policies.v3 import V3Policy
from pdsr_sdk.policies.v3.settings import V3Settings
from pdsr_sdk.traces import Measurement

spread = Measurement.spread   # median [min, max] over a member's seeds

ORDERS = ("v3", "group_median", "group_max", "sample")
UPDATES = ("all", "staggered", "auto")
EQUAL = dict(max_num_seqs=256, kv_cache_tokens=262144)


class OracleOrderSettings(V3Settings):
    """v3's settings and which true lengths rank its pool."""

    order: Literal["group_median", "group_max", "sample"] = Field(
        "group_median", description="What ranks the pool, longest first: the group's median recorded length, its "
                                    "longest, or the sample's own.")


class OracleOrderPolicy(V3Policy):
    """v3 whose ranked pool is ordered by the trace's recorded lengths (simulator only)."""

    name = "v3-oracle-order"
    simulation_only = True
    config_model = OracleOrderSettings

    def rank_key(self, s: Sample) -> tuple[int, float]:
        lengths = s.group.target_lengths
        if self.cfg.order == "sample":
            return 1, -float(s.max_tokens)    # a forced sample's max_tokens is its recorded length
        if self.cfg.order == "group_max":
            return 1, -float(max(lengths))
        return 1, -float(sorted(lengths)[len(lengths) // 2])


def fastest_within(trace, order: str, b: int, budget: float, profile: dict | None = None, steps: int = 10,
                   update: str = "all"):
    """(F, ratio, partial share, ratio per token, work bound / on-policy step, update) of the fastest run within
    ``budget`` partial tokens (``update`` auto: of either update)."""
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.steps import simulate_steps

    policy = "v3" if order == "v3" else OracleOrderPolicy.name
    settings = {} if order == "v3" else {policy: {"order": order}}
    prof = dict(profile or EQUAL)
    cfg = SimulateConfig(policy=policy, policy_settings=settings, fast=6, heavy=2, steps=steps, step_groups=b,
                         max_staleness=2, max_partial_share=budget, kv_on_update="keep", timeline=False,
                         profiles={"fast": prof, "heavy": prof}, update=update)
    report = simulate_steps(trace, cfg)
    pick = report.fastest_within()
    if pick is None:
        return None
    return (pick.over_provision, report.ratio(pick), pick.partial_share, report.ratio_per_token(pick),
            pick.work_bound_s / report.baseline_step_s, pick.update)


def search(name: str, seed: int, order: str, update: str, b: int, budget: float, wide: bool):
    """``fastest_within`` for member ``name``'s trace of ``seed`` on its pinned profile and K (a worker's task);
    ``wide``: a trace of (K + 2) x B groups, what a staggered update's search to F = 1.5 needs, for either update."""
    from pdsr_sdk.policies import POLICIES
    from pdsr_sdk.traces import workload

    if OracleOrderPolicy.name not in POLICIES:
        POLICIES.register(OracleOrderPolicy.name, OracleOrderPolicy)   # this process only
    member = workload(name)
    k = member.measure.steps
    trace = member.trace(groups=(k + 1 + wide) * b, n=8, seed=seed)
    return fastest_within(trace, order, b, budget, dict(member.measure.profile), k, update)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="all", help="members of the workload family, comma-separated, or all")
    ap.add_argument("--seeds", type=int_list, default=None,
                    help="trace seeds, comma-separated (default: each member's pinned seeds)")
    ap.add_argument("--quick", action="store_true", help="--step-groups 128 --orders v3 (flags given still win)")
    ap.add_argument("--step-groups", type=at_least(1), default=None, help="B [default: 512]")
    ap.add_argument("--max-partial-share", type=share, default=0.1,
                    help="the search's budget: the most partial tokens' share of a step's, in (0, 1) [default: 0.1]")
    ap.add_argument("--orders", default=None, help=f"comma-separated, of {', '.join(ORDERS)} "
                                                   f"[default: v3,group_median,sample]")
    ap.add_argument("--updates", default="all", help="comma-separated, of all, staggered and auto (`pdsr simulate "
                                                     "--update`: auto runs both and takes the faster, the update it "
                                                     "took in the seed's row); with staggered or auto, every trace "
                                                     "has (K + 2) x B groups [default: all]")
    ap.add_argument("--per-seed", action="store_true", help="also one row per seed")
    ap.add_argument("--jobs", type=int, default=1, help="searches run at once, in worker processes (one a core)")
    args = ap.parse_args()
    if args.step_groups is None:
        args.step_groups = 128 if args.quick else 512
    if args.orders is None:
        args.orders = "v3" if args.quick else "v3,group_median,sample"
    orders = args.orders.split(",")
    unknown = sorted(set(orders) - set(ORDERS))
    if unknown:
        ap.error(f"--orders: unknown {', '.join(unknown)}; valid: {', '.join(ORDERS)}")
    updates = args.updates.split(",")
    if set(updates) - set(UPDATES):
        ap.error(f"--updates: unknown {', '.join(sorted(set(updates) - set(UPDATES)))}; valid: {', '.join(UPDATES)}")
    wide = updates != ["all"]

    from concurrent.futures import Future, ProcessPoolExecutor

    from pdsr_sdk.traces import workload

    members = family_members(ap, args.family)
    b = args.step_groups
    tasks = [(name, seed, order, update) for name in members
             for seed in (args.seeds or workload(name).measure.seeds)
             for order in orders for update in updates]
    pool = ProcessPoolExecutor(args.jobs) if args.jobs > 1 else None
    futures: dict = {}
    for t in tasks:   # in order: with one job each runs when its result is asked for
        futures[t] = pool.submit(search, *t, b, args.max_partial_share, wide) if pool else None

    def result(t):
        fut: Future | None = futures[t]
        return fut.result() if fut is not None else search(*t, b, args.max_partial_share, wide)

    print(f"B = {b}, S = 2, keep, 6 + 2 engines, fastest within {args.max_partial_share:.0%} partial tokens; "
          f"median [min, max] over the seeds\n")
    print("| member | K | order | update | seeds | F | step / on-policy step (x) | partial | per consumed token (x) "
          "| work bound (x) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in members:
        k = workload(name).measure.steps
        for order, update in ((o, u) for o in orders for u in updates):
            got = {}
            for t in (t for t in tasks if t[0] == name and t[2:] == (order, update)):
                seed = t[1]
                got[seed] = result(t)
                if args.per_seed:
                    row = ("none within the budget | | | |" if got[seed] is None else
                           "{:.3g} | {:.3f} | {:.1%} | {:.3f} | {:.3f}".format(*got[seed][:5]))
                    took = f" ({got[seed][5]})" if update == "auto" and got[seed] is not None else ""
                    print(f"| {name} | {k} | {order} | {update}{took} | {seed} | {row} |", flush=True)
            found = [g for g in got.values() if g is not None]
            missing = len(got) - len(found)
            label = f"{len(found)} of {len(got)}" + (" (the others: none within the budget)" if missing else "")
            if update == "auto":   # which update the seeds' picks took
                took = Counter(g[5] for g in found)
                label += " (" + ", ".join(f"{u}: {took[u]}" for u in ("all", "staggered") if took[u]) + ")"
            if not found:
                print(f"| {name} | {k} | {order} | {update} | {label} | | | | | |", flush=True)
                continue
            cols = [spread([g[i] for g in found], fmt) for i, fmt in enumerate((".3g", ".3f", ".1%", ".3f", ".3f"))]
            print(f"| {name} | {k} | {order} | {update} | {label} | {' | '.join(cols)} |", flush=True)
    if pool:
        pool.shutdown()


if __name__ == "__main__":
    main()
