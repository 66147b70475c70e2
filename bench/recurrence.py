"""Benchmark: does a response that ran to the cap run there again when drawn afresh?

    pdsr rollout --model DIR --data math500.jsonl --limit 128 --n 8 --max-tokens 512 --seed 0 --out a.parquet
    pdsr rollout --model DIR --data math500.jsonl --limit 128 --n 8 --max-tokens 512 --seed 1 --out b.parquet
    .venv/bin/python bench/recurrence.py a.parquet b.parquet

Two rollouts of the same prompts that differ only in their seed. The second run's responses are
fresh draws for the first run's. For the prompts grouped by how many of their responses capped in
the first run, it prints the share that capped in the second. Three predictions stand beside it:
- replay (`pdsr simulate --steps --restart-lengths replay`) repeats a capped response for certain;
- the pooled share;
- redraw's prior (the default), fitted to the first run (``pdsr_sdk.sim.redraw``).
The last line weighs each prompt by its capped responses: the chance that a restarted capped
response caps again. Reads trajectories only; no engine.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from bench_args import existing_file, read_columns


def capped_flags(path: Path, flag: str) -> dict[str, list[bool]]:
    """Per prompt, whether each response (by sample index) ran to the cap (finish reason ``length``)."""
    rows = read_columns(path, ["prompt_id", "sample_index", "finish_reason"], flag)
    out: dict[str, dict[int, bool]] = defaultdict(dict)
    for r in rows:
        out[r["prompt_id"]][r["sample_index"]] = r["finish_reason"] == "length"
    return {p: [v[i] for i in sorted(v)] for p, v in out.items()}


def main() -> None:
    from pdsr_sdk.sim.redraw import cap_chance, cap_prior

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first", type=existing_file, help="trajectories of the first run")
    ap.add_argument("second", type=existing_file, help="trajectories of the same prompts, another seed")
    args = ap.parse_args()
    a, b = capped_flags(args.first, "first"), capped_flags(args.second, "second")
    prompts = sorted(set(a) & set(b))
    if not prompts:
        raise SystemExit(f"{args.first} and {args.second} share no prompt ids")
    def share(groups) -> float:   # the pooled share of capped responses
        return cap_prior(groups)[0]

    pooled, strength = cap_prior([a[p] for p in prompts])
    print(f"{len(prompts)} prompts; capped: first run {pooled:.1%}, second {share([b[p] for p in prompts]):.1%}; "
          f"prior fitted to the first: strength {strength:.3g}")
    by_k: dict[int, list[str]] = defaultdict(list)
    for p in prompts:
        by_k[sum(a[p])].append(p)
    print(f"{'capped first':>12}  {'prompts':>7}  {'capped second':>13}  {'redraw predicts':>15}  {'pooled':>6}")
    for k in sorted(by_k):
        ps = by_k[k]
        predicted = sum(cap_chance(a[p], pooled, strength) for p in ps) / len(ps)
        print(f"{k:>8}/{len(a[ps[0]])}  {len(ps):>7}  {share([b[p] for p in ps]):>13.1%}  {predicted:>15.1%}  "
              f"{pooled:>6.1%}")
    ran = [p for p in prompts if sum(a[p])]
    weight = sum(sum(a[p]) for p in ran)
    if weight:
        measured = sum(sum(a[p]) * sum(b[p]) / len(b[p]) for p in ran) / weight
        predicted = sum(sum(a[p]) * cap_chance(a[p], pooled, strength) for p in ran) / weight
        print(f"a capped response drawn afresh caps again: {measured:.1%} measured; redraw predicts "
              f"{predicted:.1%}, replay 100%, the pooled share {pooled:.1%}")


if __name__ == "__main__":
    main()
