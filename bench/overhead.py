"""pdsr's overhead against vLLM alone: the same prompts, the same forced lengths, the same engine.

One vLLM CPU engine (a pdsr ``VllmEngine``: ``AsyncLLM`` in its own engine-core process, pinned to
``--core``) is started once; engine start is not timed. Each round runs every side on it, in turn, the
order alternating between rounds (A B C, C B A, ...), each from an empty prefix cache:

* ``vllm``: vLLM alone, as an RL framework calls it: every sample's request handed to that engine's
  ``AsyncLLM.generate`` at once (``asyncio.gather``, one request per sample, as pdsr sends them), with pdsr's
  sampling parameters (log-probs of the sampled tokens, no detokenization, ``ignore_eos``) and vLLM's offline
  output kind (``FINAL_ONLY``: the response once, at its end, as ``LLM.generate`` asks for it).
  ``vllm-delta``: the same, streaming each step's new tokens (``DELTA``), as pdsr's engine asks for them.
* ``baseline``, ``v3``: a pdsr ``RolloutSession`` on the same engine, ``session.generate(records)`` with
  that policy: the SDK's path of a trainer's step (nothing written; ``pdsr rollout`` adds the Parquet writer).

Response lengths are forced (``ignore_eos`` and each sample's own maximum, drawn like ``pdsr trace synth``
for ``--seed``), so every side generates exactly the same tokens' worth of work. Timed: from the first
request to the last response (generation only). Per side and round: tokens/s, the driver process's CPU
seconds per 1k generated tokens (pdsr's dispatch and vLLM's output handling run there), and the requests
vLLM got (a pdsr sample is sent in segments). The summary: per pdsr side, the median over rounds of its
tokens/s / vLLM alone's in the same round, with [min, max], and the same of its occupancy (vLLM's mean count of
running requests: the schedule's cost, steadier than tokens/s on a loaded machine).

    python bench/overhead.py                                   # tiny model, 64 sample prompts x 8
    python bench/overhead.py --rounds 5 --median-length 200 --max-length 1024
    python bench/overhead.py --data prompts.parquet --model DIR --sides vllm,baseline
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import at_least  # noqa: E402

SIDES = ("vllm", "vllm-delta", "baseline", "v3")
PDSR = ("baseline", "v3")
#: a pdsr side with this suffix runs its policy without dynamic segments (each sample in one request)
NOSEG = "-noseg"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data",
                   help="prompts file or folder (as pdsr rollout --data); default: the built-in sample prompts")
    p.add_argument("--prompts", type=at_least(1), default=64, help="prompts used (the data's first ones)")
    p.add_argument("--n", type=at_least(1), default=8, help="samples per prompt")
    p.add_argument("--median-length", type=at_least(1), default=120, help="median forced response length")
    p.add_argument("--max-length", type=at_least(1), default=512, help="longest forced response length")
    p.add_argument("--seed", type=int, default=0, help="seed of the lengths and of the engine's sampling")
    p.add_argument("--model", help="model directory (default: the built-in tiny model)")
    p.add_argument("--dtype", default="auto", help="engine dtype (as EngineSpec.dtype)")
    p.add_argument("--max-num-seqs", type=at_least(1), default=64, help="the engine's max_num_seqs")
    p.add_argument("--kv-gib", type=float, default=None, help="the engine's KV cache (CPU build, GiB; default 1)")
    p.add_argument("--core", type=int, default=0, help="the CPU core (GPU on a GPU build) the engine runs on")
    p.add_argument("--rounds", type=at_least(1), default=3, help="rounds of every side, the order alternating")
    p.add_argument("--sides", default="vllm,baseline,v3",
                   help=f"comma-separated, of {', '.join(SIDES)}, or a policy with {NOSEG} (without dynamic segments); "
                        f"vllm is needed (the reference)")
    p.add_argument("--driver-core", type=int, default=None,
                   help="the CPU core this process (the driver) runs on; default: the next one after --core, if any")
    args = p.parse_args(argv)
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    bad = [s for s in args.sides if s not in SIDES and s.removesuffix(NOSEG) not in PDSR]
    if bad or "vllm" not in args.sides or len(set(args.sides)) != len(args.sides):
        p.error(f"--sides: {','.join(args.sides)!r}: give each of {', '.join(SIDES)} (a policy also with {NOSEG}) at "
                f"most once, vllm among them")
    if args.kv_gib is not None and args.kv_gib <= 0:
        p.error(f"--kv-gib: {args.kv_gib} must be positive")
    if args.median_length > args.max_length:
        p.error(f"--median-length {args.median_length} is above --max-length {args.max_length}")
    return args


@dataclass
class Side:
    """One side's run: what it generated, in how long, at what driver CPU cost."""

    wall_s: float
    tokens: int
    cpu_s: float
    requests: int
    probes: int = 0
    #: vLLM's own count of running requests, averaged over the run (sampled every 20 ms)
    running: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def cpu_per_1k(self) -> float:
        return 1000 * self.cpu_s / self.tokens


