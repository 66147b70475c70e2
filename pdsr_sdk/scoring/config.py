"""Options of :func:`~pdsr_sdk.scoring.per_token_logps` and the config of ``pdsr score``.

:class:`ScoreOptions` is how one scoring call runs (backend, micro-batching,
numerics); :class:`ScoreConfig` is ``pdsr score``'s config: the same options
plus the files and columns, so a config file keeps one flat set of keys.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from pydantic import Field, field_validator, model_validator

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.config.base import check_device
from pdsr_sdk.errors import ConfigValueError
from pdsr_sdk.scoring.registry import SCORING_BACKENDS
from pdsr_sdk.io.paths import UserPath
from pdsr_sdk.io.tables import ParquetPath

DEFAULT_ROW_CHUNK = 512
DEFAULT_LENGTH_BUCKET = 64
#: the token quota per micro-batch when neither ``mbs`` nor ``max_tokens_per_micro_batch`` is set (verl's default
#: ``log_prob_max_token_len_per_gpu``); raised to the longest padded row where one is longer
DEFAULT_TOKEN_QUOTA = 16384
#: prompt + response tokens per block of rows ``pdsr score`` reads, scores and writes at a time
DEFAULT_BLOCK_TOKENS = 1 << 20

#: the flag of a ``pdsr score`` config key, where it is not the key's name with dashes
SCORE_FLAGS = {"max_tokens_per_micro_batch": "--max-tokens-per-mb"}


def score_flag(key: str) -> str:
    """The ``pdsr score`` flag of config key ``key``."""
    return SCORE_FLAGS.get(key, "--" + key.replace("_", "-"))

#: the keyword ``per_token_logps`` once took for :attr:`ScoreOptions.entropy` (still accepted)
OLD_KEYWORDS = {"return_entropy": "entropy"}


class ScoreOptions(ConfigModel):
    """How :func:`~pdsr_sdk.scoring.per_token_logps` scores: backend, micro-batching and numerics."""

    backend: str = Field("torch", description="Scoring backend: a name registered in SCORING_BACKENDS ('torch': "
                                              "transformers forward with chunked fp32 log-softmax; 'vllm': vLLM "
                                              "prompt logprobs) or an import path 'package.module:Class' of a "
                                              "ScoringBackend.")
    device: str = Field("auto", description="Device of the torch backend when it loads a model directory: auto "
                                            "(cuda when available, else cpu), cpu, cuda or cuda:N.",
                        json_schema_extra={"pattern": r"^(auto|cpu|cuda(:[0-9]+)?)$"})
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Model weights dtype when a model directory is loaded ('auto' = the checkpoint's). "
                            "Log-softmax always runs in fp32.")
    mbs: int | None = Field(None, ge=1, description="Fixed micro-batch size (rows); the last micro-batch is padded "
                                                    "with dummy rows to `mbs` so the (rows, seq_len) shapes stay few. "
                                                    "Exclusive with `max_tokens_per_micro_batch`.")
    max_tokens_per_micro_batch: int | None = Field(
        None, ge=1, description="Token quota per micro-batch (computed tokens: rows x padded length). "
                                "Exclusive with `mbs`. Neither: 16,384 (verl's default), raised to the "
                                "longest row where one is longer.")
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
                                       "materialised for at most `row_chunk` x vocab at a time.")
    temperature: float = Field(1.0, gt=0.0, description="Logits are divided by this before the softmax "
                                                        "(match the sampling temperature of the rollout; `pdsr "
                                                        "score` on a `pdsr rollout` file takes the temperature it "
                                                        "recorded, unless given).")
    entropy: bool = Field(False, description="Also compute the per-token entropy (torch backend only); `pdsr "
                                             "score` writes it as `<column>_entropy`.")
    attention_mask: bool = Field(
        True, description="Pass the right-padding attention mask to the model. Leaving it out is exact "
                          "for causal LMs (real tokens never attend to the later padding) and lets SDPA use "
                          "its causal kernel (faster).")
    pack: bool | None = Field(
        None, description="torch backend: packed micro-batches, each one row of concatenated samples with "
                          "per-sample position ids and attention that never crosses a sample boundary, so no "
                          "token is padding; a micro-batch is `max_tokens_per_micro_batch` real tokens (or `mbs` "
                          "consecutive samples, or everything). Unset: the rule 'packed where measured faster' "
                          "(pdsr_sdk.scoring.packed.PACK_MEASURED_FASTER) decides; it says unpacked: packed "
                          "matched the token quota on an H200 and was slower on the CPU. `length_bucket`, "
                          "`attention_mask` and `pad_id` do not apply to packed forwards.")
    packed_attention: Literal["varlen", "model"] = Field(
        "varlen", description="Attention in packed forwards: 'varlen' computes each sample's own causal block "
                              "(flash-attention varlen on CUDA fp16/bf16, one sdpa call per sample elsewhere); "
                              "'model' keeps the model's implementation with transformers' packed mask, which "
                              "for sdpa spans the whole row (N x N). Models with sliding windows or logit "
                              "soft-capping always use 'model'.")
    pad_id: int | None = Field(None, ge=0, description="Token id used for padding (never affects results); "
                                                       "default: the model's pad_token_id, else 0.")
    vllm_max_model_len: int | None = Field(None, ge=16, description="vLLM max_model_len when the vllm backend "
                                                                    "starts its own engine; default: the longest "
                                                                    "prompt + completion.")
    vllm_kv_cache_gib: float = Field(1.0, gt=0, description="vLLM CPU KV-cache size in GiB "
                                                            "(VLLM_CPU_KVCACHE_SPACE, when not already set).")

    @field_validator("mbs", "max_tokens_per_micro_batch", "length_bucket", "row_chunk", "pad_id",
                     "vllm_max_model_len", mode="before")
    @classmethod
    def _no_bool_for_int(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ConfigValueError("expected an integer, not a bool")
        return value

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        return SCORING_BACKENDS.check_name(value)

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        return check_device(value, auto=True)

    @model_validator(mode="after")
    def _one_micro_batch_mode(self) -> "ScoreOptions":
        if self.mbs is not None and self.max_tokens_per_micro_batch is not None:
            raise ConfigValueError(
                f"mbs ({self.mbs}) and max_tokens_per_micro_batch ({self.max_tokens_per_micro_batch}) are "
                f"exclusive: give a fixed micro-batch size or a token quota, not both")
        return self

    @classmethod
    def resolve(cls, options: "ScoreOptions | Mapping[str, Any] | None" = None,
                overrides: Mapping[str, Any] | None = None) -> "ScoreOptions":
        """``options`` (an instance, a mapping of keys, or None = defaults) with ``overrides`` applied.

        ``overrides`` are option keys given as keywords (the old keyword
        ``return_entropy`` means ``entropy``). Any bad or unknown key raises
        :class:`~pdsr_sdk.errors.ConfigValueError` (a ConfigError and a ValueError) naming it.
        """
        from pdsr_sdk.config import validate_config
        from pdsr_sdk.errors import ConfigError

        if isinstance(options, ScoreOptions) and not overrides:
            return options if type(options) is cls else options.options()
        if options is None:
            data: dict[str, Any] = {}
        elif isinstance(options, ScoreOptions):
            data = options.options().model_dump()
        elif isinstance(options, Mapping):
            data = dict(options)
        else:
            raise ConfigValueError(f"options: expected a ScoreOptions, a mapping of option keys or None, "
                              f"got {type(options).__name__}")
        for key, value in (overrides or {}).items():
            new = OLD_KEYWORDS.get(key, key)
            if new != key and new in (overrides or {}):
                raise ConfigValueError(f"{key} and {new} are the same option ({key} is its old name): give one")
            data[new] = value
        try:
            return validate_config(cls, data)
        except ConfigError as exc:   # options given in code: a ValueError too, as the SDK's other bad values
            if isinstance(exc, ValueError):
                raise
            raise ConfigValueError(str(exc)) from None

    def options(self) -> "ScoreOptions":
        """Just the scoring options (drops the fields a subclass such as :class:`ScoreConfig` adds)."""
        if type(self) is ScoreOptions:
            return self
        return ScoreOptions.model_validate(self.model_dump(include=set(ScoreOptions.model_fields)))


class ScoreConfig(ScoreOptions):
    """Score the completions of a trajectories file under a model and write the log-probs back."""

    data: UserPath = Field(description="Input Parquet/JSONL/Arrow file (or a folder of such shards) with list columns "
                                   "of prompt and response token ids (what `pdsr rollout` writes).")
    out: ParquetPath = Field(description="Output Parquet file: the input columns plus the log-prob column (written "
                                         "atomically).")
    overwrite: bool = Field(False, description="Replace an existing output file (without it, an existing `out` "
                                               "is an error), and start over where an interrupted run left "
                                               "blocks in `<out>.parts/`.")
    resume: bool = Field(False, description="Continue the interrupted run whose finished blocks are in "
                                            "`<out>.parts/`: keep them (each checked to match its rows of the "
                                            "input) and score the rest; refused, naming each one, where a setting "
                                            "that changes the numbers differs from the run's.")
    block_tokens: int = Field(DEFAULT_BLOCK_TOKENS, ge=1,
                              description="Rows are read, scored and written in blocks of consecutive rows holding "
                                          "about this many prompt + response tokens (a longer row is a block of "
                                          "its own; with `mbs`, a block is a whole number of micro-batches), so "
                                          "memory holds a block, not the file, and an interrupted run keeps its "
                                          "finished blocks.")
    model: UserPath | None = Field(None, description="Local Hugging Face causal LM directory (with config.json); "
                                                 "default: the built-in tiny random model.")
    prompt_column: str = Field("prompt_token_ids", description="List column with each sample's prompt token ids.")
    response_column: str = Field("response_token_ids",
                                 description="List column with each sample's completion token ids (the tokens that "
                                             "get a log-prob).")
    column: str = Field("ref_logps", description="Name of the output list<float32> column; with `entropy`, "
                                                 "`<column>_entropy` is written too.")

    @field_validator("block_tokens", mode="before")
    @classmethod
    def _no_bool_for_block_tokens(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ConfigValueError("expected an integer, not a bool")
        return value

    @model_validator(mode="after")
    def _resume_or_overwrite(self) -> "ScoreConfig":
        if self.resume and self.overwrite:
            raise ConfigValueError("resume and overwrite are exclusive: --resume continues the run in <out>.parts/, "
                                   "--overwrite starts over")
        return self
