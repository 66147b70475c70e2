"""Speculative decoding on real engines (issue 50, item 3): off, ngram and group, their acceptance over a whole
step and in its tail, and their speed against speculation off in the same run.

For each data set (``--data``, repeatable) and method (``--methods``), one rollout step of ``--prompts`` prompts x
``--n`` samples at ``--temperature``, capped at ``--max-tokens``, on fresh engines started for the method (every
method at the same ``--num-speculative-tokens`` and n-gram window). Methods:

- ``off``: no speculation (engine seed ``--seed``); its responses are also the history of ``group``;
- ``ngram``: vLLM's n-gram lookup in the request's own prompt and output;
- ``group``: pdsr's drafter (docs/engines.md): the finished siblings' responses, plus the history: the ``off``
  run's responses to the same prompts (another engine seed, so fresh draws of the same weights: history from the
  step before a small weight update, never a replay of the measured step's own draws);
- ``group-siblings``: ``group`` without the history (siblings, then the row's own context);
- ``group-longest``: ``group`` (with the history) under its first draft rule, ``longest`` (the longest match, the
  row's own on a tie), where ``group`` runs the default rule, ``vote`` (``GroupProposer._draft``).

Every speculative run uses engine seed ``--seed`` + 1. Without ``off`` in ``--methods``, a history step (off, seed
``--seed``) runs first when a ``group`` method needs it, and speeds are not compared.

Measured per method (engine counters, ``VllmEngine.speculation_stats()``, summed over the engines):

- whole step: accepted / drafted tokens; accepted per verify step (accepted / verify steps, a verify step being a
  request's engine step that checked drafted tokens; vLLM's mean acceptance length minus its bonus token); draft
  share (accepted drafted tokens / tokens generated);
- the **tail**, two ways. (1) The last ``--tail-frac`` (10%) of the step's samples to finish: the engines'
  counters are snapshotted when the other 90% have finished (``RolloutSession.hooks.on_sample_done``) and the tail
  is the delta from there to the step's end (``tail``). Where many samples run to the cap they end together and
  this tail holds few tokens. (2) The last 10% of the step's tokens: everything streamed after the moment 90% of
  the step's tokens had been (``token_tail``, from the per-request metrics below: the verify steps whose tokens
  arrived after it). Tail draft share = accepted drafted tokens in the tail / tokens generated in the tail;
- tokens/s over the step (tokens / makespan) and over each tail, and each against ``off`` in the same run;
- per request (vLLM's ``per_request_spec_decode_metrics = detailed``: each verify step's drafted and accepted counts,
  read from each segment's last output): acceptance by position in the response (``--position-bin`` tokens a bin)
  and by the number of the sample's siblings that had finished when its segment was launched (what ``group``'s
  corpus holds: pdsr hands a request its corpus at launch, see docs/engines.md). A verify step's position comes
  from lining the per-step counts up with the streamed chunks (one chunk per engine step, 1 + accepted tokens);
  verify steps that accepted nothing are spread evenly over the run of one-token chunks they fall in, and a
  segment whose chunks do not line up (vLLM merged two steps' outputs) has its steps spread evenly over it
  (``unaligned_segments`` counts them).

    .venv/bin/python bench/spec.py --model DIR --data math500.parquet \\
        --data gsm8k_test.jsonl --prompts 8 --acceptance-out runs/acceptance.json

Without ``--model`` it runs the built-in tiny model (whose output hardly repeats: a smoke run; ``--prompts 2 --n 2
--max-tokens 32 --methods off,ngram,group --engines 1`` takes about 2 minutes on 2 shared cores, each method's
engines starting afresh in 30-80 s). ``--devices``
(default: 0 .. engines - 1) are CPU cores on the CPU build and GPU ids on GPUs, as in ``EngineSpec.devices``.

Acceptance file (``--acceptance-out``, JSON, read by the simulator, issue 50 item 4)::

    {"version": 1, "model": str (the directory's name), "dtype": str, "k": int (num_speculative_tokens),
     "window": [min_n, max_n], "n": int,
     "temperature": float, "max_tokens": int, "tail_frac": float, "position_bin": int,
     "datasets": {NAME: {"prompts": int, "methods": {METHOD: {
         "whole": COUNTS, "tail": COUNTS, "token_tail": COUNTS,
         "tokens_per_s": float, "tail_tokens_per_s": float, "token_tail_tokens_per_s": float, "makespan_s": float,
         "vs_off": {"tokens_per_s": float, "tail_tokens_per_s": float, "token_tail_tokens_per_s": float,
                    "makespan": float} | null,   (each: this method / off; null for off)
         "by_position": [COUNTS + {"start": first response position of the bin}, ...],
         "by_siblings_finished": [COUNTS + {"finished": siblings finished at the segment's launch}, ...],
         "by_position_and_siblings": [COUNTS + {"start": ..., "finished": ...}, ...],   (the two jointly)
         "segments": int, "unaligned_segments": int}}}}}

    COUNTS = {"tokens": generated tokens, "verify_steps": steps that checked drafts, "drafted": drafted tokens,
              "accepted": accepted drafted tokens, "accepted_per_verify": accepted / verify_steps,
              "acceptance_rate": accepted / drafted, "draft_share": accepted / tokens}

``whole`` and ``tail`` come from the engines' counters; ``token_tail`` and the ``by_*`` rows
from the per-request metrics (their sums match ``whole`` up to segments without metrics). ``--json`` writes everything
the run printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# sibling modules (bench/ is on the path when the script runs)
from bench_args import at_least, check_model_dir, check_policies, number_at_least, run_engines
from spec_accounting import TABLE_HEAD, bin_segments, counts, delta, fmt_row, tail_size, token_quantile_time
from spec_recorder import Recorder, engine_totals

METHODS = ("off", "ngram", "group", "group-siblings", "group-longest")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: the built-in tiny model, a smoke run)")
    p.add_argument("--data", action="append", default=[], metavar="[NAME=]PATH",
                   help="prompt file (Parquet or JSONL, as pdsr rollout --data); repeatable; NAME defaults to the file "
                        "stem (default: the built-in sample prompts)")
    p.add_argument("--instruction", default="math", help="standard instruction appended to each prompt ('' for none)")
    p.add_argument("--prompts", type=at_least(1), default=16, help="prompts per data set (the first ones)")
    p.add_argument("--n", type=at_least(1), default=8, help="samples per prompt (a group)")
    p.add_argument("--max-tokens", type=at_least(1), default=512, help="response cap")
    p.add_argument("--temperature", type=number_at_least(0), default=1.0, help="sampling temperature")
    p.add_argument("--methods", default="off,ngram,group,group-longest",
                   help=f"comma-separated, from {', '.join(METHODS)} (default: all but group-siblings)")
    p.add_argument("--num-speculative-tokens", type=at_least(1), default=4, help="K, every method")
    p.add_argument("--prompt-lookup-min", type=at_least(1), default=2, help="shortest n-gram looked up, every method")
    p.add_argument("--prompt-lookup-max", type=at_least(1), default=4, help="longest n-gram looked up, every method")
    p.add_argument("--history-responses", type=at_least(0), default=8, help="group: earlier responses kept per prompt")
    p.add_argument("--engines", type=at_least(1), default=2,
                   help="engines per method, started afresh for each method (one GPU: --engines 1)")
    p.add_argument("--devices", type=at_least(0), nargs="*", help="one device per engine: CPU cores on the CPU build, "
                                                          "GPU ids on GPUs (default 0 .. engines - 1)")
    p.add_argument("--max-num-seqs", type=at_least(1), default=64, help="requests running at once per engine")
    p.add_argument("--max-batch-size", type=at_least(1), default=None,
                   help="speculative_settings.max_batch_size [default: none: drafts at every batch size, so that "
                        "acceptance is measured over the whole step]")
    p.add_argument("--dtype", default="auto", help="engine dtype (auto: float32 on a CPU without native bf16)")
    p.add_argument("--policy", default="baseline", help="dispatch policy")
    p.add_argument("--seed", type=int, default=0, help="engine seed of off (the history); speculative runs: seed + 1")
    p.add_argument("--tail-frac", type=float, default=0.1,
                   help="the tail: this share of the samples, the last to finish")
    p.add_argument("--position-bin", type=at_least(1), default=64, help="tokens per response-position bin")
    p.add_argument("--acceptance-out", type=Path, help="write the acceptance file (format above)")
    p.add_argument("--json", type=Path, help="write every measured number as JSON")
    p.add_argument("--trajectories", type=Path, metavar="DIR",
                   help="write each run's trajectories to DIR/NAME.METHOD.parquet")
    args = p.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        p.error(f"--methods: unknown {', '.join(bad) or '(none)'}; valid: {', '.join(METHODS)}")
    args.methods = methods
    if not 0 < args.tail_frac < 1:
        p.error("--tail-frac must be between 0 and 1")
    if args.devices and len(args.devices) != args.engines:
        p.error(f"--devices: {len(args.devices)} given for {args.engines} engines")
    if args.prompt_lookup_min > args.prompt_lookup_max:
        p.error(f"--prompt-lookup-min {args.prompt_lookup_min} is above --prompt-lookup-max {args.prompt_lookup_max}")
    for item in args.data:   # before any engine starts (minutes), not when the data set's turn comes
        path = item.rpartition("=")[2]
        if not Path(path).is_file():
            p.error(f"argument --data: no such file: {path}")
    check_policies(p, [args.policy], "--policy")
    check_model_dir(p, args.model)
    return args


# ----------------------------------------------------------------------------------------------- the runs

def load_records(args, data: str | None) -> list:
    """The data set's first ``--prompts`` prompts, tokenized with the model's chat template."""
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.data import load_prompts, load_tokenizer

    if data is None:   # the built-in sample prompts, as a file
        import tempfile

        from pdsr_sdk.rollout.sample_data import sample_prompts
        data = str(Path(tempfile.mkdtemp(prefix="pdsr-bench-spec-")) / "prompts.jsonl")
        Path(data).write_text("".join(json.dumps(r) + "\n" for r in sample_prompts(args.prompts)))
    cfg = RolloutConfig(model=args.model, data=data_config(args))
    return load_prompts(cfg.data, load_tokenizer(args.model), path=data, n=args.n)


def data_config(args) -> dict[str, Any]:
    cfg: dict[str, Any] = {"limit": args.prompts}
    if args.instruction:
        cfg["instruction"] = args.instruction
    return cfg


def method_config(args, method: str, seed: int, batch: int, max_model_len: int):
    """The RolloutConfig of ``method``'s runs: its engines, speculation and sampling."""
    from pdsr_sdk.engines.config import EngineSpec
    from pdsr_sdk.rollout.config import RolloutConfig

    speculative = "group" if method.startswith("group") else method
    settings = {"num_speculative_tokens": args.num_speculative_tokens, "prompt_lookup_min": args.prompt_lookup_min,
                "prompt_lookup_max": args.prompt_lookup_max,
                "history_responses": args.history_responses if method in ("group", "group-longest") else 0,
                "max_batch_size": args.max_batch_size}
    devices = args.devices or list(range(args.engines))
    extra = {"per_request_spec_decode_metrics": "detailed"} if speculative != "off" else {}
    engines = [EngineSpec(name=f"{('fast', 'heavy')[i % 2]}-{i}", pool=("fast", "heavy")[i % 2], devices=[devices[i]],
                          max_num_seqs=args.max_num_seqs, max_model_len=max_model_len, dtype=args.dtype,
                          engine_args=extra)
               for i in range(args.engines)]
    return RolloutConfig(model=args.model, data=data_config(args), reward="none", policy=args.policy,
                         batch_size=batch, engines=engines, seed=seed, speculative=speculative,
                         speculative_settings=settings,
                         sampling={"n": args.n, "max_tokens": args.max_tokens, "temperature": args.temperature})


