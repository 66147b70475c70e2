"""What a :class:`~pdsr_sdk.engines.vllm_engine.VllmEngine` reads off vLLM's reports: a stat logger keeping
the load and speculative decoding's counters, a finished request's finish reason and speculation counts, and
whether an exception is vLLM refusing a request."""

from __future__ import annotations

from typing import Any

from pdsr_sdk.dispatch.types import ABORT, LENGTH, STOP

#: speculative decoding's counters (:meth:`VllmEngine.speculation_stats`): verify steps of a request that had
#: drafted tokens, the tokens drafted, and those of them the model accepted
SPECULATION_KEYS = ("drafts", "drafted_tokens", "accepted_tokens")


class LoadRecorder:
    """A vLLM stat logger that keeps the last scheduler snapshot (running, waiting, KV usage), and adds up
    speculative decoding's counts (vLLM's per-step ``SpecDecodingStats``; the engine zeroes them after its warm-up)."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage: float | None = None
        self.speculation = dict.fromkeys(SPECULATION_KEYS, 0)

    def reset_speculation(self) -> None:
        """Zero the speculation counts (called once the engine's warm-up request is done)."""
        self.speculation = dict.fromkeys(SPECULATION_KEYS, 0)

    def factory(self, vllm_config, engine_index: int = 0):
        from vllm.v1.metrics.loggers import StatLoggerBase

        recorder = self

        class _Logger(StatLoggerBase):
            def __init__(self, vllm_config, engine_index: int = 0):
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
                if scheduler_stats is not None:
                    recorder.running = scheduler_stats.num_running_reqs
                    recorder.waiting = scheduler_stats.num_waiting_reqs
                    recorder.kv_cache_usage = scheduler_stats.kv_cache_usage
                    spec = getattr(scheduler_stats, "spec_decoding_stats", None)
                    if spec is not None:
                        counts = recorder.speculation
                        counts["drafts"] += spec.num_drafts
                        counts["drafted_tokens"] += spec.num_draft_tokens
                        counts["accepted_tokens"] += spec.num_accepted_tokens

            def log_engine_initialized(self):
                pass

        return _Logger(vllm_config, engine_index)


def speculation_counts(metrics: Any) -> tuple[int, int] | None:
    """(drafted, accepted) tokens from vLLM's per-request ``RequestSpecDecodeMetrics`` (its histogram counts
    verify steps by accepted drafted tokens); None without them."""
    if metrics is None:
        return None
    hist = list(getattr(metrics, "histogram", None) or ())
    return int(getattr(metrics, "num_draft_tokens", 0)), sum(j * c for j, c in enumerate(hist))


def finish_reason(reason: str | None) -> str:
    if reason == "length":
        return LENGTH
    if reason == "abort":
        return ABORT
    return STOP


def refused(exc: Exception) -> bool:
    """Whether vLLM refused the request itself (its validation, or admission control: a 4xx error) rather than
    failed serving it. A vLLM without ``VLLMClientError`` (older releases) refuses nothing this way."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return False
    return isinstance(exc, VLLMClientError)


def no_prometheus() -> type:
    """A vLLM Prometheus stat logger that registers nothing, for ``AsyncLLM(stat_loggers=...)``: given one, vLLM adds
    none of its own. Its own registers the engine's metrics in the process's one registry, unregistering every
    earlier engine's first, so with several engines in one process it served only the last one's, and engines
    starting at once collided there (``DuplicateTimeseries: vllm:cache_config_info``, at start-up)."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class NoPrometheus(PrometheusStatLogger):
        def __init__(self, vllm_config: Any = None, engine_indexes: list[int] | None = None):
            self.engine_indexes = engine_indexes or [0]

        def record(self, *args: Any, **kwargs: Any) -> None:
            pass

        def record_admission_rejection(self, reason: str) -> None:
            pass

        def record_sleep_state(self, *args: Any, **kwargs: Any) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

    return NoPrometheus
