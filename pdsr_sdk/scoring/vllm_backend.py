"""The vLLM scoring backend (``backend="vllm"``, :class:`VllmScoring`): prompt logprobs of prompt + completion.

Each sample is one request ``TokensPrompt(prompt + completion)`` with
``SamplingParams(max_tokens=1, prompt_logprobs=0)``: vLLM returns, for every
token after the first, the log-prob of that token given the ones before it
(entry 0 is None); the completion positions are kept. vLLM batches the
requests itself (continuous batching, unpadded), so there are no padded
shapes; requests are submitted in blocks of consecutive samples (``mbs`` or
a real-token quota) only to bound one call and report progress.

Limits, checked in vLLM 0.32's source (``GPUModelRunner._get_prompt_logprobs_dict``,
which the CPU runner inherits): prompt logprobs are ``log_softmax`` of the
raw logits in fp32 ("prompt tokens skip sampling processors"), so a
temperature other than 1 is not applied, and only the top-k plus the given
token are returned, so there is no entropy. Both raise ConfigError here
instead of silently returning something else. Prefix caching is disabled:
cached prompt tokens get no prompt logprobs.
"""

from __future__ import annotations

import os

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from pdsr_sdk.errors import ConfigValueError, DataValueError, EngineError
from pdsr_sdk.scoring.backend import BackendOutput, ScoreInputs, ScoreMeter

if TYPE_CHECKING:
    from pdsr_sdk.scoring.config import ScoreOptions


def make_engine(model_dir: str | Path, *, dtype: str = "auto", max_model_len: int | None = None,
                kv_cache_gib: float = 1.0, seed: int = 0, **engine_args: Any):
    """A ``vllm.LLM`` set up for scoring (eager, no prefix caching, no tokenizer needed)."""
    from pdsr_sdk.engines.vllm_env import apply_cpu_defaults
    from pdsr_sdk.scoring.checkpoint import check_model_dir, checkpoint_dtype

    path = check_model_dir(model_dir)
    if dtype == "auto":   # the checkpoint's, as the torch backend reads it (vLLM's auto downcasts float32)
        dtype = checkpoint_dtype(path)
    apply_cpu_defaults(kv_cache_gib)
    from vllm import LLM

    # token ids in, log-probs out: a tokenizer is only loaded if the directory has one
    has_tokenizer = any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    args = dict(model=str(path), enforce_eager=True, dtype=dtype, seed=seed, enable_prefix_caching=False,
                skip_tokenizer_init=not has_tokenizer)
    if max_model_len is not None:
        args["max_model_len"] = int(max_model_len)
    if os.environ.get("TQDM_DISABLE", "") not in ("", "0"):
        # tqdm's own switch (the CLI sets it for --quiet and log files); vLLM draws its weight-loading bar
        # with an explicit setting that the variable does not reach
        args["use_tqdm_on_load"] = False
    args.update(engine_args)
    try:
        return LLM(**args)
    except Exception as exc:  # noqa: BLE001 - vLLM start-up failures vary
        hint = ""
        if "_lib_fn_wrapper" in str(exc):
            # vllm/triton_utils/dispatcher.py (CPU build) scans every loaded module and trips
            # over llvmlite's library wrapper; only the in-process engine core runs that scan
            # in this process.
            hint = (" (a known vLLM 0.32 CPU-build problem: an in-process engine core, "
                    "VLLM_ENABLE_V1_MULTIPROCESSING=0, cannot start once numba/llvmlite is imported; "
                    "unset that variable or create the engine before importing numba)")
        raise EngineError("vllm-score", f"cannot start vLLM on {path}: {type(exc).__name__}: {exc}{hint}") from exc


def shutdown_engine(llm) -> None:
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        try:
            core.shutdown()
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass


def engine_vocab_size(llm) -> int:
    return int(llm.llm_engine.model_config.get_vocab_size())


def engine_max_model_len(llm) -> int:
    return int(llm.llm_engine.model_config.max_model_len)


def check_options(*, temperature: float, return_entropy: bool) -> None:
    if temperature != 1.0:
        raise ConfigValueError(
            f"temperature: the vllm backend cannot apply temperature={temperature}: vLLM computes prompt "
            f"logprobs from the raw logits (sampling processors, temperature included, are skipped); "
            f"use backend='torch' or temperature=1")
    if return_entropy:
        raise ConfigValueError("entropy: the vllm backend has no entropy (prompt logprobs hold only the given "
                          "tokens' log-probs); use backend='torch'")


