"""``TraceSynthConfig``: parameters of the synthetic long-tailed length traces (``pdsr trace synth``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.errors import ConfigValueError

#: the most tokens a length, a prompt or an environment's turn of a synthetic trace may have (2^31 - 1, past any
#: model's context), and the most samples (groups x n) a trace may hold: int64 sums over a trace cannot overflow
MAX_TOKENS = 2**31 - 1
MAX_SAMPLES = 2**31 - 1


class TraceSynthConfig(ConfigModel):
    """A synthetic GRPO length trace: G prompt groups of N samples.

    Model: prompt g has a difficulty ``d_g = median_length * exp(prompt_sigma * z_g)``;
    sample j has length ``round(d_g * exp(noise_sigma * e_gj))`` clipped to
    [min_length, max_length]; a fraction ``runaway_frac`` of samples runs away
    and hits ``max_length`` (finish reason ``"length"``). z, e are standard
    normal. Sample 0 (the probe) is drawn like every other sample.

    The defaults resemble the P-DSR length study of a 0.5B model on MATH.
    At G=7424, N=8, seed 0 (the study's numbers in brackets):
    mean CV (ddof=1) 0.315 [0.29], Spearman(sample 0, sample j) 0.61 [0.62],
    false negatives at 512 tokens 55% [63%], batch capture 57% [47%], median
    length 424, p99 1426, 0.3% of samples at the 4096 cap. Top-10% recall is
    41% [31%]: real within-group noise has a heavier upper tail than a
    log-normal, so real traces agree even less at the top; and single
    runaways make the max CV larger (2.2 [1.18]).

    Turns (``turns_max`` > 1: a trace of turns, an agent's multi-turn samples): prompt g has a centre
    ``c_g ~ U[turns_min, turns_max]`` and sample j takes ``k = round(c_g + turns_noise * z)`` turns (clipped to
    the range, and to its sampled length); its sampled length (the model above) is cut at ``k - 1`` uniform
    points into its turns, and after each turn but the last the environment adds ``U[env_tokens_min,
    env_tokens_max]`` tokens after a delay log-uniform in ``[env_delay_min_s, env_delay_max_s]``. A sample's
    length is then its sampled and environment tokens together; ``max_length`` caps the sampled ones.

    ``family`` names a member of the workload family (``pdsr_sdk.traces.family.WORKLOADS``): its values are
    the defaults of the keys not given.
    """

    family: str | None = Field(
        None, description="A named workload of the family policies are judged on (`pdsr trace synth --family "
                          "list` lists them): its parameters replace the other keys' defaults, and keys given "
                          "override them. None: the keys' own defaults, which make the `informative` member.")

    groups: int = Field(512, ge=1, description="Number of prompt groups G.")
    n: int = Field(8, ge=1, description="Samples per group N (sample 0 is the probe).")
    seed: int = Field(0, ge=0, description="Seed of the numpy random Generator; the same seed gives the same trace.")
    median_length: float = Field(
        420.0, gt=0, allow_inf_nan=False,
        description="Median response length of a prompt of median difficulty, in tokens.")
    prompt_sigma: float = Field(
        0.4, ge=0, allow_inf_nan=False,
        description="Log-normal sigma of per-prompt difficulty (spread between prompts).")
    noise_sigma: float = Field(
        0.3, ge=0, allow_inf_nan=False,
        description="Log-normal sigma of the multiplicative within-group noise (spread inside a group).")
    runaway_frac: float = Field(
        0.003, ge=0, le=1, description="Fraction of samples that run away and stop at max_length.")
    runaway_concentration: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="None: every sample runs away with probability runaway_frac, independently. A "
                                "number k: each prompt draws its own runaway rate from Beta(runaway_frac*k, "
                                "(1-runaway_frac)*k) (mean runaway_frac; the smaller k, the more the rate varies "
                                "between prompts), as a small model's runs to the cap cluster by prompt "
                                "(SmolLM2-135M, 16 GSM8K prompts x 8, 512 tokens: 44% at the cap, 1 to 7 of 8 per "
                                "prompt, a variance 1.7x the independent case's, which k=9 gives; k=5 gives 2.2x and a "
                                "probe rank correlation of about 0.1 at 40% runaways).")
    max_length: int = Field(4096, ge=1, le=MAX_TOKENS,
                            description="Maximum response length (generation cap) in tokens.")
    min_length: int = Field(1, ge=0, le=MAX_TOKENS, description="Minimum response length in tokens.")
    prompt_len_min: int = Field(30, ge=0, le=MAX_TOKENS,
                                description="Smallest prompt length (uniform integer range, inclusive).")
    prompt_len_max: int = Field(300, ge=0, le=MAX_TOKENS,
                                description="Largest prompt length (uniform integer range, inclusive).")
    tokens_per_s: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="When set, write durations_s = length / tokens_per_s for every sample.")
    id_prefix: str = Field("p", description="Prompt ids are this prefix followed by the zero-padded group index.")
    turns_min: int = Field(1, ge=1, le=MAX_TOKENS,
                           description="Fewest turns of a sample (a trace of turns when turns_max > 1).")
    turns_max: int = Field(
        1, ge=1, le=MAX_TOKENS, description="Most turns of a sample; 1: single-turn samples (no turns in the trace). "
                                            "Each prompt draws a centre uniformly in [turns_min, turns_max], its "
                                            "samples vary around it (turns_noise).")
    turns_noise: float = Field(
        1.0, ge=0, allow_inf_nan=False,
        description="Standard deviation of a sample's turn count around its prompt's centre (in turns).")
    env_tokens_min: int = Field(
        16, ge=0, le=MAX_TOKENS, description="Fewest tokens the environment adds after a turn (tool results, the "
                                             "template's tokens), uniform integer range.")
    env_tokens_max: int = Field(256, ge=0, le=MAX_TOKENS, description="Most tokens the environment adds after a turn.")
    env_delay_min_s: float = Field(
        0.1, ge=0, allow_inf_nan=False,
        description="Shortest environment delay after a turn in seconds (log-uniform between the two, as tool "
                    "latencies spread over orders of magnitude; uniform from 0 when this is 0).")
    env_delay_max_s: float = Field(
        5.0, ge=0, allow_inf_nan=False, description="Longest environment delay after a turn in seconds.")

    @model_validator(mode="before")
    @classmethod
    def _family_defaults(cls, data: Any) -> Any:
        """The family member's values under the keys given (an unknown name is left to ``_known_family``)."""
        if not isinstance(data, dict) or data.get("family") is None:
            return data
        from pdsr_sdk.traces.family import WORKLOADS, check_recorded_config, workload

        name = data["family"]
        if not isinstance(name, str) or (name not in WORKLOADS and ":" not in name):
            return data
        member = workload(name)
        if member.recorded is not None:
            defaults = {k: f.default for k, f in cls.model_fields.items()} | dict(member.synth)
            check_recorded_config(member, data, defaults)
        return {**member.synth, **data}

    @field_validator("family")
    @classmethod
    def _known_family(cls, value: str | None) -> str | None:
        if value is None:
            return value
        from pdsr_sdk.traces.family import WORKLOADS

        return WORKLOADS.check_name(value)

    @model_validator(mode="after")
    def _ranges(self) -> "TraceSynthConfig":
        if self.groups * self.n > MAX_SAMPLES:
            raise ConfigValueError(f"groups x n = {self.groups} x {self.n} is {self.groups * self.n:,} samples; a "
                                   f"synthetic trace holds at most {MAX_SAMPLES:,}")
        if self.min_length > self.max_length:
            raise ConfigValueError(f"min_length ({self.min_length}) must be <= max_length ({self.max_length})")
        if self.turns_min > self.turns_max:
            raise ConfigValueError(f"turns_min ({self.turns_min}) must be <= turns_max ({self.turns_max})")
        if self.env_tokens_min > self.env_tokens_max:
            raise ConfigValueError(f"env_tokens_min ({self.env_tokens_min}) must be <= env_tokens_max "
                                   f"({self.env_tokens_max})")
        if self.env_delay_min_s > self.env_delay_max_s:
            raise ConfigValueError(f"env_delay_min_s ({self.env_delay_min_s}) must be <= env_delay_max_s "
                                   f"({self.env_delay_max_s})")
        if self.prompt_len_min > self.prompt_len_max:
            raise ConfigValueError(f"prompt_len_min ({self.prompt_len_min}) must be <= prompt_len_max "
                                   f"({self.prompt_len_max})")
        return self
