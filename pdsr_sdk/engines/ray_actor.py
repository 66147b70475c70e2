"""The Ray side of a Ray engine: an async actor hosting a :class:`VllmEngine`.

The actor runs vLLM's ``AsyncLLM`` in its own event loop (through the local
engine class, so streaming, abort, load stats and engine-core error capture
behave exactly as on one machine) and keeps what the engine reports until the
orchestrator polls for it:

- ``commands(cmds)`` applies :class:`Submit` and :class:`Abort` messages in the order they were issued;
- ``poll(max_wait_s)`` waits until something happened, then returns a :class:`PollResult`: every
  request's new tokens since the last poll, the requests that ended, the engine's death (if it
  died) and a load snapshot;
- ``update_weights(message, buffer)`` loads new weights (:class:`UpdateWeights`; the tensors' bytes
  come from Ray's object store as ``buffer``);
- ``control(message)`` pauses, resumes, sleeps or wakes the engine (:class:`Control`); the next poll
  answers at once, so the orchestrator gets everything the engine sent before the call returned.

Every message is one of the small frozen dataclasses below (plain data; the Sample objects stay
behind on the orchestrator). Ray imports this module by name in the actor's worker process, so it
must not import ray, torch or vllm at the top.
"""

from __future__ import annotations

import asyncio
import os
import socket
import traceback
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WireSampling:
    """The sampling settings a request carries across the wire (what VllmEngine reads)."""

    temperature: float
    top_p: float
    top_k: int
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...] = ()
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0


@dataclass(frozen=True)
class Submit:
    """Orchestrator -> actor: run one segment request."""

    request_id: str
    context_ids: list[int]
    context_len: int
    max_tokens: int
    ignore_eos: bool
    sampling: WireSampling
    cache_salt: str | None = None
    #: speculative ``group``: the request's draft corpus (``group_drafter.group_extra_args``), made here in the
    #: orchestrator, where the sample's group is
    draft_args: dict[str, Any] | None = None
    continued_tokens: int = 0

    @classmethod
    def of(cls, request, draft_args: dict[str, Any] | None = None) -> "Submit":
        s = request.sampling
        return cls(request.request_id, list(request.context_ids), request.context_len, request.max_tokens,
                   request.ignore_eos, WireSampling(s.temperature, s.top_p, s.top_k, tuple(s.stop),
                                                    tuple(s.stop_token_ids), s.min_p,
                                                       s.presence_penalty, s.frequency_penalty, s.repetition_penalty),
                   request.cache_salt, draft_args, request.continued_tokens)

    def request(self):
        from pdsr_sdk.dispatch.types import SegmentRequest

        return SegmentRequest(request_id=self.request_id, context_ids=self.context_ids, context_len=self.context_len,
                              max_tokens=self.max_tokens, ignore_eos=self.ignore_eos, sampling=self.sampling,
                              sample=None, cache_salt=self.cache_salt, continued_tokens=self.continued_tokens)


@dataclass(frozen=True)
class Abort:
    """Orchestrator -> actor: stop a request (its segment then ends with 'abort')."""

    request_id: str


@dataclass(frozen=True)
class TokenDelta:
    """Actor -> orchestrator: a request's new tokens (and their log-probs) since the last poll."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float] | None


@dataclass(frozen=True)
class SegmentEnd:
    """Actor -> orchestrator: a request's segment ended."""

    request_id: str
    finish_reason: str
    speculation: tuple[int, int] | None = None   # (drafted, accepted) tokens, from an engine that counts them
    error: str | None = None   # the engine refused the request (a bad prompt): why; its sample fails
    stop_reason: str | int | None = None   # the stop string or stop token id that ended it


@dataclass(frozen=True)
class ErrorInfo:
    """An engine error as plain data (EngineError's constructor does not survive pickling)."""

    message: str
    exit_status: int | None = None
    remote_traceback: str | None = None

    def error(self, engine: str, where: str = ""):
        from pdsr_sdk.errors import EngineError

        return EngineError(engine, self.message + where, exit_status=self.exit_status,
                           remote_traceback=self.remote_traceback)


@dataclass(frozen=True)
class LoadSnapshot:
    running: int
    waiting: int
    kv_cache_usage: float | None


@dataclass(frozen=True)
class PollResult:
    """Actor -> orchestrator: everything since the previous poll."""

    tokens: list[TokenDelta]
    ends: list[SegmentEnd]
    dead: ErrorInfo | None
    load: LoadSnapshot
    #: this poll's number (1, 2, ...): see :class:`ControlResult`
    seq: int = 0


