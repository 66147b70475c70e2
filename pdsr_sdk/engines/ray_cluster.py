"""The Ray cluster a :class:`~pdsr_sdk.engines.ray_engine.RayEngine` runs on: connecting to it (once per
process), what one engine's actor asks of it (resources, placement-group bundles, its Ray settings), and awaiting
its answers (:func:`wait_ref`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Any

from pdsr_sdk.errors import ConfigError

INSTALL_HINT = ("install Ray: in a pdsr checkout `bash scripts/install.sh cpu,ray` (gpu,ray on GPU machines), or "
                "`pip install ray`")
#: how long a head address may take to accept a TCP connection before the run says nothing answers there
PROBE_TIMEOUT_S = 10.0
_START_HINT = ("start a cluster first (`ray start --head` on this machine, `ray start --address=HEAD:6379` "
               "on the others) or use address 'local' (--ray local) for a one-machine cluster")
#: Ray 2.60's `ray start --head` turns token authentication on by default; a driver needs RAY_AUTH_MODE=token
_AUTH_HINT = ("for a cluster with Ray's token authentication, set RAY_AUTH_MODE=token here, with the cluster's "
              "token in ~/.ray/auth_token or RAY_AUTH_TOKEN (`ray get-auth-token` on its head prints it)")

_connected_address: str | None = None   # the address this process called ray.init with


def require_ray():
    """The ``ray`` module, or a ConfigError telling how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"Ray engines (backend 'ray', the 'ray' config section, --ray) need Ray, which is "
                          f"not installed here ({exc}); {INSTALL_HINT}") from None
    return ray


def connect(cfg) -> Any:
    """Connect this process to the Ray cluster of ``cfg`` (a RayConfig) once; returns ``ray``.

    If Ray is already initialised (by a trainer, a test, or an earlier engine) that
    connection is used as it is.
    """
    global _connected_address
    ray = require_ray()
    if ray.is_initialized():
        if _connected_address is not None and cfg.address != _connected_address:
            raise ConfigError(f"ray.address: this process is connected to Ray at {_connected_address!r}; "
                              f"an engine asks for {cfg.address!r} (all Ray engines of a process share one cluster)")
        return ray
    kwargs: dict[str, Any] = {"namespace": cfg.namespace, "logging_level": "WARNING"}
    _check_head_address(cfg.address)
    try:
        if cfg.address == "local":
            # address 'local', not None: None joins a cluster `ray start` left running on this machine
            ray.init(address="local", num_cpus=cfg.local_num_cpus, include_dashboard=False, **kwargs)
        else:
            ray.init(address=cfg.address, **kwargs)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        # ConnectionError: no cluster found; ValueError: an address Ray cannot parse; RuntimeError: Ray gave up
        # on the head's GCS after its retries
        detail = " ".join(str(exc).split())
        cause = str(exc.__cause__ or "").strip()
        if cause:   # Ray's "Failed to connect to Ray cluster at X" hides why (an auth token, ...): its last line says
            detail += f"; {cause.splitlines()[-1].strip()}"
        raise ConfigError(f"ray.address {cfg.address!r}: cannot connect to a Ray cluster ({type(exc).__name__}: "
                          f"{detail}); {_hint(cfg.address, detail)}") from None
    _connected_address = cfg.address
    return ray


def _hint(address: str, detail: str) -> str:
    """What to do about a failed ray.init: the token where the head refused it, else start a cluster."""
    if "InvalidAuthToken" in detail or "AuthenticationError" in detail:
        return _AUTH_HINT
    if (address.startswith("ray://") and "connection timeout" in detail
            and os.environ.get("RAY_AUTH_MODE", "").lower() != "token"):
        # a Ray Client server that wants a token drops the tokenless client: it sees only a timeout (Ray 2.60)
        return f"a Ray Client server that requires a token only times out a client without one; {_AUTH_HINT}; " \
               f"otherwise {_START_HINT}"
    return _START_HINT


