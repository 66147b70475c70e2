"""Partial rollout across steps against on-policy steps, on the same real vLLM engines.

A heavy-tailed synthetic trace is replayed with its recorded lengths (``ignore_eos`` and a per-sample
max), so the two runs differ only in when work runs:

- **on-policy** (``baseline``, batch by batch): each step launches B groups and waits for all of them;
- **partial** (``v3`` with ``over_provision``, ``max_staleness``): ``ceil(B x (1 + F))`` groups in
  flight, a step ends when B are complete, and the unfinished samples carry into the next step with
  their tokens (aborted at the step's end and resumed under the next policy version).

Both run K steps of B groups on two equal CPU engines (64 sequences each), started once; a warm-up
runs first. Samples per second = the K x B x N samples the steps hand to the trainer / the steps'
summed wall time (the partial run's last carried groups are drained afterwards and not counted, as a
trainer's next step would take them). Repeats alternate the runs (A B A B ...); the ratio reported is
the median of the pairwise ratios with its spread. The simulator's prediction for the same trace
(`pdsr simulate --steps` with a profile calibrated from the on-policy run) is printed beside it.

``--trainer-s T`` adds a trainer that takes T seconds a step (a sleep: a trainer on its own device) and
pushes the weights after it (``update_weights`` with the model's own weights); samples per second are
then over the wall time from the first step's start to the last step's training end, and a third run
joins: **pipelined** partial rollout, which starts step k + 1 before training on step k, so the update
lands in the middle of the next step, which waits for it (``wait_for_update``; docs/sdk-partial.md, "Partial
rollout across steps").

    python bench/partial.py                        # K=5, B=4, N=8, F=0.5, S=2, lengths to 2048, tiny model
    python bench/partial.py --steps 8 --step-groups 16 --over-provision 0.25 --repeats 3
    python bench/partial.py --trainer-s 3                # with a trainer, and pipelined against it
    python bench/partial.py --kv-on-update keep          # carried samples go on from their cached KV
    python bench/partial.py --update staggered           # and a partial run with a staggered update beside it

Each step's end stands in for the trainer's update with ``RolloutSession.next_version()`` (without
``--trainer-s``): under ``--kv-on-update recompute`` (the default) it resets the engines' prefix caches as
a real update does, so the carried samples prefill their context again.

Prints the ratio partial / on-policy samples per second (target 1.5x), the simulator's prediction beside it, and
where the on-policy steps' trajectories went (a temporary folder). Time on 2 shared cores: 1-2 minutes to start
the engines, then about a minute a round at ``--steps 3 --max-length 512`` (more at the defaults, with --trainer-s).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import at_least, check_model_dir, number_at_least, run_engines  # noqa: E402


#: partial / on-policy samples per second, the issue's target (docs/benchmarks.md)
TARGET = 1.5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=at_least(1), default=5, help="training steps K")
    p.add_argument("--step-groups", type=at_least(1), default=4, help="groups a step hands to the trainer (B)")
    p.add_argument("--n", type=at_least(1), default=8, help="samples per group")
    p.add_argument("--over-provision", type=number_at_least(0), default=0.5, help="partial run: F")
    p.add_argument("--max-staleness", type=at_least(0), default=2, help="partial run: S")
    p.add_argument("--median-length", type=number_at_least(1), default=120.0, help="synthetic trace: median length")
    p.add_argument("--max-length", type=at_least(1), default=2048, help="synthetic trace: max length")
    p.add_argument("--runaway-frac", type=number_at_least(0), default=0.02,
                   help="synthetic trace: share of samples at the max (0 to 1)")
    p.add_argument("--seed", type=int, default=0, help="synthetic trace's seed")
    p.add_argument("--max-num-seqs", type=at_least(1), default=64, help="sequences per engine")
    p.add_argument("--repeats", type=at_least(1), default=1, help="rounds of both runs, alternating")
    p.add_argument("--model", help="model directory (default: the built-in tiny model)")
    p.add_argument("--kv-on-update", choices=("recompute", "keep"), default="recompute",
                   help="partial run: what each update does to the engines' KV cache (recompute: reset it, so the "
                        "carried samples prefill their context again; keep: go on from it, PipelineRL-style)")
    p.add_argument("--update", choices=("all", "staggered"), default="all",
                   help="staggered: a third run, partial rollout with a staggered update (samples of the ending "
                        "version finish under it on the fewest engines, which load after), against the others")
    p.add_argument("--trainer-s", type=number_at_least(0), default=0.0,
                   help="a trainer taking this many seconds a step, then update_weights; adds the pipelined run")
    args = p.parse_args(argv)
    if args.runaway_frac > 1:
        p.error(f"argument --runaway-frac: {args.runaway_frac:g} is above 1 (a share of the samples)")
    check_model_dir(p, args.model)
    return args


async def main_async(args) -> None:
    from pdsr_sdk.dispatch.steps import in_flight
    from pdsr_sdk.engines.vllm_engine import VllmEngine
    from pdsr_sdk.models.tiny import ensure_tiny_model
    from pdsr_sdk.rollout.config import EngineSpec, RolloutConfig
    from pdsr_sdk.rollout.data import load_prompts, load_tokenizer
    from pdsr_sdk.rollout.replay import write_replay_prompts
    from pdsr_sdk.rollout.session import RolloutSession
    from pdsr_sdk.traces import synth_trace

    k, b, n = args.steps, args.step_groups, args.n
    need = in_flight(b, args.over_provision) + (k - 1) * b
    model = args.model or str(ensure_tiny_model())
    trace = synth_trace(groups=max(need, k * b) + 4, n=n, seed=args.seed, median_length=args.median_length,
                        max_length=args.max_length, runaway_frac=args.runaway_frac, prompt_len_min=20,
                        prompt_len_max=120)
    work = Path(tempfile.mkdtemp(prefix="pdsr-bench-partial-"))
    path = write_replay_prompts(trace, work / "prompts.jsonl", load_tokenizer(model))
    longest = int(trace.lengths.max())
    specs = [EngineSpec(name=f"{pool}-0", pool=pool, devices=[i], max_num_seqs=args.max_num_seqs,
                        max_model_len=longest + 512) for i, pool in enumerate(("fast", "heavy"))]
    engines = [VllmEngine.from_spec(s, model=model) for s in specs]
    base = dict(model=model, reward="none", segments={"min_tokens": 32, "max_tokens": 256},
                sampling={"n": n, "max_tokens": longest, "ignore_eos": True},
                data={"target_lengths_column": "target_lengths"})
    on_cfg = RolloutConfig(**base, policy="baseline", batch_size=b)
    part_cfg = RolloutConfig(**base, policy="v3", batch_size=b, over_provision=args.over_provision,
                             max_staleness=args.max_staleness, kv_on_update=args.kv_on_update)

    stag_cfg = part_cfg.model_copy(update={"update": "staggered"})
    tables: list[Path] = []   # the on-policy steps' trajectories, to calibrate the simulator

    update_s: list[float] = []   # update_weights' durations, for the simulator's weight_update_s

    async def train(session) -> None:
        """The trainer's step: its time, then its weights to the engines (a version bump without one)."""
        if args.trainer_s > 0:
            await asyncio.sleep(args.trainer_s)
            t = time.perf_counter()
            await session.aupdate_weights(model)
            update_s.append(time.perf_counter() - t)
        else:
            await session.anext_version()

    async def on_policy(records) -> dict:
        import pyarrow.parquet as pq

        async with RolloutSession(on_cfg, engines=engines) as session:
            wall, samples, t0 = 0.0, 0, time.perf_counter()
            for step in range(k):
                out = await session.astep(records[step * b:(step + 1) * b])
                print(f"    on-policy step {step}: {out.summary['makespan_s']:.2f} s", flush=True)
                wall += out.summary["makespan_s"]
                samples += out.summary["samples"]
                tables.append(work / f"on-{len(tables)}.parquet")
                pq.write_table(out.table, tables[-1])
                await train(session)
        return {"wall_s": time.perf_counter() - t0 if args.trainer_s > 0 else wall, "samples": samples, "steps": k}

    async def partial(records, *, pipelined: bool = False, staggered: bool = False) -> dict:
        async with RolloutSession(stag_cfg if staggered else part_cfg, engines=engines) as session:
            wall, samples, off, ages, wasted, restarts, part = 0.0, 0, [], [], 0, 0, 0
            source = iter(records)
            step_times: list[float] = []
            t0 = time.perf_counter()
            out = await session.astep(source)
            for step in range(k):
                # pipelined: the next step generates while this one trains; the update lands in its middle
                # and the step waits for it (its token ages then count at the weights it is trained with)
                nxt = (asyncio.ensure_future(session.astep((), wait_for_update=True)) if pipelined and step + 1 < k
                       else None)
                step_times.append(out.summary["makespan_s"])
                wall += out.summary["makespan_s"]
                samples += out.summary["samples"]
                off.append(out.summary["off_policy_share"])
                ages.append(out.summary["max_token_age"])
                wasted += out.summary["wasted_tokens"]
                part += out.summary["partial_tokens"]
                restarts += out.summary["stale_restarts"]
                await train(session)
                if step + 1 < k:
                    out = await nxt if nxt is not None else await session.astep(())
            elapsed = time.perf_counter() - t0
            tail = await session.astep((), last=True)   # the carried groups, not counted
        return {"wall_s": elapsed if args.trainer_s > 0 else wall, "samples": samples, "steps": k,
                "off_policy_share": statistics.mean(off), "max_token_age": max(ages),
                "drained_groups": len(tail.groups), "wasted_tokens": wasted, "stale_restarts": restarts,
                "partial_tokens": part,
                "step_s": [round(x, 2) for x in step_times]}

    async def pipelined(records) -> dict:
        return await partial(records, pipelined=True)

    async def staggered(records) -> dict:
        return await partial(records, staggered=True)

    tok = load_tokenizer(model)
    records = load_prompts(on_cfg.data, tok, path=path, n=n)
    try:   # from the start: an engine that started is closed when another fails to start or Ctrl-C comes
        t0 = time.perf_counter()
        await asyncio.gather(*(e.start() for e in engines))
        print(f"engines started in {time.perf_counter() - t0:.1f} s; trace: {trace.num_groups} groups x {n}, "
              f"longest {longest}; K={k} steps of B={b} groups; partial: F={args.over_provision:g}, "
              f"S={args.max_staleness}")
        async with RolloutSession(on_cfg, engines=engines) as warm:   # warm-up
            await warm.astep(records[:2])
        kinds = [("on-policy", on_policy), ("partial", partial)]
        if args.trainer_s > 0:
            kinds.append(("pipelined", pipelined))
        if args.update == "staggered":
            kinds.append(("staggered", staggered))
        runs: dict[str, list[dict]] = {name: [] for name, _ in kinds}
        for r in range(args.repeats):
            for name, fn in kinds:
                res = await fn(records)
                runs[name].append(res)
                print(f"  round {r}: {name:9s} {res['samples']} samples in {res['wall_s']:7.2f} s  "
                      f"{res['samples'] / res['wall_s']:7.2f} samples/s", flush=True)
    finally:
        for e in engines:
            await e.close()
    ratios = pairwise(runs["partial"], runs["on-policy"])
    part = median_run(runs["partial"], runs["on-policy"])
    fitted = calibrated_profile(tables)
    load_s = statistics.median(update_s) if update_s else 0.0
    predicted = simulated_ratio(args, trace, k, b, fitted, load_s)
    with_trainer = f" (trainer {args.trainer_s:g} s, weight load {load_s:.2f} s)" if args.trainer_s > 0 else ""
    x = statistics.median(ratios)
    print(f"\npartial / on-policy samples per second: {x:.3f}x (target {TARGET:g}x: "
          f"{'met' if x >= TARGET else 'not met'}) [{ratios[0]:.3f}, {ratios[-1]:.3f}] over {len(ratios)} round(s); "
          f"simulated with a profile calibrated from the on-policy steps{with_trainer}: {predicted:.3f}x; partial run: "
          f"off-policy token share {part['off_policy_share']:.3f}, oldest token {part['max_token_age']} version(s), "
          f"{part['stale_restarts']} staleness restarts ({part['wasted_tokens']} tokens thrown away), "
          f"{part['partial_tokens']} partial tokens, steps "
          f"{part['step_s']} s, {part['drained_groups']} carried groups drained after step {k}")
    if "pipelined" in runs:
        pipe = median_run(runs["pipelined"], runs["on-policy"])
        print(f"with a trainer of {args.trainer_s:g} s a step: pipelined / on-policy samples per second "
              f"{spread(runs['pipelined'], runs['on-policy'])} (simulated "
              f"{simulated_ratio(args, trace, k, b, fitted, load_s, pipeline=True):.3f}x), pipelined / partial "
              f"{spread(runs['pipelined'], runs['partial'])}; pipelined run: off-policy token "
              f"share {pipe['off_policy_share']:.3f}, oldest token {pipe['max_token_age']} version(s) at its step's "
              f"end, {pipe['stale_restarts']} staleness restarts, steps {pipe['step_s']} s")
    if "staggered" in runs:
        run = median_run(runs["staggered"], runs["on-policy"])
        print(f"staggered update / on-policy samples per second {spread(runs['staggered'], runs['on-policy'])} "
              f"(simulated {simulated_ratio(args, trace, k, b, fitted, load_s, update='staggered'):.3f}x), "
              f"staggered / partial {spread(runs['staggered'], runs['partial'])}; staggered run: off-policy token "
              f"share {run['off_policy_share']:.3f}, {run['partial_tokens']} partial tokens, steps {run['step_s']} s")
    print(f"the on-policy steps' trajectories (the calibration's input): {work}")