def score_blocks(llm, blocks: Sequence[Sequence[int]], seqs: Sequence[np.ndarray], prompt_lens: np.ndarray,
                 *, on_block: Callable[[Sequence[int]], None] | None = None) -> list[list[np.ndarray]]:
    """Per block of sample indices, the completion log-probs of each sample (float32)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    out: list[list[np.ndarray]] = []
    for block in blocks:
        prompts = [TokensPrompt(prompt_token_ids=seqs[i].tolist()) for i in block]
        try:
            results = llm.generate(prompts, params, use_tqdm=False)
        except Exception as exc:  # noqa: BLE001
            raise EngineError("vllm-score", f"scoring failed: {type(exc).__name__}: {exc}") from exc
        block_out = []
        for i, res in zip(block, results):
            seq, p = seqs[i], int(prompt_lens[i])
            entries = res.prompt_logprobs
            if entries is None or len(entries) != len(seq):
                raise EngineError("vllm-score", f"sample {i}: expected {len(seq)} prompt logprob entries, got "
                                                f"{None if entries is None else len(entries)}")
            block_out.append(np.array([entries[t][int(seq[t])].logprob for t in range(p, len(seq))],
                                      dtype=np.float32))
        out.append(block_out)
        if on_block is not None:
            on_block(block)
    return out


class VllmScoring:
    """The ``vllm`` scoring backend: prompt logprobs, requests submitted in blocks of consecutive samples.

    With a model directory it starts its own engine in :meth:`score` (sized to
    the longest sample unless ``options.vllm_max_model_len``) and shuts it
    down before returning.
    """

    def check(self, options: ScoreOptions) -> None:
        check_options(temperature=options.temperature, return_entropy=options.entropy)
        if options.pack:
            raise ConfigValueError("pack: the vllm backend batches unpadded tokens itself; pack applies to "
                              "backend='torch'")

    def load(self, model_dir: Path, options: ScoreOptions) -> Any:
        return model_dir  # the engine's max_model_len depends on the samples: started in score()

    def vocab_size(self, model: Any) -> int | None:
        return None if isinstance(model, (str, Path)) else engine_vocab_size(model)

    def score(self, model: Any, inputs: ScoreInputs, options: ScoreOptions, meter: ScoreMeter) -> BackendOutput:
        from pdsr_sdk.scoring.buckets import request_blocks

        lengths = inputs.lengths
        mbs, quota = options.mbs, options.max_tokens_per_micro_batch
        # vLLM batches unpadded tokens itself: blocks of consecutive requests, no partitioner
        # (which also keeps numba out of this process, see make_engine)
        partitions = request_blocks(lengths, mbs=mbs, max_tokens=quota)
        mode = (f"mbs={mbs}" if mbs is not None else f"token quota {quota}" if quota is not None
                else "single block")
        logps = self._run(model, partitions, inputs, options, meter) if partitions else []
        # vLLM's memory is its engine's (KV cache sized up front by VLLM_CPU_KVCACHE_SPACE or
        # gpu_memory_utilization, often in another process): this process's RSS would say nothing
        return BackendOutput(
            partitions=partitions, logps=logps, entropy=None, mode=mode,
            head="vLLM prompt logprobs (fp32 log_softmax of the engine's logits)",
            computed_tokens=int(lengths.sum()), distinct_shapes=None, shapes=(), peak_memory_bytes=None,
            peak_memory_method="n/a for vLLM (its KV cache is sized up front)")

    @staticmethod
    def _run(model, partitions, inputs: ScoreInputs, options: ScoreOptions, meter: ScoreMeter):
        lengths, source = inputs.lengths, inputs.source
        owned = None
        try:
            if isinstance(model, (str, Path)):
                max_len = options.vllm_max_model_len or int(lengths.max()) + 1
                owned = model = make_engine(model, dtype=options.dtype, max_model_len=max_len,
                                            kv_cache_gib=options.vllm_kv_cache_gib)
            limit = engine_max_model_len(model)
            too_long = np.flatnonzero(lengths + 1 > limit)
            if too_long.size:
                i = int(too_long[0])
                raise DataValueError(f"{source + ': ' if source else ''}row {i}: prompt + completion = "
                                     f"{int(lengths[i])} tokens does not fit the vLLM engine's max_model_len={limit} "
                                     f"(needs length + 1)")
            meter.start(len(partitions))
            try:
                return score_blocks(model, partitions, inputs.seqs, inputs.prompt_lens, on_block=meter.advance)
            finally:
                meter.stop()
        finally:
            if owned is not None:
                shutdown_engine(owned)
