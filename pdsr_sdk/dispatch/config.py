"""Settings the scheduler itself reads: how responses are sampled and how long segments are.

``pdsr rollout`` and ``pdsr simulate`` configs embed these sections
(:mod:`pdsr_sdk.rollout.config` re-exports them).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.errors import ConfigValueError


class SamplingConfig(ConfigModel):
    """How each response is sampled."""

    n: int = Field(8, ge=1, description="Samples per prompt (the GRPO group size N). Sample 0 is the probe.")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature; 0 = greedy, else 0.01 to 2, vLLM's bounds (it refuses a request above 2 and samples one under 0.01 at 0.01).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Top-k sampling; 0 disables it.")
    max_tokens: int = Field(1024, ge=1, description="Most response tokens per sample (finish reason 'length' past it).")
    stop: list[str] = Field(default_factory=list, description="Stop strings that end a response (non-empty: vLLM refuses an empty one).")
    stop_token_ids: list[int] = Field(default_factory=list, description="Token ids that end a response besides the model's EOS, as verl passes a chat template's end-of-turn tokens (<|im_end|>, <|eot_id|>); the stop token is kept as the response's last token. Extra EOS ids: ignore_eos ignores them too.")
    ignore_eos: bool = Field(False, description="Keep generating past EOS (and stop_token_ids) until max_tokens (benchmarks).")


    @field_validator("temperature")
    @classmethod
    def _sampled_as_given(cls, temperature: float) -> float:
        # vLLM samples at 0.01 whatever is under it: the recorded temperature, which scoring and the trainer's
        # log-prob ratios read, would not be the one sampled at
        if 0 < temperature < 0.01:
            raise ValueError(f"{temperature} is under 0.01, which vLLM raises to 0.01 (so the log-probs would not be "
                             f"at the temperature recorded); use 0 for greedy or at least 0.01")
        return temperature

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, stop: list[str]) -> list[str]:
        if any(not s for s in stop):
            raise ValueError(f"an empty stop string ends nothing (vLLM refuses it); got {stop!r}")
        return stop

    @field_validator("stop_token_ids")
    @classmethod
    def _token_ids(cls, ids: list[int]) -> list[int]:
        if any(i < 0 for i in ids):
            raise ValueError(f"a token id is 0 or more; got {ids!r}")
        return ids


class SegmentConfig(ConfigModel):
    """Budget-aware dynamic segments: L_next = clamp(capacity / n_active, min_tokens, max_tokens)."""

    enabled: bool = Field(True, description="Generate in segments; if false each request runs to its end (or cap) in one go.")
    min_tokens: int = Field(64, ge=1, description="L_min: shortest segment (many active requests).")
    max_tokens: int = Field(4096, ge=1, description="L_max: longest segment (the last few requests).")

    @model_validator(mode="after")
    def _ordered(self) -> "SegmentConfig":
        if self.min_tokens > self.max_tokens:
            raise ConfigValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        return self


class GroupFilterConfig(ConfigModel):
    """Dynamic sampling (DAPO): groups without GRPO signal are filtered out as they complete, and a step
    ends when step_groups groups that pass are complete (see docs/partial-rollout.md)."""

    kind: Literal["zero-variance"] = Field("zero-variance", description="Which groups are filtered out: 'zero-variance', a group whose N rewards are all equal (all right or all wrong: every GRPO advantage is 0). A sample whose reward failed is left out of the comparison, so a group needs two different rewards to pass. With overlong_buffer (DAPO's overlong shaping) the rewards compared are those before the shaping (DAPO's acc).")
    write_filtered: bool = Field(False, description="pdsr rollout: also write the filtered groups, to <output stem>.filtered.parquet (same columns). They are counted in the summary either way, and the SDK step returns them (StepResult.filtered).")
    min_pass_rate: float = Field(0.1, gt=0, le=1, description="Floor of the pass-rate estimate that sizes the groups in flight when over_provision is not given: at most ceil(step_groups / min_pass_rate) groups are kept in flight.")
    max_launch_factor: float | None = Field(30.0, gt=0, description="A step that needs to launch more than this many x step_groups groups ends the run with an error (nearly every group's rewards are equal: the data is too hard or too easy for the model), as verl's max_num_gen_batches (10 batches of 3 x B) does. null = no bound.")


class StepStreamConfig(ConfigModel):
    """Partial rollout across steps (:mod:`pdsr_sdk.dispatch.steps`): the keys ``pdsr rollout`` and
    ``pdsr simulate`` share (each adds ``steps`` and ``over_provision``)."""

    step_groups: int | None = Field(None, ge=1, description="Multi-step: groups B a step consumes; the step ends when B groups have completed since the previous step ended. Default: batch_size.")
    max_staleness: int | None = Field(None, ge=0, description="Multi-step: at each step end, a sample (finished or not) of an unconsumed group whose oldest kept token is more than this many policy versions old is restarted (its tokens are thrown away and counted as wasted), so no consumed token is older than this. None = no bound.")
    group_deadline: int | None = Field(None, ge=1, description="Multi-step: a group launched at step t is consumed at step t + group_deadline at the latest; that step does not end before the group completes (a hard bound on how long any group waits). None = no such bound (with max_staleness a sample is still restarted at most once: a step waits for it rather than restart it again).")
    filter_groups: GroupFilterConfig | None = Field(None, description="Dynamic sampling (DAPO): filter out groups whose rewards are all equal as they complete, until step_groups groups that pass are complete; the groups in flight follow the measured pass rate unless over_provision is given. Needs a reward. None = off.")
    kv_on_update: Literal["recompute", "keep"] = Field("recompute", description="What each weight update (a multi-step run's step end; RolloutSession.update_weights and next_version) does to the engines' KV cache. recompute (the default): the prefix cache is reset, so a carried sample prefills its whole context again under the new weights (exact). keep: the cache is kept, as in PipelineRL's in-flight weight updates, so a carried sample goes on from KV computed by the weights its tokens were sampled with (no re-prefill; its later tokens attend to that older KV, which is never older than its oldest kept token: requests of different start versions do not share cached blocks).")