async def start_engines(cfg) -> list:
    from pdsr_sdk.engines import build_engine

    engines = [build_engine(spec, model=cfg.model, tokenizer=cfg.tokenizer, seed=cfg.seed,
                            logprobs_mode=cfg.logprobs_mode, speculative=cfg.vllm_speculative_config())
               for spec in cfg.engines]
    await asyncio.gather(*(e.start() for e in engines))
    return engines


async def run_method(args, name: str, method: str, cfg, engines: list, records: list,
                     history_groups: list | None) -> dict[str, Any]:
    """One step of ``method`` on ``engines`` (started for the method); its measurements and groups."""
    from pdsr_sdk.engines.group_drafter import DraftHistory
    from pdsr_sdk.rollout.session import RolloutSession

    seed = cfg.seed
    settings = cfg.speculative_settings.model_dump()
    history = None
    if method in ("group", "group-longest") and history_groups:
        history = DraftHistory(args.history_responses)
        for g in history_groups:
            history.record(g)
    session = RolloutSession(cfg, engines=engines, draft_history=history)
    rec = Recorder("longest" if method == "group-longest" else None)
    total = len(records) * args.n
    cut = total - tail_size(total, args.tail_frac)
    snap: dict[str, Any] = {}
    done = [0]

    def on_done(_sample) -> None:
        done[0] += 1
        if done[0] == cut and not snap:
            snap.update(t=time.perf_counter(), tokens=rec.tokens, counters=engine_totals(session.engines))

    await session.start()
    try:
        for e in session.engines:
            rec.attach(e)
        session.hooks.on_sample_done.append(on_done)
        before = engine_totals(session.engines)
        tokens0 = rec.tokens
        t1 = time.perf_counter()
        out = await session.astep(records)
        t_end = time.perf_counter()
        after = engine_totals(session.engines)
    finally:
        await session.close()
    tokens = rec.tokens - tokens0
    whole = delta(after, before, tokens)
    tail = delta(after, snap["counters"], rec.tokens - snap["tokens"]) if snap else counts(0, 0, 0, 0)
    tail_s = t_end - snap["t"] if snap else 0.0
    segments = list(rec.segments.values())
    t_tokens = token_quantile_time(segments, 1 - args.tail_frac)
    cuts = {"tail_tokens": t_tokens}
    if snap:
        cuts["tail_samples"] = snap["t"]
    acc = bin_segments(segments, args.position_bin, cuts)
    tail_tokens = acc["after"]["tail_tokens"]
    makespan = float(out.summary["makespan_s"])
    res = {"method": method, "seed": seed, "makespan_s": makespan,
           "wall_s": t_end - t1, "tokens": int(out.summary["tokens"]), "samples": int(out.summary["samples"]),
           "tokens_per_s": out.summary["tokens"] / makespan if makespan else 0.0,
           "tail_s": tail_s, "tail_tokens_per_s": tail["tokens"] / tail_s if tail_s else 0.0,
           "whole": whole, "tail": tail,
           "tail_requests": acc["after"].get("tail_samples"),
           "token_tail": tail_tokens, "token_tail_s": t_end - t_tokens,
           "token_tail_tokens_per_s": tail_tokens["tokens"] / (t_end - t_tokens) if t_end > t_tokens else 0.0,
           "by_position": acc["by_position"].rows("start"),
           "by_siblings_finished": acc["by_siblings"].rows("finished"),
           "by_position_and_siblings": acc["by_both"].rows("start", "finished"), "segments": len(segments),
           "measured_segments": acc["measured"], "unaligned_segments": acc["unaligned"],
           "history_responses": settings["history_responses"] if history_groups else 0,
           "capped_share": sum(1 for g in out.groups for s in g.samples if s.finish_reason == "length") / total}
    if args.trajectories:
        import pyarrow.parquet as pq

        args.trajectories.mkdir(parents=True, exist_ok=True)
        pq.write_table(out.table, args.trajectories / f"{name}.{method}.parquet")
    return {"result": res, "groups": out.groups}


