"""Micro-batched per-token log-prob scoring (``pdsr score``).

- :func:`per_token_logps`: ragged prompt/completion ids in (or a trainer's
  padded ones with their masks), one float32 array of completion log-probs
  per sample out (plus entropy and stats); how it runs is a
  :class:`ScoreOptions` (or the same keys as keywords).
- Backends (:data:`SCORING_BACKENDS`, each a :class:`ScoringBackend`):
  ``torch`` (transformers, chunked fp32 log-softmax over the lm_head) and
  ``vllm`` (prompt logprobs); register your own or pass an import path.
- Micro-batching: fixed ``mbs`` (tail padded to ``mbs`` rows) or a token
  quota (balanced partitions, original order restored; 16,384 by default).
- :func:`score_table` / :func:`score_file`: the same on a trajectories table / file (the file in blocks
  of rows, resumable).

Importing this package does not import torch, transformers or vLLM.
"""

from __future__ import annotations

from pdsr_sdk.lazy import lazy_attributes as _lazy_attributes

from pdsr_sdk.scoring.api import ScoreResult, ScoreStats, per_token_logps
from pdsr_sdk.scoring.backend import (
    BackendOutput,
    ScoreInputs,
    ScoreMeter,
    ScoringBackend,
    get_backend,
)
from pdsr_sdk.scoring.config import ScoreConfig, ScoreOptions
from pdsr_sdk.scoring.registry import SCORING_BACKENDS

_LAZY = {
    "load_model": "pdsr_sdk.scoring.torch_backend",
    "make_engine": "pdsr_sdk.scoring.vllm_backend",
    "score_table": "pdsr_sdk.scoring.table",
    "score_file": "pdsr_sdk.scoring.file_run",
    "score_output_schema": "pdsr_sdk.scoring.table",
    "chunked_token_logps": "pdsr_sdk.scoring.logprob_kernel",
    "naive_token_logps": "pdsr_sdk.scoring.logprob_kernel",
}

__all__ = sorted(["SCORING_BACKENDS", "BackendOutput", "ScoreConfig", "ScoreInputs", "ScoreMeter", "ScoreOptions",
                  "ScoreResult", "ScoreStats", "ScoringBackend", "get_backend", "per_token_logps", *_LAZY])


__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY)