@dataclass(frozen=True)
class UpdateWeights:
    """Orchestrator -> actor: load new weights. Either ``entries`` (a table of
    :class:`~pdsr_sdk.engines.weights_shm.WeightEntry` into the packed bytes passed beside this message,
    from Ray's object store) or ``folder`` (a model folder the actor's node can read)."""

    entries: tuple | None = None
    folder: str | None = None
    #: reset the engine's prefix cache after loading (False: ``kv_on_update: keep``)
    reset_prefix_cache: bool = True
    #: one bucket of an update sent in several: (index, last), else None
    bucket: tuple | None = None
    #: no weights: finish a bucketed update that stopped part-way (the engine's ``end_weights``)
    end: bool = False


#: the engine methods :class:`Control` may call
CONTROL_METHODS = ("pause_generation", "resume_generation", "reset_prefix_cache", "sleep", "wake_up")


@dataclass(frozen=True)
class Control:
    """Orchestrator -> actor: call one of :data:`CONTROL_METHODS` on the engine with ``kwargs``
    (``(name, value)`` pairs)."""

    method: str
    kwargs: tuple = ()


@dataclass(frozen=True)
class ControlResult:
    """Actor -> orchestrator: the call's error (None if it worked), and how many polls the actor had
    answered when it returned: a poll numbered higher carries everything the engine reported before."""

    error: ErrorInfo | None
    polls: int


def error_info(exc: BaseException) -> ErrorInfo:
    """An exception as an :class:`ErrorInfo`."""
    from pdsr_sdk.errors import EngineError

    if isinstance(exc, EngineError):
        text = str(exc).split("\n--- engine traceback ---\n")[0]
        prefix = f"engine {exc.engine!r}: "
        message = text[len(prefix):] if text.startswith(prefix) else text
        if exc.exit_status is not None:
            message = message.removesuffix(f" (exit status {exc.exit_status})")
        return ErrorInfo(message, exc.exit_status, exc.remote_traceback)
    return ErrorInfo(f"{type(exc).__name__}: {exc}", None, "".join(traceback.format_exception(exc)).strip())


def missing_model(model: str) -> str | None:
    """Why this node cannot load ``model``, a folder path, or None. vLLM would take a path it cannot find for
    a hub repository id and fail with a message about repository names."""
    if not os.path.isabs(model) or os.path.isfile(os.path.join(model, "config.json")):
        return None
    what = "is not a model folder (no config.json)" if os.path.isdir(model) else "does not exist"
    return (f"the model folder {model} {what} on this node; every node needs the model at the same path "
            f"(a shared filesystem, or a copy on each node: docs/ray.md, 'Model weights')")


