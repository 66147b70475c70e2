"""Synthetic long-tailed length traces (see ``TraceSynthConfig`` for the model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pdsr_sdk.config import validate_config
from pdsr_sdk.errors import ConfigValueError
from pdsr_sdk.traces.config import TraceSynthConfig
from pdsr_sdk.traces.trace import LengthTrace


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
    durations = lengths / cfg.tokens_per_s if cfg.tokens_per_s else None
    width = len(str(g - 1))
    ids = [f"{cfg.id_prefix}{i:0{width}d}" for i in range(g)]
    return LengthTrace.from_matrix(lengths, prompt_ids=ids, prompt_lens=prompt_lens, durations_s=durations,
                                   finish_reasons=reasons,
                                   source=f"synth({cfg.family}, seed={cfg.seed})" if cfg.family else f"synth(seed={cfg.seed})")


def default_trace_path(groups: int) -> Path:
    """The built-in trace of ``pdsr simulate`` without one: ``TraceSynthConfig``'s defaults (lengths built to
    seed 002's statistics, seed 0) with ``groups`` groups, in pdsr's cache (``$PDSR_CACHE_DIR`` or
    ``~/.cache/pdsr``), written atomically on first use."""
    from pdsr_sdk.models.tiny import cache_dir
    from pdsr_sdk.traces.io import write_trace_jsonl

    base = TraceSynthConfig()
    path = cache_dir() / "data" / f"synth_{groups}x{base.n}_seed{base.seed}.jsonl"
    if not path.exists():
        write_trace_jsonl(synth_trace(base, groups=groups), path)
    return path
