"""Synthetic long-tailed length traces (see ``TraceSynthConfig`` for the model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pdsr_sdk.config import validate_config
from pdsr_sdk.errors import ConfigValueError
from pdsr_sdk.traces.config import TraceSynthConfig
from pdsr_sdk.traces.trace import LengthTrace, SampleTurns


def synth_trace(config: TraceSynthConfig | None = None, **overrides) -> LengthTrace:
    """Draw a reproducible synthetic trace; ``overrides`` replace config fields (``groups=64``).

    With a ``family`` (``synth_trace(family="heavy", seed=101)``) the member's parameters are the defaults
    (:mod:`pdsr_sdk.traces.family`); a recorded member resamples its recorded groups instead."""
    if config is None:
        cfg = validate_config(TraceSynthConfig, overrides)   # errors name the key
    elif overrides:
        if overrides.get("family", config.family) != config.family:
            raise ConfigValueError(f"synth_trace: family={overrides['family']!r} over a config of family "
                                   f"{config.family!r} would keep the config's values; pass the family in the "
                                   f"config, or without one")
        cfg = validate_config(TraceSynthConfig, {**config.model_dump(), **overrides})
    else:
        cfg = config
    if cfg.family is not None:
        from pdsr_sdk.traces.family import resampled_member_trace, workload

        member = workload(cfg.family)
        if member.recorded is not None:
            return resampled_member_trace(member, cfg)
    g, n = cfg.groups, cfg.n
    rng = np.random.default_rng(cfg.seed)
    # Draw order is part of the format: changing it changes every trace for a seed.
    prompt_lens = rng.integers(cfg.prompt_len_min, cfg.prompt_len_max + 1, size=g, dtype=np.int64)
    difficulty = cfg.median_length * np.exp(cfg.prompt_sigma * rng.standard_normal(g))
    raw = difficulty[:, None] * np.exp(cfg.noise_sigma * rng.standard_normal((g, n)))
    u = rng.random((g, n))
    rate = cfg.runaway_frac
    if cfg.runaway_concentration is not None and 0.0 < rate < 1.0:
        k = cfg.runaway_concentration
        rate = rng.beta(rate * k, (1.0 - rate) * k, size=g)[:, None]   # drawn last: traces without it are unchanged
    runaway = u < rate
    lengths = np.clip(np.rint(raw), cfg.min_length, cfg.max_length).astype(np.int64)
    lengths[runaway] = cfg.max_length
    reasons = np.where(lengths >= cfg.max_length, "length", "stop").astype(object)
    turns = None
    if cfg.turns_max > 1:   # drawn after everything above: single-turn traces are unchanged
        turns, lengths = _draw_turns(cfg, rng, lengths)
    durations = lengths / cfg.tokens_per_s if cfg.tokens_per_s else None
    width = len(str(g - 1))
    ids = [f"{cfg.id_prefix}{i:0{width}d}" for i in range(g)]
    return LengthTrace.from_matrix(lengths, prompt_ids=ids, prompt_lens=prompt_lens, durations_s=durations,
                                   finish_reasons=reasons, turns=turns,
                                   source=(f"synth({cfg.family}, seed={cfg.seed})" if cfg.family
                                           else f"synth(seed={cfg.seed})"))


def _draw_turns(cfg: TraceSynthConfig, rng: np.random.Generator, sampled: np.ndarray) -> tuple[SampleTurns, np.ndarray]:
    """Each sample's turns (``TraceSynthConfig``'s model) from its sampled length; returns them and the lengths
    with the environment's tokens added."""
    g, n = sampled.shape
    centre = rng.uniform(cfg.turns_min, cfg.turns_max, size=g)
    k = np.clip(np.rint(centre[:, None] + cfg.turns_noise * rng.standard_normal((g, n))), cfg.turns_min,
                cfg.turns_max).astype(np.int64)
    k = np.minimum(k, np.maximum(sampled, 1))
    gaps = int(k.sum() - k.size)
    env = rng.integers(cfg.env_tokens_min, cfg.env_tokens_max + 1, size=gaps, dtype=np.int64)
    if cfg.env_delay_min_s > 0:
        delay = np.exp(rng.uniform(np.log(cfg.env_delay_min_s), np.log(cfg.env_delay_max_s), size=gaps))
    else:
        delay = rng.uniform(0.0, cfg.env_delay_max_s, size=gaps)
    rows: list[list[tuple[int, int, float]] | None] = []
    totals = np.zeros_like(sampled)
    e = 0
    flat_k, flat_len = k.reshape(-1).tolist(), sampled.reshape(-1).tolist()
    for i, (turns, length) in enumerate(zip(flat_k, flat_len)):
        length = max(int(length), 1)
        cuts = np.sort(rng.choice(length - 1, size=turns - 1, replace=False) + 1) if turns > 1 else np.empty(0, int)
        parts = np.diff(np.concatenate(([0], cuts, [length]))).tolist()
        row = []
        for j, part in enumerate(parts):
            if j < turns - 1:
                row.append((int(part), int(env[e]), float(delay[e])))
                e += 1
            else:
                row.append((int(part), 0, 0.0))
        rows.append(row)
        totals.reshape(-1)[i] = length + sum(r[1] for r in row)
    return SampleTurns.from_lists(rows), totals


def default_trace_path(groups: int, family: str | None = None, seed: int | None = None) -> Path:
    """The built-in trace of ``pdsr simulate`` without one: ``TraceSynthConfig``'s defaults (the workload family's
    ``informative`` member, median ~420 tokens, p99 ~1.4k; seed 0) with ``groups`` groups, in pdsr's cache
    (``$PDSR_CACHE_DIR`` or ``~/.cache/pdsr``), written atomically on first use. With ``family``, that member's
    draw instead (``seed``, default its first pinned seed), as ``pdsr trace synth --family`` writes it."""
    from pdsr_sdk.models.tiny import cache_dir
    from pdsr_sdk.traces.io import write_trace_jsonl

    if family is None:
        if seed is not None:
            raise ConfigValueError("default_trace_path: a seed is for a family member's draw; give the family")
        base = TraceSynthConfig()
        name = f"synth_{groups}x{base.n}_seed{base.seed}"
        draw = lambda: synth_trace(base, groups=groups)  # noqa: E731
    else:
        from pdsr_sdk.traces.family import workload

        member = workload(family)
        seed = member.measure.seeds[0] if seed is None else seed
        name = f"{family}_{groups}x{member.config(groups=groups, seed=seed).n}_seed{seed}"
        draw = lambda: member.trace(groups=groups, seed=seed)  # noqa: E731
    path = cache_dir() / "data" / f"{name}.jsonl"
    if not path.exists():
        write_trace_jsonl(draw(), path)
    return path
