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
    temperature: float = Field(
        1.0, ge=0.0, le=2.0, description="Sampling temperature; 0 = greedy, else 0.01 to 2, vLLM's bounds (it refuses "
                                         "a request above 2 and samples one under 0.01 at 0.01).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Top-k sampling; 0 disables it.")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="Min-p sampling: tokens whose probability is under min_p x "
                                                          "the most likely token's are never sampled; 0 disables it. "
                                                          "Like top_p and top_k it shapes what is sampled from, and "
                                                          "the recorded log-probs (logprobs_mode processed_logprobs) "
                                                          "are of that distribution.")
    repetition_penalty: float = Field(
        1.0, gt=0.0, description="vLLM's repetition penalty on every token already in the prompt or the response "
                                 "(logits divided by it where positive, multiplied where negative; 1 = off). "
                                 "Segment-invariant: a continuation's prompt holds the response so far. The recorded "
                                 "log-probs (processed_logprobs) are after it, so they are not the model's own: a "
                                 "trainer's importance ratio against the model's log-probs sees the penalty too.")
    presence_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="vLLM's presence penalty (subtracted from the logit of every token already "
                                          "in the response; 0 = off). vLLM counts only a request's own output, so it "
                                          "needs each sample in one request: segments.enabled false, no steps, no "
                                          "agent; a sample a policy moves, an engine's death requeues or a pause "
                                          "carries is continued with the counts starting again. Recorded log-probs are "
                                          "after it (as repetition_penalty).")
    frequency_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="vLLM's frequency penalty (subtracted once per occurrence of a token in the "
                                          "response; 0 = off). Counted as presence_penalty is: it needs each sample in "
                                          "one request (segments.enabled false, no steps, no agent).")
    max_tokens: int = Field(1024, ge=1, description="Most response tokens per sample (finish reason 'length' past it).")
    stop: list[str] = Field(
        default_factory=list, description="Stop strings that end a response (non-empty: vLLM refuses an empty one).")
    stop_token_ids: list[int] = Field(
        default_factory=list, description="Token ids that end a response besides the model's EOS, as verl passes a "
                                          "chat template's end-of-turn tokens (<|im_end|>, <|eot_id|>); the stop token "
                                          "is kept as the response's last token; an id outside the model's vocabulary "
                                          "is an error. Extra EOS ids: ignore_eos ignores them too.")
    ignore_eos: bool = Field(False,
                             description="Keep generating past EOS (and stop_token_ids) until max_tokens (benchmarks).")


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


def check_output_penalties(sampling: SamplingConfig, *, segments: bool, steps: bool, agent: bool) -> None:
    """presence_penalty and frequency_penalty count a vLLM request's own output tokens only: a sample continued in a
    new request (whose prompt holds the response so far) would be penalised as if its response began there."""
    keys = [k for k in ("presence_penalty", "frequency_penalty") if getattr(sampling, k)]
    where = [w for w, on in (("segments.enabled (segments: set it false)", segments),
                             ("steps (partial rollout carries samples across steps)", steps),
                             ("agent (each model turn is a new request)", agent)) if on]
    if keys and where:
        raise ConfigValueError(f"sampling.{' and sampling.'.join(keys)} need each sample in one vLLM request (vLLM "
                               f"counts only a request's own output, and a continuation's earlier tokens are in its "
                               f"prompt), which {'; '.join(where)} breaks")