def pairwise(runs: list[dict], against: list[dict]) -> list[float]:
    """Samples per second of each round's run over the same round's ``against`` run, sorted."""
    return sorted((r["samples"] / r["wall_s"]) / (a["samples"] / a["wall_s"]) for r, a in zip(runs, against))


def spread(runs: list[dict], against: list[dict]) -> str:
    """The median of :func:`pairwise` with its lowest and highest: ``1.234x [1.100, 1.300]``."""
    r = pairwise(runs, against)
    return f"{statistics.median(r):.3f}x [{r[0]:.3f}, {r[-1]:.3f}]"


def median_run(runs: list[dict], against: list[dict]) -> dict:
    """The round's run whose ratio over ``against`` is the median of :func:`pairwise` (the lower of the middle two
    for an even count): its details are printed beside that median."""
    ratio = [(r["samples"] / r["wall_s"]) / (a["samples"] / a["wall_s"]) for r, a in zip(runs, against)]
    order = sorted(range(len(runs)), key=ratio.__getitem__)
    return runs[order[(len(runs) - 1) // 2]]


def calibrated_profile(tables: list[Path]) -> dict:
    """The engines' cost model fitted from the on-policy steps' segment timings (one fit: equal engines)."""
    from pdsr_sdk.sim.calibrate import calibrate

    fit = next(iter(calibrate(tables, per_pool=False).values()))
    print("calibrated profile: " + ", ".join(f"{k} {v:.3g}" for k, v in fit.profile().items()
                                             if isinstance(v, float)))
    return fit.profile()


def simulated_ratio(args, trace, k: int, b: int, fitted: dict, load_s: float = 0.0, *,
                    pipeline: bool = False, update: str = "all") -> float:
    """Partial (or pipelined) / on-policy samples per second as ``pdsr simulate --steps`` predicts them for this
    trace on two equal engines of the bench's size with the fitted cost model: the K steps' summed times, with the
    trainer (``--trainer-s``, and ``load_s`` a weight load) after each, as the bench's wall time counts them."""
    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.steps import simulate_steps

    profile = {**fitted, "max_num_seqs": args.max_num_seqs, "max_model_len": int(trace.lengths.max()) + 512}
    trainer = {"trainer_s": args.trainer_s, "weight_update_s": load_s, "pipeline": pipeline} \
        if args.trainer_s > 0 else {}
    cfg = SimulateConfig(policy="v3", fast=1, heavy=1, batch_size=b, steps=k, over_provision=args.over_provision,
                         max_staleness=args.max_staleness, profiles={"fast": profile, "heavy": profile},
                         restart_lengths="replay",   # the bench forces every length, also after a restart
                         kv_on_update=args.kv_on_update, update=update,
                         timeline=False, **trainer)
    report = simulate_steps(trace, cfg)
    last = args.trainer_s + load_s if args.trainer_s > 0 else 0.0   # the last step's training, in both
    return (sum(report.baseline_steps_s) + last) / (sum(report.runs[0].step_times) + last)


if __name__ == "__main__":
    run_engines(main_async(parse_args()))