def _check_head_address(address: str) -> None:
    """A ConfigError unless ``address`` (or, for 'auto', a RAY_ADDRESS it stands for) is 'local', 'auto', a
    Ray Client address, or a HOST:PORT that accepts a TCP connection.

    ray.init retries a head address where nothing answers for many minutes (20 tries of about 40 s in
    Ray 2.60) before it fails with a RuntimeError: a mistyped port would look like a hung run.
    """
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS") or "auto"
    if address in ("auto", "local") or address.startswith("ray://"):
        return
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"ray.address {address!r}: not a Ray address; use 'auto', 'local', HOST:PORT "
                          f"(the head's GCS port, 6379 unless `ray start --head --port` said otherwise) or "
                          f"ray://HOST:10001")
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ConfigError(f"ray.address {address!r}: nothing answers at {host}:{port} ({exc}); is the cluster up "
                          f"(`ray status` on its head) and is {port} the port `ray start --head` was given? "
                          f"{_START_HINT[0].upper()}{_START_HINT[1:]}") from None


def cluster_gpus(cfg) -> int:
    """GPUs in the Ray cluster of ``cfg`` (connects first)."""
    ray = connect(cfg)
    return int(ray.cluster_resources().get("GPU", 0))


def placement(spec, cfg, *, gpu_cluster: bool) -> tuple[dict[str, Any], list[dict[str, float]] | None]:
    """(actor options without scheduling_strategy, placement-group bundles or None) for one engine.

    One GPU per tensor-parallel rank by default. With ``tensor_parallel_size > 1`` on GPUs,
    bundle 0 holds the actor (CPUs, custom resources) and a GPU, the others one GPU each;
    vLLM's Ray executor places its workers in those bundles (it accepts at most one GPU per
    bundle). The same shape OpenRLHF uses for its vLLM actors.
    """
    gpus = cfg.num_gpus if cfg.num_gpus is not None else (1.0 if gpu_cluster else 0.0)
    tp = spec.tensor_parallel_size
    options: dict[str, Any] = {"num_cpus": cfg.num_cpus, "resources": dict(cfg.resources)}
    if tp > 1 and gpus > 0:
        if gpus > 1:
            raise ConfigError(f"engine {spec.name!r}: ray.num_gpus is {gpus:g} per tensor-parallel rank; vLLM's Ray "
                              f"executor takes at most 1 GPU per rank")
        first = {"CPU": cfg.num_cpus, "GPU": gpus, **cfg.resources}
        bundles = [{k: v for k, v in first.items() if v}] + [{"GPU": gpus} for _ in range(tp - 1)]
        options["num_gpus"] = 0
        return options, bundles
    options["num_gpus"] = gpus * tp
    return options, None


def engine_args_for(spec, *, tp_placement_group: bool):
    """``spec`` with the vLLM arguments a Ray-hosted engine needs (user's engine_args win)."""
    if not tp_placement_group:
        return spec
    args = {"distributed_executor_backend": "ray", **spec.engine_args}
    return spec.model_copy(update={"engine_args": args})


def merge_ray_config(run, engine):
    """The engine's Ray settings: the run's ``ray`` section overridden by the keys the engine sets."""
    from pdsr_sdk.engines.config import RayConfig

    if engine is None:
        return run
    if run is None:
        return engine
    base, own = run.model_dump(exclude_unset=True), engine.model_dump(exclude_unset=True)
    for key in ("env_vars", "resources"):   # mappings add up (the engine's values win)
        if key in base and key in own:
            own[key] = {**base[key], **own[key]}
    return RayConfig.model_validate({**base, **own})


def wait_ref(ref) -> asyncio.Future:
    """An asyncio future for a Ray ObjectRef (works for Ray Client refs too).

    Cancelling it (close() stopping the poll, a timeout) leaves Ray's own future alone, unlike
    ``asyncio.wrap_future``: Ray Client sets the answer on that future when it comes, and on a cancelled one
    that raises InvalidStateError in its streaming thread (two tracebacks on the terminal at every close
    over ``ray://``, Ray 2.60). An answer after this loop closed is dropped.
    """
    loop = asyncio.get_running_loop()
    out = loop.create_future()

    def answered(source) -> None:   # in Ray's thread
        with contextlib.suppress(RuntimeError):   # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(_settle, out, source)

    ref.future().add_done_callback(answered)
    return out


def _settle(out: asyncio.Future, source) -> None:
    if out.done():   # cancelled here
        return
    if source.cancelled():
        out.cancel()
    elif source.exception() is not None:
        out.set_exception(source.exception())
    else:
        out.set_result(source.result())
