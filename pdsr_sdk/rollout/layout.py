"""Which engines a run gets: an explicit list from config, or an automatic layout.

Automatic layout: on GPUs, one engine per GPU (``heavy_engines`` of them in
the heavy pool, default one per four GPUs, at least one); on the CPU build,
one fast and one heavy engine splitting the cores between them.
"""

from __future__ import annotations

import os

from pdsr_sdk.config import validate_config
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import EngineSpec
from pdsr_sdk.rollout.types import FAST, HEAVY

#: per-pool defaults for automatically laid-out engines
POOL_DEFAULTS = {
    FAST: {"max_num_seqs": 128},
    HEAVY: {"max_num_seqs": 64},
}


def available_devices(cpu: bool) -> list[int]:
    if not cpu:
        try:
            import torch

            return list(range(torch.cuda.device_count()))
        except ImportError:
            return []
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def engine_layout(config, *, required_pools: tuple[str, ...], cpu: bool, max_model_len: int) -> list[EngineSpec]:
    """The engine specs of a run (explicit ``config.engines`` or the automatic layout)."""
    if config.engines:
        specs = list(config.engines)
    else:
        specs = _auto_layout(config, cpu, max_model_len, required_pools)
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"engines: names must be unique; repeated: {', '.join(dupes)}")
    pools = {s.pool for s in specs}
    missing = [p for p in required_pools if p not in pools]
    if missing:
        raise ConfigError(f"engines: policy {config.policy.name!r} needs at least one engine in pool(s) "
                          f"{', '.join(missing)}; configured pools: {', '.join(sorted(pools)) or '(none)'}")
    return specs


def _auto_layout(config, cpu: bool, max_model_len: int, required_pools: tuple[str, ...]) -> list[EngineSpec]:
    devices = available_devices(cpu)
    wants_heavy = HEAVY in required_pools
    if cpu:
        n_fast = 1 if config.fast_engines is None else config.fast_engines
        n_heavy = (1 if wants_heavy else 0) if config.heavy_engines is None else config.heavy_engines
        n = n_fast + n_heavy
        if n == 0:
            raise ConfigError("fast_engines + heavy_engines is 0: a run needs at least one engine")
        # split the cores into n contiguous sets (engines share cores if there are fewer cores)
        groups = [devices[i * len(devices) // n:(i + 1) * len(devices) // n] or [devices[i % len(devices)]]
                  for i in range(n)]
    else:
        if not devices:
            raise ConfigError("no GPU found and vLLM is not the CPU build; install the 'cpu' extra on machines without a GPU")
        n_heavy = (max(1, len(devices) // 4) if wants_heavy else 0) if config.heavy_engines is None else config.heavy_engines
        n_fast = max(1, len(devices) - n_heavy) if config.fast_engines is None else config.fast_engines
        n = n_fast + n_heavy
        if n > len(devices):
            raise ConfigError(f"fast_engines + heavy_engines = {n} but only {len(devices)} GPU(s) are visible; "
                              f"list engines explicitly to share GPUs")
        groups = [[d] for d in devices[:n]]
    specs = []
    for i in range(n):
        pool, k = (FAST, i) if i < n_fast else (HEAVY, i - n_fast)
        data = {"name": f"{pool}-{k}", "pool": pool, "devices": groups[i], "max_model_len": max_model_len,
                **POOL_DEFAULTS[pool], **config.engine_defaults}
        specs.append(validate_config(EngineSpec, data, source="engine_defaults"))
    return specs
