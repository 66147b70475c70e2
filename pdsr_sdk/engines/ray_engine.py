"""The ``ray`` engine backend: a vLLM engine in a Ray actor, driven from the orchestrator.

The actor (:class:`pdsr_sdk.engines.ray_actor.EngineActor`) hosts a
:class:`~pdsr_sdk.engines.vllm_engine.VllmEngine`; this class implements the
same :class:`~pdsr_sdk.dispatch.protocols.Engine` protocol on the
orchestrator's event loop, so every policy runs unchanged and pools can mix
local and Ray engines.

Transport. Submits and aborts issued in one loop tick go to the actor as one
ordered ``commands`` call. Tokens come back through a long poll: one
``poll`` call at a time is outstanding; it returns as soon as anything
happened, with every request's new tokens since the previous poll (a busy
engine so delivers a step's worth of deltas per round trip). Ray's streaming
actor methods (``num_returns="streaming"``) would also do, but Ray Client
(``ray://`` addresses) rejects them (Ray 2.60, ``util/client/worker.py``); a
plain call works with every address.

Failure. The outstanding poll fails as soon as the actor dies (``ray.kill``,
a crashed worker, a lost node); the engine then reports an
:class:`~pdsr_sdk.errors.EngineError` naming the node (IP, node id) and Ray's
error to ``listener.on_engine_dead``, and the scheduler re-queues its
requests on the pool's live engines. An engine-core crash inside a live actor
is reported the same way with the core's own traceback.

Placement (:mod:`pdsr_sdk.engines.ray_cluster`). One GPU per tensor-parallel
rank (``num_gpus``), ``num_cpus`` and custom ``resources`` per engine. A
tensor-parallel engine on GPUs gets a placement group of one bundle per GPU
(``placement_strategy``, STRICT_PACK by default) that vLLM's Ray executor
fills with its workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from typing import Any

from pdsr_sdk.dispatch.types import EngineLoad, SegmentRequest
from pdsr_sdk.engines.model_engine import CPU_CANNOT_SLEEP, ModelEngine
from pdsr_sdk.engines.ray_cluster import connect, engine_args_for, merge_ray_config, placement, wait_ref
from pdsr_sdk.errors import EngineError, UnsupportedError

#: how long one poll may wait in the actor before returning an empty batch (keeps load() fresh)
POLL_WAIT_S = 2.0
#: how long close() waits for the actor to shut its engine down before killing it
CLOSE_TIMEOUT_S = 30.0


class RayEngine(ModelEngine):
    """The ``ray`` engine backend (see the module docstring)."""

    def __init__(self, spec, *, model: str, tokenizer: str | None = None, seed: int = 0,
                 logprobs_mode: str = "processed_logprobs", ray=None, speculative: dict[str, Any] | None = None):
        from pdsr_sdk.engines.config import RayConfig

        super().__init__(spec, model=model, tokenizer=tokenizer, seed=seed, logprobs_mode=logprobs_mode,
                         speculative=speculative)
        self.ray_config = merge_ray_config(ray, spec.ray) or RayConfig()
        # the actor's working directory is its node's (where `ray start` ran), not this process's
        self.model = _absolute_if_here(self.model)
        self.tokenizer = _absolute_if_here(self.tokenizer)
        #: where the actor runs (node_id, ip, hostname, pid, actor_id, ...) once started
        self.node: dict[str, Any] | None = None
        self._actor = None
        self._pg = None
        self._outbox: list = []   # Submit / Abort messages issued in this loop tick
        self._flush_scheduled = False
        self._poller: asyncio.Task | None = None
        self._load = EngineLoad()
        self._polls_seen = 0      # number of the last poll handled

    @classmethod
    def from_spec(cls, spec, *, model: str, tokenizer: str | None = None, seed: int = 0,
                  logprobs_mode: str = "processed_logprobs", ray=None, speculative: dict[str, Any] | None = None,
                  **_: object) -> "RayEngine":
        from pdsr_sdk.engines.vllm_args import check_engine_args

        check_engine_args(spec)   # here, not in the actor: before any of the run's engines starts
        return cls(spec, model=model, tokenizer=tokenizer, seed=seed, logprobs_mode=logprobs_mode, ray=ray,
                   speculative=speculative)

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._actor is not None:
            return
        from pdsr_sdk.engines.ray_actor import EngineActor

        cfg = self.ray_config
        ray = connect(cfg)   # a ConfigError naming the extra when Ray is missing
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        gpu_cluster = ray.cluster_resources().get("GPU", 0) > 0
        options, bundles = placement(self.spec, cfg, gpu_cluster=gpu_cluster)
        spec = engine_args_for(self.spec, tp_placement_group=bundles is not None)
        if bundles is not None:
            from ray.util.placement_group import placement_group

            self._pg = placement_group(bundles, strategy=cfg.placement_strategy,
                                       name=f"pdsr-{self.name}-{uuid.uuid4().hex[:8]}")
            try:
                await asyncio.wait_for(wait_ref(self._pg.ready()), cfg.placement_timeout_s)
            except asyncio.TimeoutError:
                msg = self._unplaced(f"placement group {bundles} (strategy {cfg.placement_strategy})")
                await self.close()
                raise EngineError(self.name, msg) from None
            strategy = PlacementGroupSchedulingStrategy(placement_group=self._pg, placement_group_bundle_index=0,
                                                        placement_group_capture_child_tasks=True)
        else:
            strategy = cfg.scheduling_strategy
        env = dict(cfg.env_vars)
        actor_cls = _remote_class(ray, EngineActor)
        self._actor = actor_cls.options(
            **options, scheduling_strategy=strategy, max_restarts=0, max_task_retries=0,
            # per actor, not only at ray.init: a trainer's own connection (which pdsr then uses) keeps the key too
            name=f"pdsr-{self.name}-{uuid.uuid4().hex[:8]}", namespace=cfg.namespace,
            runtime_env={"env_vars": env} if env else None,
        ).remote(spec, self.model, self.tokenizer, self.seed, self.logprobs_mode, self.speculative)
        try:
            self.node = await asyncio.wait_for(wait_ref(self._actor.node_info.remote()), cfg.placement_timeout_s)
        except asyncio.TimeoutError:
            need = {"CPU": options["num_cpus"], "GPU": options["num_gpus"], **options["resources"]}
            msg = self._unplaced(f"an actor needing {_describe(need)}")
            await self.close()
            raise EngineError(self.name, msg) from None
        except Exception as exc:  # noqa: BLE001 - the actor died while being created
            await self.close()
            raise self._gone(exc, "failed to start") from None
        try:
            err = await wait_ref(self._actor.start.remote())
        except Exception as exc:  # noqa: BLE001 - the actor process died while loading
            await self.close()
            raise self._gone(exc, "failed to start") from None
        if err is not None:
            await self.close()
            raise EngineError(self.name, f"failed to start on {self.where()}: {err.message}",
                              exit_status=err.exit_status, remote_traceback=err.remote_traceback)
        self._poller = asyncio.get_running_loop().create_task(self._poll_loop(), name=f"poll-{self.name}")

    async def close(self) -> None:
        self._closing = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(BaseException):
                await self._poller
            self._poller = None
        actor, self._actor = self._actor, None
        if actor is not None:
            import ray

            if not self._dead and self.node is not None:   # a live actor shuts its engine down cleanly
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(wait_ref(actor.close.remote()), CLOSE_TIMEOUT_S)
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        pg, self._pg = self._pg, None
        if pg is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(pg)

    # ------------------------------------------------------------- requests
    def submit(self, request: SegmentRequest) -> None:
        from pdsr_sdk.engines.ray_actor import Submit

        if self._dead or self._actor is None:
            raise EngineError(self.name, f"engine is not running (Ray actor on {self.where()})")
        from pdsr_sdk.engines import group_drafter

        draft_args = None
        if group_drafter.is_group(self.speculative):   # the sample stays here: its corpus goes with the request
            draft_args = group_drafter.group_extra_args(request, self.speculative["prompt_lookup_min"],
                                                        self.speculative["prompt_lookup_max"])
        self._send(Submit.of(request, draft_args))

    def abort(self, request_id: str) -> None:
        from pdsr_sdk.engines.ray_actor import Abort

        if not self._dead and self._actor is not None:
            self._send(Abort(request_id))

    def load(self) -> EngineLoad:
        return self._load

    async def update_weights(self, weights, *, reset_prefix_cache: bool = True) -> None:
        """Load new weights (a :class:`~pdsr_sdk.engines.weights.StagedWeights`) in the actor's engine:
        the packed tensors go through Ray's object store (put once per update, shared by every actor),
        a model folder by its path; then its prefix cache is reset unless ``reset_prefix_cache`` is false.
        Raises an EngineError naming this engine and its node."""
        from pdsr_sdk.engines.ray_actor import UpdateWeights

        if self._dead or self._actor is None:
            raise EngineError(self.name, f"update_weights: the engine is not running (Ray actor on {self.where()})")
        import ray

        if weights.is_folder:
            call = self._actor.update_weights.remote(UpdateWeights(folder=weights.folder,
                                                                   reset_prefix_cache=reset_prefix_cache))
        else:
            block = weights.shared()
            bucket = weights.bucket
            call = self._actor.update_weights.remote(UpdateWeights(entries=block.entries,
                                                                   reset_prefix_cache=reset_prefix_cache,
                                                                   bucket=None if bucket is None else
                                                                   (bucket.index, bucket.last)),
                                                     weights.ray_ref(ray))
        await self._weights_call(call)

    async def end_weights(self) -> None:
        """Finish a bucketed update that stopped part-way in the actor's engine (see
        :meth:`VllmEngine.end_weights <pdsr_sdk.engines.vllm_engine.VllmEngine.end_weights>`)."""
        from pdsr_sdk.engines.ray_actor import UpdateWeights

        if self._dead or self._actor is None:
            raise EngineError(self.name, f"end_weights: the engine is not running (Ray actor on {self.where()})")
        await self._weights_call(self._actor.update_weights.remote(UpdateWeights(end=True)))

    async def _weights_call(self, call) -> None:
        try:
            err = await wait_ref(call)
        except Exception as exc:  # noqa: BLE001 - the actor died
            raise self._gone(exc, "lost during update_weights") from None
        if err is not None:
            raise err.error(self.name, f" (in its Ray actor on {self.where()})")

    # ------------------------------------------------------- pause and sleep
    async def pause_generation(self, mode: str = "keep", *, clear_cache: bool = True) -> None:
        """The actor's engine freezes (``keep``), drains or aborts its requests until :meth:`resume_generation`
        (see :meth:`VllmEngine.pause_generation <pdsr_sdk.engines.vllm_engine.VllmEngine.pause_generation>`).
        Returns once every token the engine sent before pausing has reached the listener."""
        await self._control("pause_generation", mode=mode, clear_cache=clear_cache)

    async def reset_prefix_cache(self) -> None:
        """Forget the actor's engine's cached KV blocks (see :meth:`VllmEngine.reset_prefix_cache
        <pdsr_sdk.engines.vllm_engine.VllmEngine.reset_prefix_cache>`)."""
        await self._control("reset_prefix_cache")

    async def resume_generation(self) -> None:
        if not self._dead and self._actor is not None:
            await self._control("resume_generation")

    def sleep_unsupported(self) -> str | None:
        """Why :meth:`sleep` cannot free this engine's memory, or None if the actor's engine may (a GPU
        engine started without sleep mode says so when asked)."""
        if self._dead or self._actor is None or not self.node:
            return "the engine is not running"
        if self.node.get("cpu_build"):
            return CPU_CANNOT_SLEEP
        return None

    async def sleep(self, level: int = 1) -> None:
        reason = self.sleep_unsupported()
        if reason is not None:
            raise UnsupportedError(f"engine {self.name!r} cannot sleep: {reason}")
        await self._control("sleep", level=level)

    async def wake_up(self) -> None:
        await self._control("wake_up")

    async def _control(self, method: str, **kwargs: Any) -> None:
        from pdsr_sdk.engines.ray_actor import Control

        if self._dead or self._actor is None:
            raise EngineError(self.name, f"{method}: the engine is not running (Ray actor on {self.where()})")
        try:
            result = await wait_ref(self._actor.control.remote(Control(method, tuple(kwargs.items()))))
        except Exception as exc:  # noqa: BLE001 - the actor died
            raise self._gone(exc, f"lost during {method}") from None
        if result.error is not None:
            raise result.error.error(self.name, f" (in its Ray actor on {self.where()})")
        # what the engine reported before the call returned comes with the next poll (answered at once)
        loop = asyncio.get_running_loop()
        end = loop.time() + 2 * POLL_WAIT_S + 10.0
        while self._polls_seen <= result.polls and not self._dead and self._actor is not None:
            if loop.time() > end:
                raise EngineError(self.name, f"{method}: no poll answered by the Ray actor on {self.where()}")
            await asyncio.sleep(0.005)

    @property
    def dead(self) -> bool:
        """Whether the engine died (its actor lost or failed): it takes no more requests."""
        return self._dead

    def where(self) -> str:
        """Where the actor runs, for messages: ``node IP (node id ..., pid ...)``."""
        n = self.node
        if not n:
            return "an unknown node (the actor never reported in)"
        return f"node {n['ip']} (node id {n['node_id']}, host {n['hostname']}, pid {n['pid']})"

    def _send(self, cmd) -> None:
        # everything issued in one loop tick goes as one ordered call
        self._outbox.append(cmd)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        cmds, self._outbox = self._outbox, []
        if not cmds or self._dead or self._actor is None:
            return
        fut = wait_ref(self._actor.commands.remote(cmds))
        fut.add_done_callback(self._commands_done)

    def _commands_done(self, fut: asyncio.Future) -> None:
        if fut.cancelled() or fut.exception() is None or self._closing:
            return
        # a dead actor is reported by the poll loop (with the same error); anything else ends the engine too
        self._die(self._gone(fut.exception(), "lost"))

    # --------------------------------------------------------------- events
    async def _poll_loop(self) -> None:
        while not self._dead and self._actor is not None:
            try:
                news = await wait_ref(self._actor.poll.remote(POLL_WAIT_S))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - RayActorError and friends: the actor is gone
                if not self._closing:
                    self._die(self._gone(exc, "lost"))
                return
            if self._closing:
                return
            load = news.load
            self._load = EngineLoad(load.running, load.waiting, load.kv_cache_usage)
            listener = self._listener
            for delta in news.tokens:
                listener.on_tokens(self, delta.request_id, len(delta.token_ids), delta.token_ids, delta.logprobs)
            for end in news.ends:
                if end.error is not None:
                    # the engine refused the request: its sample fails (a listener that cannot hear that: the engine)
                    refused = getattr(listener, "on_request_failed", None)
                    if refused is not None:
                        refused(self, end.request_id, end.error)
                    else:
                        self._die(EngineError(self.name, f"request {end.request_id} failed: {end.error}"))
                else:   # only what there is, as the local engine passes it
                    extra = {k: v for k, v in (("speculation", end.speculation), ("stop_reason", end.stop_reason))
                             if v is not None}
                    listener.on_segment_end(self, end.request_id, end.finish_reason, **extra)
            if news.dead is not None:
                self._die(news.dead.error(self.name, f" (in its Ray actor on {self.where()})"))
            self._polls_seen = news.seq

    def _die(self, error: EngineError) -> None:
        if self._dead:
            return
        self._dead = True
        self._outbox.clear()
        if self._listener is not None:
            self._listener.on_engine_dead(self, error)

    def _gone(self, exc: BaseException, what: str) -> EngineError:
        """An EngineError for an actor that died: its node and Ray's own account of why."""
        detail = " ".join(str(exc).split())
        return EngineError(self.name, f"Ray actor {what} on {self.where()}: {type(exc).__name__}: {detail}")

    def _unplaced(self, what: str) -> str:
        import ray

        cfg = self.ray_config
        total = _describe(ray.cluster_resources())
        free = _describe(ray.available_resources())
        return (f"Ray could not place {what} within {cfg.placement_timeout_s:g} s "
                f"(ray.placement_timeout_s); the cluster has {total} in total, {free} free. "
                f"Add nodes, or lower ray.num_cpus / ray.num_gpus / ray.resources")


def _absolute_if_here(path: str | None) -> str | None:
    """``path`` made absolute if it is a relative path that exists here; anything else (a hub id) as given."""
    if path and not os.path.isabs(path) and os.path.exists(path):
        return os.path.abspath(path)
    return path


_REMOTE: dict[type, Any] = {}


def _remote_class(ray, cls):
    if cls not in _REMOTE:
        _REMOTE[cls] = ray.remote(cls)
    return _REMOTE[cls]


def _describe(resources: dict) -> str:
    shown = {k: v for k, v in sorted(resources.items())
             if v and not k.startswith(("node:", "memory", "object_store_memory", "accelerator_type"))}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in shown.items()) + "}"