class EngineActor:
    """Wrapped with ``ray.remote`` by :class:`pdsr_sdk.engines.ray_engine.RayEngine`; one per engine."""

    def __init__(self, spec, model: str, tokenizer: str | None, seed: int, logprobs_mode: str,
                 speculative: dict[str, Any] | None = None):
        from pdsr_sdk.engines.vllm_env import apply_cpu_defaults, is_cpu_build

        self.cpu = is_cpu_build()
        if self.cpu:
            apply_cpu_defaults()   # before anything in this process imports vllm
        elif spec.devices:
            spec = spec.model_copy(update={"devices": []})   # Ray set CUDA_VISIBLE_DEVICES for this actor
        from pdsr_sdk.engines.vllm_engine import VllmEngine

        self.engine = VllmEngine(spec, model=model, tokenizer=tokenizer, seed=seed, logprobs_mode=logprobs_mode,
                                 cpu=self.cpu, speculative=speculative)
        self.engine.bind(self)
        # request id -> (token ids, logprobs) generated since the last poll, in order of first arrival
        self._tokens: dict[str, tuple[list[int], list[float]]] = {}
        self._ends: list[SegmentEnd] = []
        self._dead: ErrorInfo | None = None
        self._dead_sent = False
        self._wakeup: asyncio.Event | None = None
        self._polls = 0             # polls answered
        self._answer_now = False    # a control call returned: the next poll answers without waiting

    # ------------------------------------------------------------ called via Ray
    async def node_info(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname(),
                "pid": os.getpid(), "actor_id": ctx.get_actor_id(), "cpu_build": self.cpu,
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    async def start(self) -> ErrorInfo | None:
        """Load the model; returns None, or the error as plain data."""
        self._wakeup = asyncio.Event()
        missing = missing_model(self.engine.model)
        if missing is not None:
            return ErrorInfo(missing)
        try:
            await self.engine.start()
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator as data
            return error_info(exc)
        return None

    async def commands(self, cmds: list[Submit | Abort]) -> None:
        """Apply :class:`Submit` / :class:`Abort` messages in order; never raises."""
        for cmd in cmds:
            try:
                if isinstance(cmd, Submit):
                    if cmd.draft_args is not None:
                        self.engine.carried_draft_args[cmd.request_id] = cmd.draft_args
                    self.engine.submit(cmd.request())
                elif isinstance(cmd, Abort):
                    self.engine.abort(cmd.request_id)
                else:
                    raise ValueError(f"unknown command {cmd!r}")
            except Exception as exc:  # noqa: BLE001 - the engine can no longer serve
                self.on_engine_dead(self.engine, exc)

    async def poll(self, max_wait_s: float) -> PollResult:
        """Wait up to ``max_wait_s`` for news, then hand over everything queued since the last poll."""
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        if not self._has_news() and not self._answer_now:
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), max_wait_s)
            except asyncio.TimeoutError:
                pass
        self._answer_now = False
        self._polls += 1
        tokens = [TokenDelta(rid, ids, lps or None) for rid, (ids, lps) in self._tokens.items()]
        ends, self._tokens, self._ends = self._ends, {}, []
        dead = None
        if self._dead is not None and not self._dead_sent:
            dead, self._dead_sent = self._dead, True
        load = self.engine.load()
        return PollResult(tokens, ends, dead, LoadSnapshot(load.running, load.waiting, load.kv_cache_usage),
                          self._polls)

    async def update_weights(self, message: UpdateWeights, buffer: Any = None) -> ErrorInfo | None:
        """Load new weights: ``buffer`` (the packed bytes, resolved by Ray from the object store) is
        copied into a shared block of this node that the engine process maps. Returns None, or the
        error as data."""
        from pathlib import Path

        from pdsr_sdk.engines.weights import FolderWeights, WeightsBucket
        from pdsr_sdk.engines.weights_shm import write_buffer

        block = None
        try:
            if message.end:
                await self.engine.end_weights()
                return None
            if message.folder is not None:
                source = FolderWeights(message.folder)
            else:
                source = block = write_buffer(buffer, message.entries)
            bucket = WeightsBucket(*message.bucket) if message.bucket is not None else None
            await self.engine.update_weights(source, reset_prefix_cache=message.reset_prefix_cache, bucket=bucket)
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator as data
            return error_info(exc)
        finally:
            if block is not None:
                Path(block.path).unlink(missing_ok=True)
        return None

    async def control(self, message: Control) -> ControlResult:
        """Pause, resume, sleep or wake the engine; never raises (the error comes back as data)."""
        error = None
        try:
            if message.method not in CONTROL_METHODS:
                raise ValueError(f"unknown control method {message.method!r}")
            await getattr(self.engine, message.method)(**dict(message.kwargs))
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator as data
            error = error_info(exc)
        self._answer_now = True
        self._wake()
        return ControlResult(error, self._polls)

    async def close(self) -> None:
        await self.engine.close()

    # ------------------------------------------------- EngineListener (inside)
    def on_tokens(self, engine, request_id: str, n: int, token_ids, logprobs, **_) -> None:
        ids, lps = self._tokens.setdefault(request_id, ([], []))
        ids.extend(token_ids)
        if logprobs is not None:
            lps.extend(logprobs)
        self._wake()

    def on_segment_end(self, engine, request_id: str, finish_reason: str, *,
                       speculation: tuple[int, int] | None = None, stop_reason: str | int | None = None) -> None:
        self._ends.append(SegmentEnd(request_id, finish_reason, speculation, stop_reason=stop_reason))
        self._wake()

    def on_request_failed(self, engine, request_id: str, error: str) -> None:
        self._ends.append(SegmentEnd(request_id, "failed", None, error))
        self._wake()

    def on_engine_dead(self, engine, error: BaseException) -> None:
        if self._dead is None:
            self._dead = error_info(error)
        self._wake()

    def _has_news(self) -> bool:
        return bool(self._tokens or self._ends or (self._dead is not None and not self._dead_sent))

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
