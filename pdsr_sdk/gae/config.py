"""Config of ``pdsr gae``: per-token advantages over a table, by critic GAE (per-token rewards, values and masks)
or by an outcome estimator without a critic (GRPO, RLOO, REINFORCE++: one reward per sample and its group)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.config.base import check_device
from pdsr_sdk.errors import ConfigValueError
from pdsr_sdk.io.tables import ParquetPath


#: the keys every estimator takes
COMMON_KEYS = frozenset({"data", "out", "overwrite", "estimator", "rewards_column", "mask_column"})
_SCAN = frozenset({"gamma", "chunk", "backend", "carry_dtype", "device", "threads"})   # runs the GAE scan
#: the keys each estimator takes beside COMMON_KEYS: another one given (in a config or by its flag) is an error,
#: so a setting that would change nothing is not silently ignored
ESTIMATOR_KEYS = {   # by verl's algorithm.adv_estimator names
    "gae": _SCAN | {"values_column", "lam", "whiten"},
    "grpo": frozenset({"group_column", "tokens_column", "normalize_std", "eps", "singleton"}),
    "rloo": frozenset({"group_column", "tokens_column", "singleton"}),
    "reinforce_plus_plus": _SCAN | {"tokens_column"},
    "reinforce_plus_plus_baseline": frozenset({"group_column", "tokens_column", "singleton"}),
}


class GaeConfig(ConfigModel):
    """Per-token advantages over a Parquet/Arrow/JSONL table; writes the input plus ``advantages`` (and
    ``returns`` for ``gae`` and ``reinforce_plus_plus``)."""

    data: Path = Field(description="Input table (Parquet, Arrow IPC or JSONL, or a folder of such shards), one row "
                                   "per sample: its rewards, response mask and (gae) values or (others) group id "
                                   "and response tokens; rows may have different lengths.")
    out: ParquetPath = Field(description="Output Parquet file: the input columns plus 'advantages' and (gae, "
                                         "reinforce_plus_plus) 'returns' (list<float32>, replacing columns of those "
                                         "names); written atomically.")
    overwrite: bool = Field(False, description="Replace an existing output file (without it, an existing 'out' "
                                               "is an error).")
    estimator: Literal["gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"] = Field(
        "gae", description="Advantage estimator, by verl's algorithm.adv_estimator name: gae (a critic's values "
                           "column), or without a critic grpo, rloo, reinforce_plus_plus or "
                           "reinforce_plus_plus_baseline (one reward per sample; its group from group_column).")
    rewards_column: Optional[str] = Field(None, description="Column of per-token rewards (a list per row), or of "
                                                            "one number per row, which is placed on the row's last "
                                                            "valid token (verl's token_level_rewards convention); "
                                                            "grpo, rloo, reinforce_plus_plus_baseline take a list's "
                                                            "sum, as verl does. null: 'rewards', or else 'reward' "
                                                            "(the column `pdsr rollout` writes).")
    values_column: str = Field("values", description="gae: column of per-token value estimates V_t (a list per "
                                                     "row, as long as the rewards list).")
    group_column: str = Field("prompt_id", description="grpo, rloo, reinforce_plus_plus_baseline: column of each "
                                                       "sample's group id (verl's uid; `pdsr rollout` writes "
                                                       "prompt_id); a group's rows may be anywhere in the file.")
    tokens_column: str = Field("response_token_ids", description="Estimators other than gae: column whose list "
                                                                 "length per row is the response's token count, "
                                                                 "the length of the output lists (`pdsr rollout` "
                                                                 "writes response_token_ids).")
    mask_column: Optional[str] = Field("response_mask", description="Column of the per-token response mask (a "
                                                                    "list of bool or 0/1 per row; nonzero = valid "
                                                                    "token; a null row, as `pdsr rollout` writes "
                                                                    "for a single-turn sample: every token of the "
                                                                    "row is valid). null: every token is valid.")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="gae, reinforce_plus_plus: discount factor gamma, in "
                                                           "[0, 1] (verl's algorithm.gamma).")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="gae: GAE lambda, in [0, 1].")
    normalize_std: Literal["group", "batch", "none"] = Field(
        "group", description="grpo: divide the centred reward by its group's unbiased std (group; verl), the whole "
                             "file's (batch; TRL's scale_rewards='batch'), or not (none: Dr. GRPO, verl's "
                             "norm_adv_by_std_in_grpo=False); true / false mean group / none.")
    eps: float = Field(1e-6, ge=0.0, description="grpo: added to the std before dividing (verl's 1e-6; TRL's "
                                                 "1e-4).")
    singleton: Literal["zero", "score"] = Field(
        "zero", description="grpo, rloo, reinforce_plus_plus_baseline: a sample alone in its group gets zero (it "
                            "is its own baseline), or score: a baseline of 0, so it keeps its reward (verl's grpo, "
                            "rloo and reinforce_plus_plus_baseline).")
    chunk: int = Field(256, ge=1, description="gae, reinforce_plus_plus: chunk length C of the torch chunk-scan "
                                              "backend (numba and reference ignore it).")
    backend: str = Field("auto", description="gae, reinforce_plus_plus: backend of the scan: auto (on a CUDA device "
                                             "triton if installed, else torch; numba otherwise), numba, torch, triton "
                                             "(fused kernel, CUDA only), reference (float64 loop, slow), or an import "
                                             "path 'package.module:Class' of a registered-style backend.")
    carry_dtype: Literal["auto", "float32", "float64"] = Field(
        "auto", description="gae, reinforce_plus_plus: precision of the recurrence state: auto = the backend's choice "
                            "(numba and triton: float32 for float32 data; torch: float64), float32 or float64.")
    device: str = Field("cpu",
                        description="gae, reinforce_plus_plus: device of the torch backend: cpu, cuda or cuda:N.")
    whiten: bool = Field(False, description="gae: whiten the advantages over all valid tokens of the file (verl's "
                                            "masked_whiten: unbiased variance, eps 1e-8); returns are computed "
                                            "before whitening.")
    threads: int = Field(0, ge=0, description="gae, reinforce_plus_plus: CPU threads of the numba backend; 0 = all "
                                              "CPUs available to the process.")

    @field_validator("normalize_std", mode="before")
    @classmethod
    def _std_bool(cls, value):
        # a YAML true / false, as verl's norm_adv_by_std_in_grpo and grpo_advantages' normalize_std take it
        return {True: "group", False: "none"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _keys_of_estimator(self) -> "GaeConfig":
        stray = sorted(self.model_fields_set - COMMON_KEYS - ESTIMATOR_KEYS[self.estimator])
        if stray:
            key = stray[0]
            takes = sorted(ESTIMATOR_KEYS[self.estimator])
            raise ConfigValueError(f"{key} (--{key.replace('_', '-')}) does not apply to estimator "
                                   f"{self.estimator!r}; leave it out (it takes {', '.join(takes)} beside "
                                   f"{', '.join(sorted(COMMON_KEYS - {'estimator'}))})")
        return self

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        from pdsr_sdk.gae.api import GAE_BACKENDS

        return GAE_BACKENDS.check_name(value, also=("auto",))

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        return check_device(value)
