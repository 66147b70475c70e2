"""Config of ``pdsr gae`` (GAE over a table of per-token rewards, values and masks)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, field_validator

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.config.base import check_device
from pdsr_sdk.io.tables import ParquetPath


class GaeConfig(ConfigModel):
    """GAE over a Parquet/Arrow/JSONL table; writes the input plus ``advantages`` and ``returns``."""

    data: Path = Field(description="Input table (Parquet, Arrow IPC or JSONL, or a folder of such shards), one row "
                                   "per sample with list columns of per-token rewards, values and response mask; rows may have "
                                   "different lengths.")
    out: ParquetPath = Field(description="Output Parquet file: the input columns plus 'advantages' and 'returns' "
                                  "(list<float32>, replacing columns of those names); written atomically.")
    overwrite: bool = Field(False, description="Replace an existing output file (without it, an existing 'out' "
                                               "is an error).")
    rewards_column: Optional[str] = Field(None, description="Column of per-token rewards (a list per row), or of "
                                                            "one number per row, which is placed on the row's last "
                                                            "valid token (verl's token_level_rewards convention). "
                                                            "null: 'rewards', or else 'reward' (the column `pdsr "
                                                            "rollout` writes).")
    values_column: str = Field("values", description="Column of per-token value estimates V_t (a list per row, "
                                                     "as long as the rewards list).")
    mask_column: Optional[str] = Field("response_mask", description="Column of the per-token response mask (a "
                                                                    "list of bool or 0/1 per row; nonzero = valid "
                                                                    "token; a null row, as `pdsr rollout` writes "
                                                                    "for a single-turn sample: every token of the "
                                                                    "row is valid). null: every token is valid.")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount factor gamma, in [0, 1].")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda, in [0, 1].")
    chunk: int = Field(256, ge=1, description="Chunk length C of the torch chunk-scan backend (numba and "
                                              "reference ignore it).")
    backend: str = Field("auto", description="GAE backend: auto (on a CUDA device triton if installed, else "
                                             "torch; numba otherwise), numba, torch, triton (fused kernel, CUDA "
                                             "only), reference (float64 loop, slow), or an import path "
                                             "'package.module:Class' of a registered-style backend.")
    carry_dtype: Literal["auto", "float32", "float64"] = Field(
        "auto", description="Precision of the recurrence state: auto = the backend's choice (numba and triton: "
                            "float32 for float32 data; torch: float64), float32 or float64.")
    device: str = Field("cpu", description="Device of the torch backend: cpu, cuda or cuda:N.")
    whiten: bool = Field(False, description="Whiten the advantages over all valid tokens of the file (verl's "
                                            "masked_whiten: unbiased variance, eps 1e-8); returns are computed "
                                            "before whitening.")
    threads: int = Field(0, ge=0, description="CPU threads of the numba backend; 0 = all CPUs available to "
                                              "the process.")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        from pdsr_sdk.gae.api import GAE_BACKENDS

        return GAE_BACKENDS.check_name(value, also=("auto",))

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        return check_device(value)
