"""The lower bound of a simulated batch from its finished samples (:func:`sample_bounds`: the work and the
longest sample alone of :mod:`~pdsr_sdk.sim.report`, with the prompt cache and turns), at the cheapest costs of
the pools in use (:func:`bound_coefficients`)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from pdsr_sdk.dispatch.types import Sample
from pdsr_sdk.sim.config import EngineProfile, SimulateConfig
from pdsr_sdk.sim.cost import least_prefill
from pdsr_sdk.sim.report import batch_bounds


def bound_coefficients(cfg: SimulateConfig) -> dict[str, float]:
    """The cheapest cost of every term over the pools that have engines (for the lower bound)."""
    profiles: list[EngineProfile] = []
    if cfg.fast:
        profiles.append(cfg.profiles.fast)
    if cfg.heavy:
        profiles.append(cfg.profiles.heavy)
    return dict(c0=min(p.c0_s for p in profiles), c1=min(p.c1_s_per_seq for p in profiles),
                c2=min(p.c2_s_per_token for p in profiles), prefill=min(p.prefill_s_per_token for p in profiles),
                max_seqs=max(p.max_num_seqs for p in profiles))


def least_prefill_tokens(prompt_len, prompt_ids, cfg: SimulateConfig, *, each: bool = False) -> np.ndarray:
    """The least tokens each sample of a batch prefills (for the lower bound). Together (the work): the first
    sample of each prompt its whole prompt, a later one, where a pool in use caches prompts, the least that
    any such pool's prefix cache leaves (``cost.least_prefill``). ``each``: the least each one alone may
    prefill (the longest-sample bound): which sample of a shared prompt comes first is not known, so only a
    prompt's sole sample pays it whole."""
    if each:
        counts = Counter(prompt_ids)
        whole = np.fromiter((counts[pid] == 1 for pid in prompt_ids), dtype=bool, count=len(prompt_ids))
    else:
        firsts = {pid: i for i, pid in reversed(list(enumerate(prompt_ids)))}   # each prompt's first index
        whole = np.zeros(len(prompt_ids), dtype=bool)
        whole[list(firsts.values())] = True
    blocks = {p.block_size for p, k in ((cfg.profiles.fast, cfg.fast), (cfg.profiles.heavy, cfg.heavy))
              if k and p.prompt_cache}
    if not blocks:
        return np.asarray(prompt_len, dtype=np.int64)
    return np.min([least_prefill(prompt_len, whole, b) for b in sorted(blocks)], axis=0)


def sample_bounds(samples: list[Sample], engines: int, cfg: SimulateConfig,
                  coeffs: dict[str, float]) -> tuple[float, float]:
    """(work / engines, longest alone) of finished samples (``report.batch_bounds``), with each prompt's
    least prefill (:func:`least_prefill_tokens`); samples with turns by :func:`turn_bounds`."""
    plen = np.fromiter((s.group.prompt_len for s in samples), dtype=np.int64, count=len(samples))
    gen = np.fromiter((s.num_generated for s in samples), dtype=np.int64, count=len(samples))
    pids = [s.group.prompt_id for s in samples]
    if any(s.turns is not None for s in samples):
        return turn_bounds(samples, plen, pids, engines, cfg, coeffs)
    return batch_bounds(plen, gen, engines, **coeffs, prefill_len=least_prefill_tokens(plen, pids, cfg),
                        alone_prefill_len=least_prefill_tokens(plen, pids, cfg, each=True))


def turn_bounds(samples: list[Sample], plen: np.ndarray, pids: list[str], engines: int, cfg: SimulateConfig,
                coeffs: dict[str, float]) -> tuple[float, float]:
    """The lower bound of :mod:`~pdsr_sdk.sim.report` for samples with turns: a sampled token is a step at its
    context (prompt + every response token before it, the environment's included), the environment's tokens are
    prefilled at least once each, and alone a sample also waits out its environment's delays one after another."""
    c0, c1, c2, p, m = coeffs["c0"], coeffs["c1"], coeffs["c2"], coeffs["prefill"], coeffs["max_seqs"]
    q = least_prefill_tokens(plen, pids, cfg).astype(np.float64)
    q_alone = least_prefill_tokens(plen, pids, cfg, each=True).astype(np.float64)
    sampled, env, delay, ctx = (np.zeros(len(samples)) for _ in range(4))
    for i, s in enumerate(samples):
        target = s.group.target_turns
        turns = target[s.index] if target is not None else None
        big_p = float(s.group.prompt_len)
        if turns is None:
            n = float(s.num_generated)
            sampled[i], ctx[i] = n, n * big_p + n * (n - 1) / 2
            continue
        pos = 0
        for k, e, d in turns:
            sampled[i] += k
            ctx[i] += k * (big_p + pos) + k * (k - 1) / 2
            pos += k + e
            env[i] += e
            delay[i] += d
    work = p * (q + env) + sampled * (c0 / m + c1) + c2 * ctx
    alone = p * (q_alone + env) + sampled * (c0 + c1) + c2 * ctx + delay
    return float(work.sum()) / engines, float(alone.max()) if alone.size else 0.0
