"""A recorded length trace with rewards, from a real engine's run: how bench/data's SmolLM2 traces are made.

First the run (vLLM CPU, one engine; about 23 minutes for 1,024 samples at a 512-token cap on two cores):

    pdsr rollout --policy baseline --data gsm8k_test.jsonl --limit 128 --instruction math \\
        --n 8 --batch-size 128 --max-tokens 512 --temperature 1 --model SMOLLM2_DIR --reward math_verify \\
        --out gsm8k-512.parquet

then its trace, with each sample's reward:

    .venv/bin/python bench/record_trace.py gsm8k-512.parquet --scorer last-number \\
        --out bench/data/smollm2-gsm8k-128x8-rewards.jsonl

``--scorer run`` keeps the rewards the run computed (what ``pdsr trace convert`` writes). ``last-number`` scores
each response again from its text: right when its last number equals the ground truth's answer (a GSM8K
worked solution's ``#### N``), as lm-evaluation-harness's "flexible-extract" scores GSM8K. SmolLM2-135M
rarely writes the ``\\boxed{}`` the math instruction asks for (30 of 1,024 GSM8K responses, none right), so
math_verify scores it 0 everywhere, and dynamic sampling would filter every group; its last numbers are right
1.5% of the time.
"""

from __future__ import annotations

import argparse
import re

from bench_args import existing_file

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number_right(response: str | None, ground_truth: str | None) -> float:
    """1.0 when the response's last number equals the ground truth's answer (its ``#### N``, else all of it)."""
    if not response or not ground_truth:
        return 0.0
    found = NUMBER.findall(response)
    truth = ground_truth.rsplit("####", 1)[-1].strip().replace(",", "")
    try:
        return float(bool(found) and float(found[-1].replace(",", "")) == float(truth))
    except ValueError:   # a ground truth that is not a number
        return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trajectories", type=existing_file, help="a pdsr rollout trajectories Parquet file")
    ap.add_argument("--scorer", choices=("run", "last-number"), default="run",
                    help="the run's own rewards, or each response scored again by its last number (see above)")
    ap.add_argument("--out", required=True, help="the JSONL trace to write")
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pdsr_sdk.errors import PdsrError
    from pdsr_sdk.traces.io import trace_from_trajectories, write_trace_jsonl

    try:
        table = pq.read_table(args.trajectories)
    except (pa.ArrowException, OSError) as exc:
        ap.error(f"{args.trajectories}: not a trajectories Parquet file ({exc})")
    need = {"reward"} | ({"response_text", "ground_truth"} if args.scorer == "last-number" else set())
    missing = sorted(need - set(table.column_names))
    if missing:
        ap.error(f"{args.trajectories}: no column {', '.join(missing)} (a `pdsr rollout` run's trajectories have "
                 f"them; --scorer last-number needs the data's ground truth)")
    if args.scorer == "last-number":
        rewards = [last_number_right(text, truth) for text, truth in
                   zip(table["response_text"].to_pylist(), table["ground_truth"].to_pylist())]
        table = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array(rewards, pa.float32()))
    try:
        trace = trace_from_trajectories(table, source=str(args.trajectories))
    except PdsrError as exc:
        ap.error(str(exc))
    if trace.rewards is None:
        ap.error(f"{args.trajectories}: the run computed no rewards (reward 'none'); --scorer last-number scores "
                 f"the responses again from their text")
    write_trace_jsonl(trace, args.out)
    groups = trace.group_rewards()
    passing = sum(len(set(r)) > 1 for r in groups.values())
    print(f"wrote {args.out}: {trace.num_groups} groups, {trace.lengths.size} samples; solve rate "
          f"{float(trace.rewards.mean()):.4f}, groups with unequal rewards {passing} ({passing / len(groups):.3f})")


if __name__ == "__main__":
    main()
