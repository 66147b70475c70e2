"""The scoring backend protocol and its registry.

:func:`~pdsr_sdk.scoring.per_token_logps` does what every backend shares
(options, ragged inputs, row checks, restoring input order, the stats) and
hands the model work to a :class:`ScoringBackend` found by name in
:data:`SCORING_BACKENDS`. Built in: ``torch``
(:mod:`pdsr_sdk.scoring.torch_backend`) and ``vllm``
(:mod:`pdsr_sdk.scoring.vllm_backend`), registered as lazy import paths so
that this module imports neither torch nor vLLM (the registry itself is in
:mod:`pdsr_sdk.scoring.registry`). Your own::

    from pdsr_sdk.scoring import SCORING_BACKENDS
    SCORING_BACKENDS.register("mine", MyBackend)        # or "my_pkg.scoring:MyBackend"
    per_token_logps(model, prompts, completions, backend="mine")

or, unregistered, ``backend="my_pkg.scoring:MyBackend"``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence, runtime_checkable

import numpy as np

from pdsr_sdk.errors import ConfigValueError
from pdsr_sdk.progress import ProgressFactory, silent_progress
from pdsr_sdk.scoring.registry import SCORING_BACKENDS

if TYPE_CHECKING:
    from pdsr_sdk.scoring.config import ScoreOptions


@dataclass(frozen=True)
class ScoreInputs:
    """The validated samples of one call: ``seqs[i]`` is prompt + completion of sample ``i``."""

    seqs: list[np.ndarray]  #: int64 token ids, prompt then completion
    prompt_lens: np.ndarray  #: int64 [n]; completion tokens of sample i are seqs[i][prompt_lens[i]:]
    lengths: np.ndarray  #: int64 [n], len(seqs[i])
    source: str = ""  #: where the inputs came from (a file), for error messages; may be ""


@dataclass
class BackendOutput:
    """What :meth:`ScoringBackend.score` returns: results per block of samples, and what it cost.

    Sample ``partitions[k][j]`` has log-probs ``logps[k][j]`` (float32, one
    per completion token); every sample is in exactly one partition, in any
    order (per_token_logps restores the input order).
    """

    partitions: list[list[int]]
    logps: list[list[np.ndarray]]
    entropy: list[list[np.ndarray]] | None  #: like logps, or None when not computed
    mode: str  #: how samples were grouped, e.g. "mbs=32", "token quota 8192", "token quota 16384 (default)"
    head: str  #: how the log-probs were formed (shown in the stats)
    computed_tokens: int  #: tokens the model ran on, padding and dummy rows included
    distinct_shapes: int | None = None  #: distinct padded (rows, seq_len) shapes; None if unpadded
    shapes: tuple[tuple[int, int], ...] = ()  #: those shapes, sorted
    peak_memory_bytes: int | None = None
    peak_memory_method: str = "n/a"


class ScoreMeter:
    """Wall time of the scoring loop and the progress bar (one step per block of samples).

    A backend calls :meth:`start` just before its timed loop (model loading
    and engine start-up are not timed), :meth:`advance` after each block and
    :meth:`stop` after the loop, also when it fails (``try/finally``).
    """

    def __init__(self, lengths: np.ndarray, progress: ProgressFactory | None = None):
        self.lengths = lengths
        self.progress = progress or silent_progress
        self.tokens = 0
        self.t0 = 0.0
        self.seconds = 0.0
        self.bar: Any = None

    def start(self, total: int) -> None:
        self.bar = self.progress("score", total=total, unit="mb")
        self.t0 = time.perf_counter()

    def advance(self, indices: Sequence[int]) -> None:
        self.tokens += int(self.lengths[list(indices)].sum())
        self.bar.update(1)
        elapsed = time.perf_counter() - self.t0
        if elapsed > 0:
            self.bar.set_postfix_str(f"{self.tokens / elapsed:,.0f} tok/s")

    def stop(self) -> None:
        self.seconds = time.perf_counter() - self.t0
        if self.bar is not None:
            self.bar.close()


@runtime_checkable
class ScoringBackend(Protocol):
    """One way to compute per-token log-probs, registered by name in :data:`SCORING_BACKENDS`.

    :func:`~pdsr_sdk.scoring.per_token_logps` instantiates the registered
    class with no arguments once per call and calls its methods in the order
    below, each at most once. Keep ``__init__`` and the module's imports
    cheap: import torch, vLLM and the like inside the methods. Raise
    :class:`~pdsr_sdk.errors.ConfigError` for options, ``DataError`` for
    inputs and ``EngineError`` for engine failures.
    """

    def check(self, options: ScoreOptions) -> None:
        """Called first, after the options validated and before the inputs are read or a
        model is loaded: raise ConfigError for options this backend cannot honour (vllm:
        a temperature other than 1, entropy). May be a no-op."""

    def load(self, model_dir: Path, options: ScoreOptions) -> Any:
        """Called only when the caller passed a model directory, after it was found to
        hold a config.json and the rows were checked against its vocab_size. Returns what
        :meth:`vocab_size` and :meth:`score` receive as ``model`` (torch: the loaded model
        on ``options.device`` in ``options.dtype``; a backend that starts its own engine
        in :meth:`score` may return ``model_dir`` unchanged)."""

    def vocab_size(self, model: Any) -> int | None:
        """Called once, with the caller's model object or what :meth:`load` returned: the
        number of valid token ids (every id must be in [0, vocab_size); a row outside
        raises DataError naming it). None: unknown before :meth:`score`."""

    def score(self, model: Any, inputs: ScoreInputs, options: ScoreOptions, meter: ScoreMeter) -> BackendOutput:
        """Called once, with rows already checked (non-empty prompt, ids in the vocabulary;
        possibly no rows at all). A completion may be empty (a failed sample): its log-probs
        are an empty array. Group the samples per ``options`` (mbs,
        token quota or all at once), compute the log-prob of every completion token
        (position t predicts token t + 1, logits / ``options.temperature``, fp32
        log-softmax) and the entropy if ``options.entropy``. Report progress through
        ``meter`` (see :class:`ScoreMeter`). A backend that owns a resource it started
        here (an engine) shuts it down before returning. Its output is checked (each sample
        in one partition, one value per completion token): a mismatch is a RunError naming
        the backend and the sample."""


def get_backend(name: str) -> ScoringBackend:
    """Instantiate the backend registered as ``name`` (or at the import path ``name``)."""
    impl = SCORING_BACKENDS.get(name)
    backend = impl() if isinstance(impl, type) else impl
    if not isinstance(backend, ScoringBackend):
        missing = [m for m in ("check", "load", "vocab_size", "score") if not callable(getattr(backend, m, None))]
        raise ConfigValueError(f"backend: {name!r} is not a ScoringBackend (missing method(s): {', '.join(missing)}); "
                          f"see pdsr_sdk.scoring.backend.ScoringBackend")
    return backend
