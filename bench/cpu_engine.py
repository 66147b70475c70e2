"""A CPU engine's start and its decode speed in bf16 and fp32, and the dtype ``auto`` picks on this CPU.

One pdsr ``VllmEngine`` (the CPU build) on one core at a time: each round starts an engine in each
dtype, alternating (A B A B ...), times its start (``engine.start()``: processes, model load,
KV cache, the warm-up request), then decodes ``--requests`` requests of ``--tokens`` tokens each
at once and times them. The ratio printed is the median over rounds of fp32 / bf16 decode speed in
the same round, so a machine's load shifts both sides alike. No target: it measures. Each engine start takes
15-80 s on 2 shared cores, so ``--rounds 1 --requests 4 --tokens 32`` takes about 3 minutes, the defaults 4-6.

    python bench/cpu_engine.py                       # the built-in tiny model, 2 rounds
    python bench/cpu_engine.py --model DIR --rounds 3 --requests 16 --tokens 128
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import at_least, check_model_dir, run_engines  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: the built-in tiny model)")
    p.add_argument("--rounds", type=at_least(1), default=2, help="rounds of both dtypes, alternating")
    p.add_argument("--requests", type=at_least(1), default=16, help="requests decoded at once")
    p.add_argument("--tokens", type=at_least(1), default=128, help="tokens per request (ignore_eos)")
    p.add_argument("--core", type=at_least(0), default=0, help="the CPU core the engine runs on")
    args = p.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    if args.core not in cores:
        p.error(f"argument --core: {args.core} is not a core this process may run on ({cores[0]}-{cores[-1]})")
    check_model_dir(p, args.model)
    return args


class _Ends:
    """Counts tokens and ended requests (the engine listener's callbacks)."""

    def __init__(self):
        self.tokens = 0
        self.ended = 0

    def on_tokens(self, engine, rid, n, ids, lps):
        self.tokens += len(ids)

    def on_segment_end(self, engine, rid, reason):
        self.ended += 1

    def on_engine_dead(self, engine, error):
        raise SystemExit(f"engine died: {error}")


async def one(model: str, dtype: str, args) -> tuple[float, float]:
    """(start seconds, decode tokens/s) of one engine in ``dtype``."""
    from pdsr_sdk.dispatch.types import SegmentRequest
    from pdsr_sdk.engines.vllm_engine import VllmEngine
    from pdsr_sdk.rollout.config import EngineSpec, SamplingConfig
    from pdsr_sdk.rollout.data import PromptRecord, build_groups

    spec = EngineSpec(name=f"{dtype}-0", pool="fast", devices=[args.core], max_num_seqs=args.requests,
                      max_model_len=args.tokens + 64, dtype=dtype)
    engine = VllmEngine.from_spec(spec, model=model)
    ends = _Ends()
    engine.bind(ends)
    t0 = time.perf_counter()
    await engine.start()
    started = time.perf_counter() - t0
    try:
        ids = [5, 6, 7, 8, 9]
        groups = build_groups([PromptRecord(f"p{i}", "p", ids) for i in range(args.requests)], 1, args.tokens)
        t0 = time.perf_counter()
        for i, g in enumerate(groups):
            engine.submit(SegmentRequest(request_id=f"r{i}", context_ids=ids, context_len=len(ids),
                                         max_tokens=args.tokens, ignore_eos=True,
                                         sampling=SamplingConfig(temperature=1.0), sample=g.samples[0]))
        while ends.ended < args.requests:
            await asyncio.sleep(0.01)
        return started, ends.tokens / (time.perf_counter() - t0)
    finally:
        await engine.close()


async def main_async(args) -> None:
    from pdsr_sdk.engines.vllm_env import BF16_CPU_FLAGS, cpu_dtype, cpu_flags
    from pdsr_sdk.models.tiny import ensure_tiny_model

    model = args.model or str(ensure_tiny_model())
    native = sorted(set(BF16_CPU_FLAGS) & cpu_flags())
    print(f"model {model}; native bf16 flags: {', '.join(native) or 'none'}; 'auto' picks {cpu_dtype('auto')}")
    ratios = []
    for r in range(args.rounds):
        got = {}
        for dtype in (("bfloat16", "float32") if r % 2 == 0 else ("float32", "bfloat16")):
            got[dtype] = await one(model, dtype, args)
            print(f"round {r + 1} {dtype:8s}: start {got[dtype][0]:6.1f} s, decode {got[dtype][1]:8.1f} tokens/s",
                  flush=True)
        ratios.append(got["float32"][1] / got["bfloat16"][1])
    print(f"fp32 / bf16 decode speed: median {statistics.median(ratios):.2f}x "
          f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})")


def main() -> None:
    run_engines(main_async(parse_args()))


if __name__ == "__main__":
    main()
