"""Benchmark: GAE backends against a per-timestep torch loop and a memory copy.

    .venv/bin/python bench/gae.py                 # B=256,T=131072 and B=128,T=65536
    .venv/bin/python bench/gae.py --quick         # small shapes, a few seconds
    .venv/bin/python bench/gae.py --shapes 64x32768 --repeats 3

Data: float32 rewards and values (standard normal), a bool response mask,
right-padded with row lengths uniform in [T/2, T]; gamma 0.99, lambda 0.95.
For each shape it prints (median of --repeats runs, kernels warm):

- the per-timestep torch loop of seed 003 sec. 3.2 (slime: zero-padded,
  no mask) and verl's masked loop (``compute_gae_advantage_return``);
- the torch chunk-scan backend on CPU tensors for chunk 64/128/256
  (float64 scans, its default; also float32 scans, and an interior mask,
  which takes the compaction path, at chunk 256);
- the numba kernel (``out=`` buffers, after compilation) with a float32 and
  a float64 carry, and the simple one-token-per-step twin;
- a plain memory copy of the same bytes: ``np.copyto`` of rewards into the
  advantages buffer and of values into the returns buffer, plus
  ``np.count_nonzero`` of the mask, i.e. read rewards+values+mask and write
  advantages+returns: B*T*(4+4+1) bytes read + B*T*(4+4) written;

then the ratios torch-loop / numba (target >= 40x) and numba's effective
bandwidth (same byte count / time) over the copy's (target >= 30%, stretch
50%). The copy is single-threaded numpy; numba uses --threads threads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from bench_args import at_least

FULL = [(256, 131072), (128, 65536)]
QUICK = [(32, 16384), (16, 8192)]


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def torch_loop_slime(rewards, values, gamma: float, lam: float):
    """Seed 003 sec. 3.2: the batched per-timestep loop over zero-padded tensors."""
    import torch

    rows, steps = rewards.shape
    lastgaelam = torch.zeros(rows, dtype=rewards.dtype)
    adv_rev = []
    for t in reversed(range(steps)):
        next_value = values[:, t + 1] if t < steps - 1 else 0.0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        adv_rev.append(lastgaelam)
    adv = torch.stack(adv_rev[::-1], dim=1)
    return adv, adv + values


def torch_loop_verl(rewards, values, mask, gamma: float, lam: float):
    """verl's masked per-timestep loop (float mask arithmetic instead of branches)."""
    import torch

    rows, steps = rewards.shape
    m = mask.to(rewards.dtype)
    nextvalues = torch.zeros(rows, dtype=rewards.dtype)
    lastgaelam = torch.zeros(rows, dtype=rewards.dtype)
    adv_rev = []
    for t in reversed(range(steps)):
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        cand = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * m[:, t] + (1 - m[:, t]) * nextvalues
        lastgaelam = cand * m[:, t] + (1 - m[:, t]) * lastgaelam
        adv_rev.append(lastgaelam)
    adv = torch.stack(adv_rev[::-1], dim=1)
    return adv, adv + values


