"""Benchmark: how far better predictions could take partial rollout across steps (issue 20's B = 512 target).

    .venv/bin/python bench/stream_oracle.py [--seeds 7,37] [--step-groups 512] [--orders v3,group_median,sample]

For each seed-002-like trace (`pdsr trace synth --groups 5632 --n 8 --seed S`) it runs the
partial-share search of `pdsr simulate --steps 10 --max-staleness 2 --max-partial-share 0.1
--kv-on-update keep` (6 + 2 equal engines) with v3 and with v3 told what no real engine knows, in
the place of its ranked pool's order (``V3Policy.rank_key``):

- ``group_median``: each group ranked by the median of its recorded lengths, longest first: a perfect
  per-prompt predictor (a prompt's difficulty, as many earlier epochs of it would tell);
- ``group_max``: each group by its longest recorded response (also knowing the noise of this draw);
- ``sample``: every sample by its own recorded length, longest first (knowing the noise of each sample).

Everything else is v3's (placement, siblings first on an engine, the lane, segments). Prints, per
trace and order, the fastest over-provision within 10% partial tokens: its F, steady step / on-policy
step, partial share and the ratio per consumed token. All in virtual time: one run gives the same
numbers on any machine. A search takes about 2-3 minutes per order and trace on one core.
"""

from __future__ import annotations

import argparse
from typing import Literal

from pydantic import Field

from pdsr_sdk.dispatch.types import Sample
from pdsr_sdk.policies.v3 import V3Policy
from pdsr_sdk.policies.v3_settings import V3Settings

ORDERS = ("v3", "group_median", "group_max", "sample")
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


def fastest_within(trace, order: str, b: int, budget: float):
    """(F, ratio, partial share, ratio per token) of the fastest run within ``budget`` partial tokens."""
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.steps import simulate_steps

    policy = "v3" if order == "v3" else OracleOrderPolicy.name
    settings = {} if order == "v3" else {policy: {"order": order}}
    cfg = SimulateConfig(policy=policy, policy_settings=settings, fast=6, heavy=2, steps=10, step_groups=b,
                         max_staleness=2, max_partial_share=budget, kv_on_update="keep", timeline=False,
                         profiles={"fast": EQUAL, "heavy": EQUAL})
    report = simulate_steps(trace, cfg)
    pick = report.fastest_within()
    if pick is None:
        return None
    return pick.over_provision, report.ratio(pick), pick.partial_share, report.ratio_per_token(pick)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="7,37")
    ap.add_argument("--step-groups", type=int, default=512)
    ap.add_argument("--max-partial-share", type=float, default=0.1)
    ap.add_argument("--orders", default="v3,group_median,sample", help=f"comma-separated, of {', '.join(ORDERS)}")
    args = ap.parse_args()
    orders = args.orders.split(",")
    unknown = sorted(set(orders) - set(ORDERS))
    if unknown:
        ap.error(f"--orders: unknown {', '.join(unknown)}; valid: {', '.join(ORDERS)}")

    from pdsr_sdk.policies import POLICIES
    from pdsr_sdk.traces import synth_trace

    POLICIES.register(OracleOrderPolicy.name, OracleOrderPolicy)   # this process only
    print(f"B = {args.step_groups}, S = 2, K = 10, keep, fastest within {args.max_partial_share:.0%} partial tokens\n")
    print("| seed | order | F | step / on-policy | partial | per consumed token |")
    print("|---|---|---|---|---|---|")
    for seed in map(int, args.seeds.split(",")):
        trace = synth_trace(groups=5632, n=8, seed=seed)
        for order in orders:
            got = fastest_within(trace, order, args.step_groups, args.max_partial_share)
            if got is None:
                print(f"| {seed} | {order} | none within the budget | | | |", flush=True)
                continue
            f, ratio, partial, per_token = got
            print(f"| {seed} | {order} | {f:.3g} | {ratio:.3f}x | {partial:.1%} | {per_token:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
