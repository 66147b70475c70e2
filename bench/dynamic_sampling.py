"""Benchmark: dynamic sampling (DAPO), simulated: pdsr's filtered step stream against verl's DAPO recipe, on-policy
against on-policy, on SmolLM2-135M's recorded GSM8K lengths.

    .venv/bin/python bench/dynamic_sampling.py [--solve recorded,0.05,0.1,0.2,0.3] [--b 128] [--steps 8] [--seed 1]
                                               [--policy v3] [--fast 6] [--heavy 2]

The trace: groups drawn with replacement from a recording of SmolLM2-135M-Instruct on the first 128 GSM8K test
prompts (n = 8, temperature 1, 512-token cap), each with its recorded lengths and finish reasons.
``--solve recorded``: ``bench/data/smollm2-gsm8k-128x8-rewards.jsonl``, a run with each sample's reward
(``bench/record_trace.py``: its last number against the answer, as lm-evaluation-harness's flexible-extract
scores GSM8K; the model's own solve rate, 1.5%, 12 of 128 groups with unequal rewards). A number ``solve``:
``bench/data/smollm2-gsm8k-128x8.jsonl``, an earlier run without rewards, each sample's reward derived: a response
that ran to the cap (finish reason ``length``) is wrong (it never reached a final answer), and one that
stopped is right with probability ``solve`` (drawn per sample, seeded). So all-wrong groups are the long
ones, and a prompt's solve rate is ``solve`` x its share of stopped responses. The overall solve rate and
the measured pass rate are printed beside each.

pdsr: ``pdsr simulate --steps K --step-groups B --max-staleness 0 --filter-groups zero-variance`` (on-policy: a
group still generating at a step's end is dropped then, as the recipe drops its excess; the
groups in flight follow the measured pass rate). verl's DAPO
recipe (``recipe/dapo``, ``pdsr_sdk.sim.steps_baseline.dapo_recipe_steps``): generation batches of 3 x B prompts with
the baseline policy (plain continuous batching, each batch waits for its longest sample), filtered, until B pass, at
most 10 a step. Both on the same simulated engines (default profile). Step time: the mean of steps 3 to K-1.

``filter_bound_s``: the least time these engines need to complete B / pass rate groups of the trace's average
work (each prompt prefilled once, every sample decoded in full batches): what a step needs that completes
groups whatever their length, as the recipe does (it generates whole batches). ``best_ratio`` = that over the
recipe's step. A schedule gets below it only by favouring groups by length: completing the short ones (which
pass more often here: all-wrong groups are the long ones) and dropping the rest, as pdsr's drop at an on-policy
step's end does in part, which tilts the step's data towards short responses.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
from bench_args import at_least, float_list, number_at_least

DATA = Path(__file__).resolve().parent / "data" / "smollm2-gsm8k-128x8.jsonl"
SCORED = DATA.with_name("smollm2-gsm8k-128x8-rewards.jsonl")   # another run of the same, with rewards


def gsm8k_trace(groups: int, solve: float | None, seed: int):
    """``groups`` recorded GSM8K groups drawn with replacement, with their recorded rewards (``solve`` None) or
    rewards derived as the module says."""
    from pdsr_sdk.traces import LengthTrace, read_trace, resample_trace

    if solve is None:
        return resample_trace(read_trace(SCORED), groups, seed)
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    rng = random.Random(seed)
    picked = [rows[rng.randrange(len(rows))] for _ in range(groups)]
    rewards = [[1.0 if r == "stop" and rng.random() < solve else 0.0 for r in row["finish_reasons"]] for row in picked]
    return LengthTrace.from_matrix(np.array([row["lengths"] for row in picked]),
                                   prompt_ids=[f"g{i}" for i in range(groups)],
                                   prompt_lens=np.array([row["prompt_len"] for row in picked]),
                                   finish_reasons=np.array([row["finish_reasons"] for row in picked], dtype=object),
                                   rewards=np.array(rewards), source=f"gsm8k-solve{solve:g}-seed{seed}")


def filter_bound_s(trace, cfg, pass_rate: float) -> float:
    """The least engine time of B / pass_rate of the trace's groups (the module's ``filter_bound_s``)."""
    from pdsr_sdk.sim.bounds import bound_coefficients
    from pdsr_sdk.sim.report import batch_bounds

    b = cfg.step_groups or cfg.batch_size
    lengths = trace.lengths.reshape(trace.num_groups, -1)
    n = lengths.shape[1]
    plen = np.repeat(np.asarray(trace.prompt_lens, dtype=np.int64), n)
    work, _ = batch_bounds(plen, lengths.reshape(-1), cfg.fast + cfg.heavy, **bound_coefficients(cfg))
    return work * (b / max(pass_rate, 1e-9)) / trace.num_groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--solve", default="recorded,0.05,0.1,0.2,0.3",
                        help="'recorded' (the recorded rewards) or chances a stopped response is right, "
                             "comma-separated")
    parser.add_argument("--b", type=at_least(1), default=128, help="groups a step hands to the trainer (B)")
    parser.add_argument("--steps", type=at_least(1), default=8,
                        help="steps K (the step time is the mean of steps 3 to K-1; of every step when K < 4)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the groups drawn and the derived rewards")
    parser.add_argument("--policy", default="v3", help="pdsr's policy (the recipe runs baseline)")
    parser.add_argument("--fast", type=at_least(0), default=6, help="fast simulated engines")
    parser.add_argument("--heavy", type=at_least(0), default=2, help="heavy simulated engines")
    parser.add_argument("--over-provision", type=number_at_least(0), default=None,
                        help="fixed F instead of the adaptive count")
    args = parser.parse_args()
    solves: list[float | None] = []
    for item in args.solve.split(","):
        try:
            solves.append(None if item == "recorded" else float_list(item)[0])
        except argparse.ArgumentTypeError:
            parser.error(f"--solve: {item!r} is neither 'recorded' nor a number (e.g. recorded,0.05,0.1)")
        if solves[-1] is not None and not 0 < solves[-1] <= 1:   # 0: no group passes, the recipe never ends a step
            parser.error(f"--solve: {item} is not a chance in (0, 1]")

    from pdsr_sdk.errors import PdsrError
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.steps import simulate_steps
    from pdsr_sdk.sim.steps_baseline import DAPO_GEN_FACTOR, dapo_plan
    from pdsr_sdk.sim.steps_report import steady_window

    try:   # --policy and the engines, checked before any run
        cfg = SimulateConfig(policy=args.policy, fast=args.fast, heavy=args.heavy, steps=args.steps,
                             step_groups=args.b, batch_size=args.b, max_staleness=0, timeline=False,
                             over_provision=args.over_provision, filter_groups={"kind": "zero-variance"})
    except PdsrError as exc:
        parser.error(" ".join(str(exc).split()))   # the config's lines as one

    print(f"B = {args.b}, {args.steps} steps, policy {args.policy}, {args.fast} fast + {args.heavy} heavy simulated "
          f"engines, seed {args.seed}, over-provision "
          f"{args.over_provision if args.over_provision is not None else 'adaptive'}")
    header = ("solve", "solve_rate", "pass_rate", "dapo_gen_batches", "dapo_step_s", "pdsr_step_s", "ratio",
              "filter_bound_s", "best_ratio", "pdsr_in_flight", "pdsr_wasted_share", "pdsr_dropped_share", "sim_s")
    print(" | ".join(header))
    for solve in solves:
        began = time.perf_counter()
        trace = gsm8k_trace(args.b * DAPO_GEN_FACTOR * 10 * args.steps, solve, args.seed)
        groups = trace.group_rewards()
        pass_rate = sum(len(set(rs)) > 1 for rs in groups.values()) / len(groups)
        try:
            plan = dapo_plan(trace, cfg)
        except PdsrError as exc:   # the recipe's max_num_gen_batches reached: too few groups pass
            raise SystemExit(f"error: --solve {'recorded' if solve is None else f'{solve:g}'}: {exc}") from None
        steady = plan[steady_window(len(plan))]   # the steps the step times are taken over
        report = simulate_steps(trace, cfg)
        bound = filter_bound_s(trace, cfg, pass_rate)
        run = report.runs[0]
        s = report.summary(run)
        dropped = sum(st["dropped_tokens"] for st in s["steps"])   # groups dropped at a step's end
        generated = s["tokens"] + s["wasted_tokens"] + s["filtered_tokens"] + dropped
        print(" | ".join(["recorded" if solve is None else f"{solve:g}", f"{float(np.nanmean(trace.rewards)):.3f}",
                          f"{pass_rate:.3f}",
                          f"{sum(steady) / len(steady):.2f}", f"{report.baseline_step_s:.2f}",
                          f"{run.steady_step_s:.2f}", f"{report.ratio(run):.3f}", f"{bound:.2f}",
                          f"{bound / report.baseline_step_s:.3f}", str(run.in_flight),
                          f"{s['wasted_tokens'] / generated:.3f}" if generated else "0",
                          f"{dropped / generated:.3f}" if generated else "0",
                          f"{time.perf_counter() - began:.1f}"]))


if __name__ == "__main__":
    main()