def make_data(rows: int, steps: int, seed: int):
    rng = np.random.default_rng(seed)
    rewards = rng.standard_normal((rows, steps), dtype=np.float32)
    values = rng.standard_normal((rows, steps), dtype=np.float32)
    lengths = rng.integers(steps // 2, steps + 1, size=rows) if steps > 1 else np.ones(rows, np.int64)
    mask = np.arange(steps)[None, :] < lengths[:, None]
    return rewards, values, mask


def run_shape(rows: int, steps: int, args) -> None:
    import torch

    from pdsr_sdk.gae import compute_gae
    from pdsr_sdk.gae.numba_kernel import NumbaGae, available_threads, numba_gae

    gamma, lam = 0.99, 0.95
    rewards, values, mask = make_data(rows, steps, args.seed)
    adv = np.empty_like(rewards)
    ret = np.empty_like(rewards)
    tokens = rows * steps
    n_read = tokens * (rewards.itemsize + values.itemsize + mask.itemsize)
    n_write = tokens * (adv.itemsize + ret.itemsize)
    threads = args.threads or available_threads()
    print(f"\n== B={rows} T={steps} ({tokens / 1e6:.1f}M tokens), gamma {gamma}, lambda {lam}, "
          f"numba threads {threads}, torch threads {torch.get_num_threads()}")
    print(f"   bytes per run: read {n_read / 1e6:.0f} MB (rewards f32 + values f32 + mask bool) "
          f"+ write {n_write / 1e6:.0f} MB (advantages f32 + returns f32) = {(n_read + n_write) / 1e6:.0f} MB")

    def copy():
        np.copyto(adv, rewards)
        np.copyto(ret, values)
        np.count_nonzero(mask)

    copy()
    t_copy = median_time(copy, args.repeats)

    for carry in ("float32", "float64"):
        NumbaGae().warmup("float32", carry)
    numba_gae(rewards, values, mask, gamma, lam, carry_dtype="float32", kernel="simple", out=(adv, ret))
    t_nb = {carry: median_time(lambda c=carry: compute_gae(rewards, values, mask, gamma, lam, backend="numba",
                                                           carry_dtype=c, threads=threads, out=(adv, ret)),
                               args.repeats)
            for carry in ("float32", "float64")}
    t_simple = median_time(lambda: numba_gae(rewards, values, mask, gamma, lam, carry_dtype="float32",
                                             kernel="simple", threads=threads, out=(adv, ret)), args.repeats)

    tr, tv, tm = torch.from_numpy(rewards), torch.from_numpy(values), torch.from_numpy(mask)
    interior = torch.from_numpy(np.random.default_rng(args.seed + 1).random((rows, steps)) < 0.9)
    t_chunk = {}
    for chunk in (64, 128, 256):
        t_chunk[(chunk, "float64", "right-padded")] = median_time(
            lambda c=chunk: compute_gae(tr, tv, tm, gamma, lam, backend="torch", chunk_size=c), args.repeats)
    t_chunk[(256, "float32", "right-padded")] = median_time(
        lambda: compute_gae(tr, tv, tm, gamma, lam, backend="torch", chunk_size=256, carry_dtype="float32"),
        args.repeats)
    t_chunk[(256, "float64", "interior")] = median_time(
        lambda: compute_gae(tr, tv, interior, gamma, lam, backend="torch", chunk_size=256), args.repeats)

    zero_padded_r = torch.where(tm, tr, 0.0)
    zero_padded_v = torch.where(tm, tv, 0.0)
    t_slime = median_time(lambda: torch_loop_slime(zero_padded_r, zero_padded_v, gamma, lam), args.loop_repeats)
    t_verl = median_time(lambda: torch_loop_verl(tr, tv, tm, gamma, lam), args.loop_repeats)

    def line(name: str, seconds: float) -> None:
        gbs = (n_read + n_write) / seconds / 1e9
        print(f"   {name:<52} {seconds * 1e3:10.1f} ms  {gbs:6.1f} GB/s")

    line(f"torch loop, slime (no mask) x{args.loop_repeats}", t_slime)
    line(f"torch loop, verl (masked) x{args.loop_repeats}", t_verl)
    for (chunk, scan, kind), seconds in t_chunk.items():
        line(f"torch chunk-scan CPU, chunk {chunk}, {scan} scans, {kind}", seconds)
    line("numba simple one-token-per-step twin, float32 carry", t_simple)
    line("numba kernel, float32 carry (default for float32 data)", t_nb["float32"])
    line("numba kernel, float64 carry", t_nb["float64"])
    line("memory copy (np.copyto x2 + count_nonzero), 1 thread", t_copy)
    print(f"   ratio torch loop / numba (float32 carry): slime {t_slime / t_nb['float32']:.0f}x, "
          f"verl {t_verl / t_nb['float32']:.0f}x; with float64 carry: slime {t_slime / t_nb['float64']:.0f}x, "
          f"verl {t_verl / t_nb['float64']:.0f}x  (target >= 40x)")
    print(f"   numba bandwidth / copy bandwidth: float32 carry {t_copy / t_nb['float32']:.0%}, "
          f"float64 carry {t_copy / t_nb['float64']:.0%}  (target >= 30%, stretch 50%)")
    print(f"   numba kernel / simple twin speed-up (float32 carry): {t_simple / t_nb['float32']:.2f}x")


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``--shapes``: comma-separated ``BxT`` with B, T >= 1 (``64x32768,16x8192``)."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
            raise argparse.ArgumentTypeError(f"{item!r} is not BxT with B, T >= 1 (e.g. 64x32768)")
        shapes.append((int(parts[0]), int(parts[1])))
    return shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=parse_shapes, default=None,
                        help="comma-separated BxT shapes (default: 256x131072,128x65536)")
    parser.add_argument("--quick", action="store_true", help=f"small shapes ({QUICK}) for a quick check")
    parser.add_argument("--repeats", type=at_least(1), default=5,
                        help="timed runs of each fast variant (median; default 5)")
    parser.add_argument("--loop-repeats", type=at_least(1), default=1,
                        help="timed runs of each per-timestep torch loop (seconds each at full size; default 1)")
    parser.add_argument("--threads", type=at_least(0), default=0, help="numba threads (default, 0: all available)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random data")
    args = parser.parse_args()
    shapes = args.shapes or (QUICK if args.quick else FULL)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    print(f"GAE benchmark: {os.cpu_count()} CPUs, numpy {np.__version__}")
    for rows, steps in shapes:
        run_shape(rows, steps, args)


if __name__ == "__main__":
    main()