class SegmentConfig(ConfigModel):
    """Budget-aware dynamic segments: L_next = clamp(capacity / n_active, min_tokens, max_tokens)."""

    enabled: bool = Field(True,
                          description="Generate in segments; if false each request runs to its end (or cap) in one go.")
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

    kind: Literal["zero-variance"] = Field(
        "zero-variance", description="Which groups are filtered out: 'zero-variance', a group whose N rewards are all "
                                     "equal (all right or all wrong: every GRPO advantage is 0). A sample whose reward "
                                     "failed is left out of the comparison, so a group of N > 1 needs two different "
                                     "values to pass; a group of one sample (n = 1) passes with its reward, as in "
                                     "verl. Which values: metric.")
    metric: Literal["acc", "score", "seq_reward"] = Field(
        "acc", description="What the filter compares within a group (verl's algorithm.filter_groups.metric; pdsr "
                           "rollout only, the simulator compares its trace's rewards). acc (DAPO's recipe): the "
                           "reward's acc field where it returns a dict with one, else its score before overlong "
                           "shaping (verl logs a number reward as acc). score: the reward's score before overlong "
                           "shaping. seq_reward: the reward after it (the reward column). verl's seq_final_reward adds "
                           "a trainer's KL penalty: without one it is seq_reward.")
    write_filtered: bool = Field(False, description="pdsr rollout: also write the filtered groups, to <output "
                                                    "stem>.filtered.parquet (same columns). They are counted in the "
                                                    "summary either way, and the SDK step returns them "
                                                    "(StepResult.filtered).")
    min_pass_rate: float = Field(
        0.1, gt=0, le=1, description="Floor of the pass-rate estimate that sizes the groups in flight when "
                                     "over_provision is not given: at most ceil(step_groups / min_pass_rate) groups "
                                     "are kept in flight.")
    max_launch_factor: float | None = Field(
        30.0, gt=0, description="A step launches at most this many x step_groups groups, and the run ends with an "
                                "error once those cannot bring step_groups passing ones (nearly every group's rewards "
                                "are equal: the data is too hard or too easy for the model), as verl's "
                                "max_num_gen_batches (10 batches of 3 x B) does. null = no bound.")


class StepStreamConfig(ConfigModel):
    """Partial rollout across steps (:mod:`pdsr_sdk.dispatch.steps`): the keys ``pdsr rollout`` and
    ``pdsr simulate`` share (each adds ``steps`` and ``over_provision``)."""

    step_groups: int | None = Field(None, ge=1, description="Multi-step: groups B a step consumes; the step ends when "
                                                            "B groups have completed since the previous step ended. "
                                                            "Default: batch_size.")
    max_staleness: int | None = Field(
        None, ge=0,
        description="Multi-step: at each step end, a sample (finished or not) of an unconsumed group whose oldest kept "
                    "token is more than this many policy versions old is restarted (its tokens are thrown away and "
                    "counted as wasted), so no consumed token is older than this. None = no bound.")
    group_deadline: int | None = Field(
        None, ge=1, description="Multi-step: a group launched at step t is consumed at step t + group_deadline at the "
                                "latest; that step does not end before the group completes (a hard bound on how long "
                                "any group waits). None = no such bound (with max_staleness a sample is still "
                                "restarted at most once: a step waits for it rather than restart it again).")
    filter_groups: GroupFilterConfig | None = Field(
        None, description="Dynamic sampling (DAPO): filter out groups whose rewards are all equal as they complete, "
                          "until step_groups groups that pass are complete; the groups in flight follow the measured "
                          "pass rate unless over_provision is given. Needs a reward. None = off.")
    kv_on_update: Literal["recompute", "keep"] = Field(
        "recompute", description="What each weight update (a multi-step run's step end; RolloutSession.update_weights "
                                 "and next_version) does to the engines' KV cache. recompute (the default): the prefix "
                                 "cache is reset, so a carried sample prefills its whole context again under the new "
                                 "weights (exact). keep: the cache is kept, as in PipelineRL's in-flight weight "
                                 "updates, so a carried sample goes on from KV computed by the weights its tokens were "
                                 "sampled with (no re-prefill; its later tokens attend to that older KV, which is "
                                 "never older than its oldest kept token: requests of different start versions do not "
                                 "share cached blocks).")
    update: Literal["all", "staggered"] = Field(
        "all", description="Multi-step: all (the default; faster at B = 512 in the simulator) loads each update into "
                           "every engine at the step's end, so a response running then goes on under the new weights "
                           "(partial). staggered lets responses whose tokens are all of the ending version finish "
                           "under it on the fewest engines, which take nothing else and load once those end "
                           "(off-policy by one, not partial; an update mid-step, or in buckets without the shared "
                           "memory for a copy, loads every engine).")

    @model_validator(mode="after")
    def _staggered_needs_staleness(self) -> "StepStreamConfig":
        if self.update == "staggered" and self.max_staleness == 0:
            raise ConfigValueError("update: staggered finishes responses under the weights of the step that ended, "
                                   "one version old: it needs max_staleness unset or at least 1")
        return self
