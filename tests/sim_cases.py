"""Small simulated step streams shared by the simulator's and the policies' tests: a short synthetic
trace, a small engine profile, and a unit-cost one in which a sample launched at t with L tokens ends at
t + L."""

from __future__ import annotations

import numpy as np

from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.traces import LengthTrace, synth_trace

SMALL = dict(max_num_seqs=8, kv_cache_tokens=4096, block_size=16)
#: one token per second whatever runs: a sample launched at t with L tokens ends at t + L
UNIT = dict(max_num_seqs=64, kv_cache_tokens=65536, c0_s=1.0, c1_s_per_seq=0.0, c2_s_per_token=0.0,
            prefill_s_per_token=0.0)


def small_trace(groups=60, n=4, seed=2):
    return synth_trace(groups=groups, n=n, seed=seed, median_length=120, max_length=600, runaway_frac=0.03,
                       prompt_len_min=5, prompt_len_max=100)


def small_cfg(**kw):
    base = dict(policy="baseline", fast=2, heavy=1, batch_size=6, steps=6, timeline=False,
                profiles={"fast": SMALL, "heavy": SMALL}, segments={"min_tokens": 16, "max_tokens": 96})
    return SimulateConfig(**{**base, **kw})


def recorded(trace):
    return {pid: [max(1, int(x)) for x in trace.lengths[trace.offsets[g]:trace.offsets[g + 1]]]
            for g, pid in enumerate(trace.prompt_ids)}


def hand_trace(lengths):
    return LengthTrace.from_matrix(np.array(lengths)[:, None], prompt_ids=[f"g{i}" for i in range(len(lengths))],
                                   prompt_lens=np.full(len(lengths), 4))


def unit_cfg(**kw):
    return SimulateConfig(**{**dict(policy="baseline", fast=1, heavy=0, batch_size=1, steps=6, timeline=False,
                                     profiles={"fast": UNIT}, segments={"enabled": False}), **kw})
