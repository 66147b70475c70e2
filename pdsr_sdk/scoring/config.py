"""Configuration of ``pdsr score`` (per-token log-probs of completions)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from pdsr_sdk.config import ConfigModel

DEFAULT_ROW_CHUNK = 512
DEFAULT_LENGTH_BUCKET = 64


class ScoreConfig(ConfigModel):
    """Score the completions of a trajectories file under a model and write the log-probs back."""

    data: Path = Field(description="Input Parquet/JSONL/Arrow file with list columns of prompt and response token ids "
                                   "(what `pdsr rollout` writes).")
    out: Path = Field(description="Output Parquet file: the input columns plus the log-prob column (written atomically).")
    model: Path | None = Field(None, description="Local Hugging Face causal LM directory (with config.json); "
                                                 "default: the built-in tiny random model.")
    prompt_column: str = Field("prompt_token_ids", description="List column with each sample's prompt token ids.")
    response_column: str = Field("response_token_ids", description="List column with each sample's completion token ids "
                                                                   "(the tokens that get a log-prob).")
    column: str = Field("ref_logps", description="Name of the output list<float32> column; with `entropy`, "
                                                 "`<column>_entropy` is written too.")
    backend: Literal["torch", "vllm"] = Field("torch", description="'torch': transformers forward with chunked fp32 "
                                                                   "log-softmax; 'vllm': vLLM prompt logprobs.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Device of the torch backend; 'auto' = cuda "
                                                                       "when available, else cpu.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Model weights dtype ('auto' = the checkpoint's). Log-softmax always runs in fp32.")
    mbs: int | None = Field(None, ge=1, description="Fixed micro-batch size (rows); the last block is padded with "
                                                    "dummy rows to mbs so the (rows, seq_len) shapes stay few. "
                                                    "Exclusive with max_tokens_per_micro_batch.")
    max_tokens_per_micro_batch: int | None = Field(
        None, ge=1, description="Token quota per micro-batch (computed tokens: rows x padded length). "
                                "Exclusive with mbs. Neither = one forward over everything.")
    token_grouping: Literal["length", "none"] = Field(
        "length", description="Token-quota mode only. 'length': group samples of similar length, then split each "
                              "group with partition_by_tokens (little padding); 'none': partition_by_tokens over "
                              "all samples at once (verl's rule, made for unpadded/packed forwards: here it pads "
                              "a lot).")
    max_padding_fraction: float = Field(
        0.03, ge=0.0, lt=1.0, description="Token-quota 'length' grouping: a group of similar lengths stops "
                                          "growing when padding would exceed this fraction of its tokens.")
    length_bucket: int = Field(DEFAULT_LENGTH_BUCKET, ge=1,
                               description="Pad each micro-batch's sequence length up to a multiple of this, "
                                           "so few distinct shapes occur.")
    row_chunk: int = Field(DEFAULT_ROW_CHUNK, ge=1,
                           description="Completion positions per lm_head/log-softmax chunk: fp32 logits are "
                                       "materialised for at most row_chunk x vocab at a time.")
    temperature: float = Field(1.0, gt=0.0, description="Logits are divided by this before the softmax "
                                                        "(match the sampling temperature of the rollout).")
    entropy: bool = Field(False, description="Also write the per-token entropy as `<column>_entropy` "
                                             "(torch backend only).")
    attention_mask: bool = Field(
        True, description="Pass the right-padding attention mask to the model. False skips it, which is exact "
                          "for causal LMs (real tokens never attend to the later padding) and lets SDPA use "
                          "its causal kernel (faster).")
    pad_id: int | None = Field(None, ge=0, description="Token id used for padding (never affects results); "
                                                       "default: the model's pad_token_id, else 0.")
    vllm_max_model_len: int | None = Field(None, ge=16, description="vLLM max_model_len; default: the longest "
                                                                    "prompt + completion.")
    vllm_kv_cache_gib: float = Field(1.0, gt=0, description="vLLM CPU KV-cache size in GiB "
                                                            "(VLLM_CPU_KVCACHE_SPACE, when not already set).")

    @model_validator(mode="after")
    def _one_micro_batch_mode(self) -> "ScoreConfig":
        if self.mbs is not None and self.max_tokens_per_micro_batch is not None:
            raise ValueError(
                f"mbs ({self.mbs}) and max_tokens_per_micro_batch ({self.max_tokens_per_micro_batch}) are "
                f"exclusive: give a fixed micro-batch size or a token quota, not both")
        return self