async def main_async(args) -> dict[str, Any]:
    import os

    from pdsr_sdk.models.tiny import ensure_tiny_model

    if args.model is None:
        args.model = str(ensure_tiny_model())
    sets = []
    for item in args.data or [""]:
        name, _, path = item.rpartition("=") if "=" in item else ("", "", item)
        sets.append((name or (Path(path).stem if path else "sample"), path or None))
    from pdsr_sdk.engines.vllm_env import cpu_dtype, is_cpu_build

    dtype = cpu_dtype(args.dtype) if is_cpu_build() else args.dtype
    report: dict[str, Any] = {"model": args.model, "dtype": dtype, "load_before": os.getloadavg(), "datasets": {}}
    print(f"model {args.model}; methods {', '.join(args.methods)}; {args.prompts} prompts x {args.n}, up to "
          f"{args.max_tokens} tokens, temperature {args.temperature:g}; K = {args.num_speculative_tokens}, window "
          f"{args.prompt_lookup_min}-{args.prompt_lookup_max}; {args.engines} engine(s), dtype {dtype}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    records = {name: load_records(args, path) for name, path in sets}
    max_len = max(len(r.token_ids) for recs in records.values() for r in recs) + args.max_tokens + 16
    every: dict[str, dict[str, dict[str, Any]]] = {name: {} for name, _ in sets}
    history: dict[str, list | None] = {name: None for name, _ in sets}
    order = list(args.methods)
    if {"group", "group-longest"} & set(order) and "off" not in order:
        order.insert(0, "history")   # the history step: off at --seed, not reported
    for method in sorted(order, key=lambda m: m not in ("off", "history")):   # off (the history) first
        seed = args.seed if method in ("off", "history") else args.seed + 1
        cfg = method_config(args, "off" if method == "history" else method, seed, args.prompts, max_len)
        t0 = time.perf_counter()
        engines = await start_engines(cfg)
        print(f"  {method}: {len(engines)} engine(s) started in {time.perf_counter() - t0:.1f} s", flush=True)
        try:
            for name, _ in sets:
                recs = records[name]
                cfg_d = cfg.model_copy(update={"batch_size": len(recs)})
                got = await run_method(args, name, "off" if method == "history" else method, cfg_d, engines, recs,
                                       history[name] if method in ("group", "group-longest") else None)
                if method in ("off", "history"):
                    history[name] = got["groups"]
                if method == "history":
                    continue
                r = got["result"]
                every[name][method] = r
                print(f"  {name} {method:14s}: {r['tokens']} tokens in {r['makespan_s']:.1f} s "
                      f"({r['tokens_per_s']:.1f}/s), whole {r['whole']['accepted']}/{r['whole']['drafted']} "
                      f"({r['whole']['accepted_per_verify']:.2f} per verify), token tail "
                      f"{r['token_tail']['accepted']}/{r['token_tail']['drafted']} "
                      f"({r['token_tail']['accepted_per_verify']:.2f}), sample tail {r['tail']['tokens']} tokens; "
                      f"segments {r['segments']} ({r['unaligned_segments']} unaligned); capped "
                      f"{r['capped_share']:.0%}; load {os.getloadavg()[0]:.2f}", flush=True)
        finally:
            for e in engines:
                await e.close()
    for name, path in sets:
        results = every[name]
        off = results.get("off")
        for r in results.values():
            r["vs_off"] = None if off is None or r is off else {
                "tokens_per_s": r["tokens_per_s"] / off["tokens_per_s"] if off["tokens_per_s"] else None,
                "tail_tokens_per_s": (r["tail_tokens_per_s"] / off["tail_tokens_per_s"]
                                      if off["tail_tokens_per_s"] else None),
                "makespan": r["makespan_s"] / off["makespan_s"] if off["makespan_s"] else None,
                "token_tail_tokens_per_s": (r["token_tail_tokens_per_s"] / off["token_tail_tokens_per_s"]
                                            if off["token_tail_tokens_per_s"] else None)}
        report["datasets"][name] = {"path": path, "prompts": args.prompts, "methods": results}
        print(f"\n{name}: accepted / drafted tokens, accepted per verify step, draft share (accepted / generated)")
        print(TABLE_HEAD)
        for r in results.values():
            print(fmt_row(r, off if r is not off else None))
        ng, gr = results.get("ngram"), results.get("group")
        if ng and gr:
            for key, what in (("tail", "last 10% of samples"), ("token_tail", "last 10% of tokens")):
                a, b = gr[key]["accepted_per_verify"], ng[key]["accepted_per_verify"]
                x = a / b if b else float("nan")
                print(f"tail ({what}) accepted per verify step, group / ngram: {x:.2f}x (target 1.3x: "
                      f"{'met' if x >= 1.3 else 'not met'})")
                report["datasets"][name][f"group_over_ngram_{key}"] = x
        for method in ("group", "group-siblings", "group-longest", "ngram"):
            r = results.get(method)
            if r:
                print(f"{method} by siblings finished at launch: " + ", ".join(
                    f"{row['finished']}: {row['accepted_per_verify']:.2f} ({row['verify_steps']})"
                    for row in r["by_siblings_finished"]))
        print(flush=True)
    report["load_after"] = os.getloadavg()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    if args.acceptance_out:
        write_acceptance(args, report)
    return report


def write_acceptance(args, report: dict[str, Any]) -> None:
    keep = ("whole", "tail", "token_tail", "tokens_per_s", "token_tail_tokens_per_s", "tail_tokens_per_s", "makespan_s",
            "vs_off", "by_position",
            "by_siblings_finished", "by_position_and_siblings", "segments", "unaligned_segments")
    doc = {"version": 1, "model": Path(args.model).name, "dtype": report.get("dtype"), "k": args.num_speculative_tokens,
           "window": [args.prompt_lookup_min, args.prompt_lookup_max], "n": args.n, "temperature": args.temperature,
           "max_tokens": args.max_tokens, "tail_frac": args.tail_frac, "position_bin": args.position_bin,
           "datasets": {name: {"prompts": d["prompts"],
                               "methods": {m: {k: r[k] for k in keep} for m, r in d["methods"].items()}}
                        for name, d in report["datasets"].items()}}
    args.acceptance_out.parent.mkdir(parents=True, exist_ok=True)
    args.acceptance_out.write_text(json.dumps(doc, indent=1))
    print(f"acceptance file: {args.acceptance_out}")


def main() -> None:
    run_engines(main_async(parse_args()))


if __name__ == "__main__":
    main()
