"""``AnalyzeConfig``: parameters of ``pdsr analyze`` (the seed 002 statistics)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.errors import ConfigValueError


class AnalyzeConfig(ConfigModel):
    """Which statistics of a length trace to compute; defaults follow the P-DSR length study (0.5B model, MATH)."""

    #: the V2.5 replay's keys are named as v2.5's own settings (``offload_fraction``, ``cap_multiplier``)
    renamed_keys: ClassVar[dict[str, str]] = {"offload_frac": "offload_fraction", "cap_mult": "cap_multiplier"}

    top_k: float = Field(
        0.1, gt=0, le=1,
        description="Top-K fraction for the recall statistic: the floor(K * G) longest groups by each sample.")
    safe_k: float = Field(
        0.2, gt=0, le=1,
        description="The 'safe' rate counts sample 0's top_k groups that land in sample j's top safe_k groups; at "
                    "least top_k (the safe set is the wider one).")
    fn_length: int = Field(
        512, ge=0,
        description="Length threshold (tokens) of the false-negative rate: probe below it, a later sample above.")
    batch_prompts: int = Field(
        16, ge=1, description="Prompts per batch for the batch-level capture test (consecutive groups).")
    capture_top: int = Field(
        3, ge=1, description="A batch is captured when its longest task's group is among the top this many probes.")
    dispatch_batch_prompts: int = Field(
        128, ge=1,
        description="Prompts per batch for the V2.5 dispatch replay (seed 002's dispatch table: 58 batches of 128; "
                    "its batch capture test used 16, batch_prompts).")
    offload_fraction: float = Field(
        0.2, gt=0, le=1,
        description="V2.5: fraction of each batch's prompts (by probe length) offloaded to heavy; floor(frac * B), at "
                    "least 1 (seed 002: 25 of 128).")
    cap_multiplier: float = Field(
        1.5, gt=0, allow_inf_nan=False,
        description="V2.5: the fast-pool cap is floor(cap_multiplier * L_cut) tokens.")
    cv_ddof: Literal[0, 1] = Field(
        1, description="Delta degrees of freedom of the per-group std in the CV: 1 = sample std (pandas), "
                       "0 = population std.")
    plots: bool = Field(True, description="Write PNG plots (length histogram, probe vs later, CV histogram).")

    @model_validator(mode="after")
    def _safe_set_wider(self) -> "AnalyzeConfig":
        # below top_k the rate could never reach 1 and reads as a worse probe than it is
        if self.safe_k < self.top_k:
            raise ConfigValueError(f"safe_k ({self.safe_k:g}) must be at least top_k ({self.top_k:g}): the safe rate "
                                   f"counts the top_k groups found inside the wider top safe_k")
        return self
