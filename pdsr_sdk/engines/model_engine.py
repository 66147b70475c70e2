"""What the engines that serve a model (vLLM here or in a Ray actor) share: their identity
from an :class:`~pdsr_sdk.engines.config.EngineSpec`, the model they load, and the listener
the scheduler binds. Generation itself is each backend's own."""

from __future__ import annotations

from typing import Any

from pdsr_sdk.dispatch.protocols import EngineListener


#: why ``session.sleep()`` cannot free a CPU engine's memory (vLLM's sleep mode is for GPUs)
CPU_CANNOT_SLEEP = ("vLLM's CPU build cannot free engine memory (its sleep mode is GPU-only; the CPU worker "
                    "ignores it)")


class ModelEngine:
    counts_only = False   # streams token ids and log-probs, not just counts

    def __init__(self, spec, *, model: str, tokenizer: str | None = None, seed: int = 0,
                 logprobs_mode: str = "processed_logprobs", speculative: dict[str, Any] | None = None):
        self.spec = spec
        self.name = spec.name
        self.pool = spec.pool
        self.max_concurrency = spec.max_num_seqs
        self.segment_capacity_tokens = spec.segment_capacity_tokens
        #: KV-cache capacity in tokens; known once the engine has started and sized its cache
        self.kv_cache_tokens: int | None = None
        self.model = model
        self.tokenizer = tokenizer
        self.seed = seed
        self.logprobs_mode = logprobs_mode
        #: vLLM's speculative_config (``RolloutConfig.vllm_speculative_config()``), None = no speculation
        self.speculative = speculative
        self._listener: EngineListener | None = None
        self._dead = False
        self._closing = False

    def bind(self, listener: EngineListener) -> None:
        """Called once by the scheduler before start; engine events go to ``listener``."""
        self._listener = listener