def make_records(model: str, data: str | None, prompts: int, n: int, *, seed: int, median_length: int,
                 max_length: int):
    """The data's first ``prompts`` prompts, tokenized as ``pdsr rollout`` does, each with ``n`` forced lengths."""
    from pdsr_sdk.rollout.config import DataConfig
    from pdsr_sdk.rollout.data import load_prompts, load_tokenizer
    from pdsr_sdk.rollout.sample_data import default_sample_path
    from pdsr_sdk.traces import synth_trace

    path = data or default_sample_path()
    records = load_prompts(DataConfig(path=path, limit=prompts), load_tokenizer(model), path=path, n=n)
    trace = synth_trace(groups=len(records), n=n, seed=seed, median_length=float(median_length),
                        max_length=max_length, runaway_frac=0.0)
    for i, r in enumerate(records):
        r.target_lengths = [int(x) for x in trace.group(i)["lengths"]]
    return records


class Occupancy:
    """The engine's running requests as vLLM's scheduler last reported them, sampled every 20 ms while open."""

    def __init__(self, engine):
        self.engine, self.seen = engine, []

    async def _sample(self) -> None:
        while True:
            self.seen.append(self.engine.load().running)
            await asyncio.sleep(0.02)

    def __enter__(self):
        self.task = asyncio.get_running_loop().create_task(self._sample())
        return self

    def __exit__(self, *exc) -> None:
        self.task.cancel()

    @property
    def mean(self) -> float:
        return statistics.fmean(self.seen) if self.seen else 0.0


