"""A vLLM engine (``AsyncLLM``) serving one pool, in its own engine-core process.

``AsyncLLM`` runs the model in a spawned engine-core process; this class
lives in the orchestrator's event loop, streams each request's new tokens
(``RequestOutputKind.DELTA``) to the scheduler, and aborts on request. The
core process is pinned at spawn: ``CUDA_VISIBLE_DEVICES`` on GPUs,
``VLLM_CPU_OMP_THREADS_BIND`` on the CPU build. If the core dies, the error
the core logged (captured by pdsr's vLLM plugin into a per-engine file) and
its exit status reach the caller as an :class:`~pdsr_sdk.errors.EngineError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

from pdsr_sdk.dispatch.types import ABORT, STOP, EngineLoad, SegmentRequest
from pdsr_sdk.engines import group_drafter
from pdsr_sdk.engines.model_engine import ModelEngine
from pdsr_sdk.engines.request_observer import RequestObserver
from pdsr_sdk.engines.stop_window import HeldTokens, window_tokens
from pdsr_sdk.engines.vllm_control import VllmControl
from pdsr_sdk.engines.vllm_sampling import sampling_args
from pdsr_sdk.engines.vllm_spawn import spawn, unguarded_script_hint
from pdsr_sdk.engines.vllm_stats import LoadRecorder, finish_reason, no_prometheus, refused, speculation_counts
from pdsr_sdk.errors import EngineError

#: read by pdsr's vLLM plugin inside the engine-core process (see vllm_plugin.py)
ERROR_FILE_ENV = "PDSR_ENGINE_ERROR_FILE"
ENGINE_NAME_ENV = "PDSR_ENGINE_NAME"
#: mixed into vLLM's worker class in the engine process: pdsr's collective_rpc methods
WORKER_EXTENSION = "pdsr_sdk.engines.vllm_worker.PdsrWorkerExtension"


class VllmEngine(VllmControl, ModelEngine):
    """The ``vllm`` engine backend (its control calls: :class:`~pdsr_sdk.engines.vllm_control.VllmControl`)."""

    def __init__(self, spec, *, model: str, tokenizer: str | None = None, seed: int = 0,
                 logprobs_mode: str = "processed_logprobs", cpu: bool | None = None,
                 speculative: dict[str, Any] | None = None):
        super().__init__(spec, model=model, tokenizer=tokenizer, seed=seed, logprobs_mode=logprobs_mode,
                         speculative=speculative)
        self.cpu = cpu
        self.shutdown_timeout_s = 2.0
        self._llm = None
        self._gpu_uuid: str | None = None        # the engine's GPU (see device_uuid) ...
        self._gpu_asked = False                  # ... once asked
        self._tasks: dict[str, asyncio.Task] = {}
        self._abort_asked: set[str] = set()      # see abort: a request's stream ends itself at its next output
        self._stats = LoadRecorder()
        #: speculative ``group``: draft corpora made where the sample is (a Ray engine's orchestrator), by request
        #: id, for requests that arrive without their sample (the Ray actor's)
        self.carried_draft_args: dict[str, dict[str, Any]] = {}
        #: set to watch every request from then on (a :class:`~pdsr_sdk.engines.request_observer.RequestObserver`: a
        #: benchmark's recorder, a test's ``PromptLog``)
        self.observer: RequestObserver | None = None
        self._error_file = Path(tempfile.mkstemp(prefix=f"pdsr-engine-{_safe(self.name)}-", suffix=".log")[1])

    @classmethod
    def from_spec(cls, spec, *, model: str, tokenizer: str | None = None, seed: int = 0,
                  logprobs_mode: str = "processed_logprobs", speculative: dict[str, Any] | None = None,
                  **_: object) -> "VllmEngine":
        from pdsr_sdk.engines.vllm_args import check_engine_args

        check_engine_args(spec)   # at build: before any of the run's engines starts
        return cls(spec, model=model, tokenizer=tokenizer, seed=seed, logprobs_mode=logprobs_mode,
                   speculative=speculative)

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._llm is not None:
            return
        from pdsr_sdk.engines.vllm_env import (FORK_WORKER_ENV, apply_cpu_defaults, apply_engine_defaults,
                                               engine_process_env, is_cpu_build, worker_omp_env)

        cpu = is_cpu_build() if self.cpu is None else self.cpu
        self.cpu = cpu
        apply_engine_defaults()
        from pdsr_sdk.parent_watch import ORCHESTRATOR_PID_ENV

        args = self._engine_args(cpu)
        # the engine processes end when this process dies (see parent_watch.py)
        env = {ERROR_FILE_ENV: str(self._error_file), ENGINE_NAME_ENV: self.name,
               ORCHESTRATOR_PID_ENV: str(os.getpid()), **engine_process_env()}
        if cpu:
            apply_cpu_defaults()
            env["VLLM_CPU_KVCACHE_SPACE"] = _fmt(self.spec.kv_cache_gib
                                                 or float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", 1)))
            if self.spec.devices:
                env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(d) for d in self.spec.devices)
            if self._forks_worker(args):
                env.update(worker_omp_env(self.spec.devices))
                env[FORK_WORKER_ENV] = "1"
            if args.get("enforce_eager") and "TORCHDYNAMO_DISABLE" not in os.environ:
                # eager engine, yet vLLM's sampler compiles a helper with inductor (the rank of each sampled
                # token's log-prob) on the first step: 4-5 s with inductor's cache warm, 16-22 s cold
                # (a fresh machine); eager it costs nothing measurable (docs/notes/cpu.md)
                env["TORCHDYNAMO_DISABLE"] = "1"
        elif self.spec.devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in self.spec.devices)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        if cpu:
            from pdsr_sdk.engines.vllm_env import inspect_models_in_process

            inspect_models_in_process()   # not in a second interpreter (11 s on a machine's first run)

        def create():
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**args),
                                             stat_loggers=[self._stats.factory, no_prometheus()])

        try:
            self._llm = await spawn(create, env)
        except Exception as exc:  # noqa: BLE001 - vLLM raises many types at start-up
            raise EngineError(self.name, f"failed to start: {type(exc).__name__}: {exc}{unguarded_script_hint()}",
                              remote_traceback=self._read_error()) from exc
        cache = self._llm.vllm_config.cache_config
        if cache.num_gpu_blocks and cache.block_size:   # sized by the engine core at start-up
            self.kv_cache_tokens = int(cache.num_gpu_blocks) * int(cache.block_size)
        if group_drafter.is_group(self.speculative):
            await self._attach_drafter()
        if self.spec.warmup_tokens:
            await self._warm_up(self.spec.warmup_tokens)

    async def _attach_drafter(self) -> None:
        # vLLM builds the group proposer without its model runner, whose request ids it needs (group_drafter.py)
        try:
            attached = await self._llm.collective_rpc("pdsr_attach_drafter")
        except Exception as exc:  # noqa: BLE001 - the engine process failed
            raise EngineError(self.name, f"attaching the group drafter failed: {type(exc).__name__}: {exc}",
                              remote_traceback=self._read_error()) from exc
        if not attached or not all(attached):
            raise EngineError(self.name, "speculative 'group': vLLM's worker has no pdsr group proposer "
                                         f"(speculative_config {self.speculative})")

    async def _warm_up(self, tokens: int) -> None:
        # The first step that samples with log-probs sets up kernels once (on the CPU build 4-22 s
        # while vLLM compiled a sampler helper, under 1 s with TORCHDYNAMO_DISABLE, see start());
        # pay it here rather than in the first batch's makespan.
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=tokens, temperature=1.0, logprobs=0, ignore_eos=True, detokenize=False)
        try:
            async for _ in self._llm.generate(TokensPrompt(prompt_token_ids=[0, 1, 2, 3]), params, "pdsr-warmup"):
                pass
        except Exception as exc:  # noqa: BLE001 - same classification as start-up failures
            raise EngineError(self.name, f"warm-up request failed: {type(exc).__name__}: {exc}",
                              remote_traceback=self._read_error()) from exc
        # its drafts are no segment's: counted, the engine's totals would exceed the trajectories' sums. vLLM records a
        # step's stats in the same pass that hands the request its last output, so they are in by now
        self._stats.reset_speculation()

    def _forks_worker(self, args: dict[str, Any]) -> bool:
        """Whether this CPU engine's worker is forked from its engine core rather than spawned (see
        vllm_plugin.py): one worker on the cores of ``devices``, no executor of the user's, and the
        OpenMP runtime vLLM preloads."""
        from pdsr_sdk.engines.vllm_env import forks_worker_here

        return (forks_worker_here() and bool(self.spec.devices) and "distributed_executor_backend" not in args
                and all(int(args.get(k) or 1) == 1
                        for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")))

    def _engine_args(self, cpu: bool) -> dict[str, Any]:
        spec = self.spec
        args: dict[str, Any] = dict(
            model=self.model,
            tokenizer=self.tokenizer or self.model,
            seed=self.seed,
            max_model_len=spec.max_model_len,
            max_num_seqs=spec.max_num_seqs,
            tensor_parallel_size=spec.tensor_parallel_size,
            enable_prefix_caching=True,   # segment continuations resubmit prompt + generated ids
            logprobs_mode=self.logprobs_mode,
            disable_log_stats=True,       # default loggers off; our load recorder still runs
            worker_extension_cls=WORKER_EXTENSION,   # update_weights (see vllm_worker.py)
        )
        if cpu:
            from pdsr_sdk.engines.vllm_env import cpu_dtype

            args.update(enforce_eager=True, dtype=cpu_dtype(spec.dtype))
        else:
            args.update(dtype=spec.dtype, gpu_memory_utilization=spec.gpu_memory_utilization)
        if self.speculative is not None:
            if "speculative_config" in spec.engine_args:
                from pdsr_sdk.errors import ConfigError

                raise ConfigError(f"engine {self.name!r}: speculative ({self.speculative.get('method')!r}) and "
                                  f"engine_args.speculative_config are both set; set one of them")
            args["speculative_config"] = dict(self.speculative)
            # each request's drafted and accepted tokens, for its span in the trajectories (what
            # `pdsr simulate calibrate` fits a verify step's cost from)
            args["per_request_spec_decode_metrics"] = "summary"
        args.update(spec.engine_args)
        return args

    async def close(self) -> None:
        self._closing = True
        for task in list(self._tasks.values()):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()
        if self._llm is not None:
            llm, self._llm = self._llm, None
            # stop the output handler first: once the core is gone it would log an EngineDeadError
            handler = getattr(llm, "output_handler", None)
            if handler is not None:
                handler.cancel()
                with contextlib.suppress(BaseException):
                    await handler
                llm.output_handler = None
            with contextlib.suppress(Exception):
                # vLLM waits up to 5 s for the core to exit after SIGTERM, then kills it;
                # in a thread, so several engines shut down at once
                await asyncio.to_thread(llm.shutdown, timeout=self.shutdown_timeout_s)
        self._error_file.unlink(missing_ok=True)

    # ------------------------------------------------------------- requests
    def submit(self, request: SegmentRequest) -> None:
        if self._dead or self._llm is None:
            raise EngineError(self.name, "engine is not running")
        self._tasks[request.request_id] = asyncio.get_running_loop().create_task(self._stream(request))

    def abort(self, request_id: str) -> None:
        # vLLM drops an abort that reaches it before the request is added (a submit and an abort in one tick):
        # the request would run to its max_tokens. So its stream also ends it at its next output.
        if request_id in self._tasks and self._llm is not None and not self._dead:
            self._abort_asked.add(request_id)
            asyncio.get_running_loop().create_task(self._abort(request_id))

    async def _abort(self, request_id: str) -> None:
        with contextlib.suppress(Exception):
            await self._llm.abort(request_id)

    def load(self) -> EngineLoad:
        return EngineLoad(running=self._stats.running, waiting=self._stats.waiting,
                          kv_cache_usage=self._stats.kv_cache_usage)

    def speculation_stats(self) -> dict[str, int]:
        """Speculative decoding since the engine was ready (its warm-up request left out; all 0 without it):
        ``drafts`` (a request's verify steps that checked drafted tokens), ``drafted_tokens``, ``accepted_tokens``
        (drafted tokens the model accepted; each verify step also yields one token of its own). From vLLM's
        scheduler stats."""
        return dict(self._stats.speculation)

    def _draft_args(self, request: SegmentRequest) -> dict[str, Any] | None:
        """``group``: the request's draft corpus as its siblings stand now, at the segment's launch."""
        if not group_drafter.is_group(self.speculative):
            return None
        carried = self.carried_draft_args.pop(request.request_id, None)
        if carried is not None or request.sample is None:
            return carried
        spec = self.speculative
        return group_drafter.group_extra_args(request, spec["prompt_lookup_min"], spec["prompt_lookup_max"])

    def _stop_window(self, request: SegmentRequest) -> HeldTokens | None:
        """For a continuation under stop strings: its first tokens' holder (see ``stop_window``), else None."""
        stops = list(request.sampling.stop)
        if not stops or request.continued_tokens <= 0 or not request.context_ids:
            return None
        tokenizer = self._llm.tokenizer
        before = request.context_ids[-min(request.continued_tokens, window_tokens(stops)):]
        return HeldTokens(lambda ids: tokenizer.decode(ids, skip_special_tokens=True), before, stops)

    async def _stream(self, request: SegmentRequest) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        s = request.sampling
        observer = self.observer
        extra_args = self._draft_args(request)
        if observer is not None:
            extra_args = observer.on_launch(request, extra_args)
        reason = ABORT
        counts = None
        stop_reason: str | int | None = None   # the stop string or stop token id that ended it (vLLM's)
        listener = self._listener
        try:
            # in the try: sampling vLLM refuses (its VLLMValidationError) fails this sample, not the task unseen
            params = SamplingParams(
                max_tokens=request.max_tokens,
                **sampling_args(s, request.ignore_eos),
                logprobs=0,
                detokenize=bool(s.stop),   # text is decoded once at the end; stop strings need it
                output_kind=RequestOutputKind.DELTA,
                extra_args=extra_args,
            )
            prompt = TokensPrompt(prompt_token_ids=request.context_ids)
            if request.cache_salt is not None:
                prompt["cache_salt"] = request.cache_salt
            gen = self._llm.generate(prompt, params, request.request_id)
            held = self._stop_window(request)
            async for out in gen:
                if observer is not None:
                    observer.on_output(request.request_id, out)
                comp = out.outputs[0]
                ids = comp.token_ids
                lps = [step[tok].logprob for step, tok in zip(comp.logprobs or (), ids)] if comp.logprobs else None
                if held is not None:   # a continuation's first tokens wait until no split stop string can end in them
                    ids, lps, cut = held.feed(ids, lps, out.finished)
                    if cut:   # a stop string the boundary split ends here: as vLLM would have stopped
                        if ids:
                            listener.on_tokens(self, request.request_id, len(ids), ids, lps)
                        reason, stop_reason = STOP, held.stop
                        await gen.aclose()   # aborts the request in vLLM
                        break
                if held is not None and held.done:
                    held = None
                if ids:
                    listener.on_tokens(self, request.request_id, len(ids), ids, lps)
                if out.finished:
                    reason = finish_reason(comp.finish_reason)
                    stop_reason = comp.stop_reason if reason == STOP else None
                    counts = speculation_counts(getattr(comp, "spec_decode_metrics", None))
                elif request.request_id in self._abort_asked:
                    await gen.aclose()   # aborts the request in vLLM, now that it knows it
                    break
        except asyncio.CancelledError:
            if self._closing:
                return
            raise
        except Exception as exc:  # noqa: BLE001 - classify below
            self._tasks.pop(request.request_id, None)
            if self._closing:
                return
            if self._is_dead(exc):
                self._die(exc)
                return
            if refused(exc) and hasattr(listener, "on_request_failed"):
                # vLLM refused this request (an empty prompt, a token out of vocabulary, a context past
                # max_model_len, sampling it does not take): its sample fails, the engine serves on
                listener.on_request_failed(self, request.request_id, f"{type(exc).__name__}: {exc}")
                return
            listener.on_engine_dead(self, EngineError(
                self.name, f"request {request.request_id} failed: {type(exc).__name__}: {exc}",
                remote_traceback=self._read_error()))
            return
        finally:
            self._abort_asked.discard(request.request_id)
        self._tasks.pop(request.request_id, None)
        # only what there is: a listener written before a keyword was added still hears the rest
        extra = {k: v for k, v in (("speculation", counts), ("stop_reason", stop_reason)) if v is not None}
        listener.on_segment_end(self, request.request_id, reason, **extra)

    # ---------------------------------------------------------------- death
    def _is_dead(self, exc: Exception) -> bool:
        from vllm.v1.engine.exceptions import EngineDeadError

        return isinstance(exc, EngineDeadError) or (self._llm is not None and getattr(self._llm, "errored", False))

    def _die(self, exc: Exception) -> None:
        if self._dead:
            return
        self._dead = True
        status = self.exit_status()
        self._listener.on_engine_dead(self, EngineError(
            self.name, f"engine core died ({type(exc).__name__}: {exc})",
            exit_status=status, remote_traceback=self._read_error()))

    def exit_status(self) -> int | None:
        """Exit status of the engine-core process if it has exited (negative = killed by a signal)."""
        for proc in self.core_processes():
            code = getattr(proc, "exitcode", None)
            if code is not None:
                return code
        return None

    def core_processes(self) -> list[Any]:
        """The engine-core process handles (multiprocessing.Process) vLLM started for us."""
        client = getattr(self._llm, "engine_core", None)
        resources = getattr(client, "resources", None)
        manager = getattr(resources, "engine_manager", None)
        procs = getattr(manager, "processes", None)
        return list(procs or [])

    def _read_error(self) -> str | None:
        try:
            text = self._error_file.read_text(errors="replace").strip()
        except OSError:
            return None
        return text[-20000:] or None


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
