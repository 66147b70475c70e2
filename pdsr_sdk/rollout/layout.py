"""Which engines a run gets: an explicit list from config, or an automatic layout.

Automatic layout: on GPUs, one engine per GPU, or per ``tensor_parallel_size``
GPUs where ``engine_defaults`` sets it (``heavy`` of them in the heavy pool; by
default one per four engines, at least one, for a policy whose
``required_pools`` names the heavy pool, and none for the others); on the CPU
build, one engine on all cores, and a second, heavy one splitting the cores with
it for a policy that needs a heavy pool. Every engine of the automatic layout
starts with the same vLLM settings (equal engines; "heavy" is a role a policy
gives some of them); ``engine_defaults`` changes them all, and an explicit
engine list may still make them differ. With a
``ray`` section the automatic layout's engines are Ray actors (backend
``ray``) and the GPUs counted are the Ray cluster's.
"""

from __future__ import annotations

import os
from pathlib import Path

from pdsr_sdk.config import validate_config
from pdsr_sdk.dispatch.types import FAST, HEAVY
from pdsr_sdk.engines.config import EngineSpec, RayConfig
from pdsr_sdk.errors import ConfigError

#: settings of every automatically laid-out engine, fast or heavy (equal engines; heavy is a role)
ENGINE_DEFAULTS = {"max_num_seqs": 128}


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
    ray_gpus = None   # GPUs of the Ray cluster, for the automatic layout of Ray engines
    if config.engines:
        specs = list(config.engines)
    else:
        if config.ray is not None:
            from pdsr_sdk.engines.ray_cluster import cluster_gpus

            ray_gpus = cluster_gpus(config.ray)
            cpu = ray_gpus == 0
        specs = _auto_layout(config, cpu, max_model_len, required_pools, ray_gpus)
    specs = [_with_ray_settings(config, i, s) for i, s in enumerate(specs)]
    for i, s in enumerate(specs):   # vLLM would fail at start, far from the config
        if not cpu and s.backend == "vllm" and s.devices and len(s.devices) != s.tensor_parallel_size:
            raise ConfigError(f"engines[{i}] ({s.name!r}): devices {s.devices} are {len(s.devices)} GPU(s) but "
                              f"tensor_parallel_size is {s.tensor_parallel_size}; give one GPU per rank")
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"engines: names must be unique; repeated: {', '.join(dupes)}")
    pools = {s.pool for s in specs}
    missing = [p for p in required_pools if p not in pools]
    if missing:
        raise ConfigError(f"engines: policy {config.policy!r} needs at least one engine in pool(s) "
                          f"{', '.join(missing)}; configured pools: {', '.join(sorted(pools)) or '(none)'}")
    return specs


def _with_ray_settings(config, index: int, spec: EngineSpec) -> EngineSpec:
    """A ``ray`` engine gets the run's ray section merged under its own keys; Ray must be installed."""
    if spec.backend != "ray":
        if spec.ray is not None:
            raise ConfigError(f"engines[{index}] ({spec.name!r}): 'ray' settings need backend 'ray', "
                              f"not {spec.backend!r}")
        return spec
    from pdsr_sdk.engines.ray_cluster import merge_ray_config, require_ray

    require_ray()
    return spec.model_copy(update={"ray": merge_ray_config(config.ray, spec.ray) or RayConfig()})


def _auto_layout(config, cpu: bool, max_model_len: int, required_pools: tuple[str, ...],
                 ray_gpus: int | None = None) -> list[EngineSpec]:
    tp = _tensor_parallel_size(config)
    if ray_gpus:   # one engine slot per tensor-parallel group of the cluster's GPUs (Ray assigns them)
        devices = list(range(ray_gpus // tp))
        slots = [[d] for d in devices]
    else:
        devices = available_devices(cpu)
        slots = [devices[i * tp:(i + 1) * tp] for i in range(len(devices) // tp)]
    wants_heavy = HEAVY in required_pools
    if cpu:
        n_fast = 1 if config.fast is None else config.fast
        n_heavy = (1 if wants_heavy else 0) if config.heavy is None else config.heavy
        n = n_fast + n_heavy
        if n == 0:
            raise ConfigError("fast + heavy is 0: a run needs at least one engine")
        # split the cores into n contiguous sets (engines share cores if there are fewer cores)
        groups = [devices[i * len(devices) // n:(i + 1) * len(devices) // n] or [devices[i % len(devices)]]
                  for i in range(n)]
    else:
        if not devices and not ray_gpus:
            raise ConfigError("no GPU found and vLLM is not the CPU build; install the 'cpu' extra on machines without "
                              "a GPU")
        gpus = ray_gpus or len(devices)
        if not slots:
            raise ConfigError(f"engine_defaults.tensor_parallel_size is {tp} but only {gpus} GPU(s) are visible")
        n_heavy = (max(1, len(slots) // 4) if wants_heavy else 0) if config.heavy is None else config.heavy
        n_fast = max(1, len(slots) - n_heavy) if config.fast is None else config.fast
        n = n_fast + n_heavy
        if n > len(slots):
            fit = f"{len(slots)} engine(s) of {tp} GPUs fit the {gpus} visible GPUs" if tp > 1 \
                else f"only {gpus} GPU(s) are visible"
            raise ConfigError(f"fast + heavy = {n} but {fit}; list engines explicitly to share GPUs")
        groups = slots[:n]
    specs = []
    for i in range(n):
        pool, k = (FAST, i) if i < n_fast else (HEAVY, i - n_fast)
        data = {"name": f"{pool}-{k}", "pool": pool, "devices": groups[i], "max_model_len": max_model_len,
                **ENGINE_DEFAULTS}
        if config.ray is not None:   # Ray engines: Ray assigns GPUs; CPU engines keep the core split per node
            data.update(backend="ray", devices=groups[i] if cpu else [])
        data.update(config.engine_defaults)
        specs.append(validate_config(EngineSpec, data, source="engine_defaults"))
    return specs


def _tensor_parallel_size(config) -> int:
    """``engine_defaults.tensor_parallel_size`` (GPUs per engine); a bad value is left to EngineSpec's check."""
    try:
        return max(1, int(config.engine_defaults.get("tensor_parallel_size", 1)))
    except (TypeError, ValueError):
        return 1


def starting_message(specs: list, model_dir: str) -> str:
    """The status line before engines start: ``starting 2 vLLM engines (1 fast, 1 heavy; model tiny-qwen2) ...``"""
    pools: dict[str, int] = {}
    for spec in specs:
        pools[spec.pool] = pools.get(spec.pool, 0) + 1
    kind = "vLLM " if all(spec.backend in ("vllm", "ray") for spec in specs) else ""
    ray = " on Ray" if any(spec.backend == "ray" for spec in specs) else ""
    return (f"starting {len(specs)} {kind}engine{'s' if len(specs) != 1 else ''}{ray} "
            f"({', '.join(f'{n} {pool}' for pool, n in pools.items())}; model {Path(model_dir).name}) ...")