async def run_vllm(engine, records, *, output: str = "final", tag: str = "") -> Side:
    """vLLM alone: every sample's request to the engine's ``AsyncLLM`` at once; ends when the last one does."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    kind = RequestOutputKind.FINAL_ONLY if output == "final" else RequestOutputKind.DELTA
    llm = engine._llm   # the AsyncLLM pdsr's engine itself streams from (tests do the same)

    async def one(ids: list[int], max_tokens: int, rid: str) -> int:
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, ignore_eos=True, logprobs=0,
                                detokenize=False, output_kind=kind)
        got: list[int] = []
        lps: list[float] = []
        async for out in llm.generate(TokensPrompt(prompt_token_ids=ids), params, rid):
            comp = out.outputs[0]
            got.extend(comp.token_ids)
            if comp.logprobs:   # what a trainer keeps, as pdsr's engine does
                lps.extend(step[t].logprob for step, t in zip(comp.logprobs, comp.token_ids))
        return len(got)

    with Occupancy(engine) as occ:
        cpu, t0 = time.process_time(), time.perf_counter()
        counts = await asyncio.gather(*(one(r.token_ids, m, f"alone{tag}-{r.prompt_id}-{k}")
                                        for r in records for k, m in enumerate(r.target_lengths)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu
    return Side(wall, sum(counts), cpu, len(counts), running=occ.mean)


def session_config(model: str, records, policy: str, *, n: int, segments: bool):
    from pdsr_sdk.config import load_config
    from pdsr_sdk.rollout.config import RolloutConfig

    return load_config(RolloutConfig, None, {
        "model": model, "sampling.n": n, "sampling.ignore_eos": True,
        "sampling.max_tokens": max(max(r.target_lengths) for r in records), "batch_size": len(records),
        "policy": policy, "reward": "none", "segments.enabled": segments})


async def run_pdsr(engine, records, side: str, *, model: str, n: int) -> Side:
    """One batch of ``records`` through a pdsr session on ``engine`` (started, the caller's) with the side's
    policy (``NAME`` or ``NAME-noseg``)."""
    from pdsr_sdk.rollout.session import RolloutSession

    policy = side.removesuffix(NOSEG)
    segments = not side.endswith(NOSEG)
    session = RolloutSession(session_config(model, records, policy, n=n, segments=segments), engines=[engine],
                             model_dir=model)
    await session.start()
    try:
        with Occupancy(engine) as occ:
            cpu, t0 = time.process_time(), time.perf_counter()
            result = await session.generate(records)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu
    finally:
        await session.close()
    samples = [s for g in result.groups for s in g.samples]
    return Side(wall, sum(s.sampled_tokens for s in samples), cpu, sum(len(s.segments) for s in samples),
                probes=result.stats.get("probes", 0), running=occ.mean)


async def run_side(engine, records, side: str, *, model: str, n: int, tag: str) -> Side:
    if side.startswith("vllm"):
        return await run_vllm(engine, records, output="delta" if side == "vllm-delta" else "final", tag=tag)
    return await run_pdsr(engine, records, side, model=model, n=n)


def ratios(runs: dict[str, list[Side]], side: str) -> list[float]:
    """The side's tokens/s over vLLM alone's, round by round."""
    return [s.tokens_per_s / a.tokens_per_s for s, a in zip(runs[side], runs["vllm"])]


def occupancy_ratios(runs: dict[str, list[Side]], side: str) -> list[float]:
    """The side's mean running requests over vLLM alone's, round by round."""
    return [s.running / a.running for s, a in zip(runs[side], runs["vllm"])]


def order(sides: list[str], r: int) -> list[str]:
    """Round ``r``'s order: as given, then reversed, and so on (a drift of the machine hits every side alike)."""
    return list(sides) if r % 2 == 0 else list(reversed(sides))


def pin_driver(args) -> str:
    """Pin this process to ``--driver-core`` (default: the core after the engine's, if the machine has one), so that
    the driver and the engine do not take turns on one core (on a GPU machine the engine is on the GPU)."""
    import os

    cores = sorted(os.sched_getaffinity(0))
    core = args.driver_core
    if core is None:
        others = [c for c in cores if c != args.core]
        if not others:
            return "the engine's core too"
        core = next((c for c in others if c > args.core), others[0])
    elif core not in cores:
        raise SystemExit(f"error: --driver-core {core}: this process may run on cores {cores} only")
    os.sched_setaffinity(0, {core})
    return f"core {core}"


async def main_async(args) -> None:
    from pdsr_sdk.engines.vllm_engine import VllmEngine
    from pdsr_sdk.models.tiny import ensure_tiny_model
    from pdsr_sdk.rollout.config import EngineSpec

    model = args.model or str(ensure_tiny_model())
    records = make_records(model, args.data, args.prompts, args.n, seed=args.seed,
                           median_length=args.median_length, max_length=args.max_length)
    want = sum(sum(r.target_lengths) for r in records)
    longest = max(len(r.token_ids) for r in records) + args.max_length
    spec = EngineSpec(name="engine-0", pool="fast", devices=[args.core], max_num_seqs=args.max_num_seqs,
                      max_model_len=-(-longest // 256) * 256, dtype=args.dtype, kv_cache_gib=args.kv_gib)
    engine = VllmEngine.from_spec(spec, model=model, seed=args.seed)
    t0 = time.perf_counter()
    await engine.start()
    driver = pin_driver(args)   # after the start: the engine's processes keep the affinity they were given
    print(f"engine started in {time.perf_counter() - t0:.1f} s (not timed below); {len(records)} prompts x {args.n}, "
          f"{want} response tokens, longest {max(max(r.target_lengths) for r in records)}; max_num_seqs "
          f"{args.max_num_seqs}, KV cache {engine.kv_cache_tokens} tokens; engine on core {args.core}, driver on "
          f"{driver}", flush=True)
    runs: dict[str, list[Side]] = {s: [] for s in args.sides}
    try:
        warm = records[: max(1, len(records) // 8)]   # first-use costs of each path, outside the rounds
        for side in args.sides:
            await run_side(engine, warm, side, model=model, n=args.n, tag="-warm")
        for r in range(args.rounds):
            for side in order(args.sides, r):
                await engine.reset_prefix_cache()   # every side starts from the same, empty cache
                got = await run_side(engine, records, side, model=model, n=args.n, tag=f"-{r}")
                if got.tokens != want:
                    raise SystemExit(f"{side} generated {got.tokens} tokens, not the {want} forced")
                runs[side].append(got)
                print(f"  round {r}: {side:14s} {got.wall_s:7.2f} s  {got.tokens_per_s:8.1f} tok/s  driver CPU "
                      f"{got.cpu_per_1k:6.3f} s/1k tokens  {got.requests:5d} requests  {got.running:5.1f} running"
                      + (f"  {got.probes} probes" if got.probes else ""), flush=True)
    finally:
        await engine.close()
    print(f"\n{'side':15s}{'tok/s':>9s}{'vs vLLM alone':>15s}{'[min, max]':>17s}{'running':>9s}{'vs vLLM':>9s}"
          f"{'CPU s/1k tok':>14s}{'requests':>10s}")
    for side, rs in runs.items():
        tps = statistics.median(s.tokens_per_s for s in rs)
        q, occ = ratios(runs, side), occupancy_ratios(runs, side)
        print(f"{side:15s}{tps:9.1f}{statistics.median(q):14.3f}x{'  [' + f'{min(q):.3f}, {max(q):.3f}' + ']':>17s}"
              f"{statistics.median(s.running for s in rs):9.1f}{statistics.median(occ):8.3f}x"
              f"{statistics.median(s.cpu_per_1k for s in rs):14.3f}{statistics.median(s.requests for s in rs):10.0f}")
    print("\nmedians over rounds. vs vLLM alone: the side's tokens/s / vLLM alone's in the same round (1 = no "
          "overhead); running: vLLM's mean count of running requests, and the same ratio of it (the engine's "
          "occupancy: what the schedule costs, whatever the machine's load does to the engine's speed); CPU: the "
          "driver process's CPU seconds per 1k generated tokens.")


def main(argv=None) -> None:
    args = parse_args(argv)
    from pdsr_sdk.errors import PdsrError

    try:
        asyncio.run(main_async(args))
    except PdsrError as exc:   # bad data or model: the message names it
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
