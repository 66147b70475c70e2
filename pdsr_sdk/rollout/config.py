"""Configuration of ``pdsr rollout`` (one pydantic model per section).

The sampling and segment sections are the scheduler's own (:mod:`pdsr_sdk.dispatch.config`), the
engine entries the engines' (:mod:`pdsr_sdk.engines.config`); they are re-exported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from pdsr_sdk.agent.config import AgentConfig
from pdsr_sdk.config import ConfigModel
from pdsr_sdk.config.base import deprecated_key, validate_config
from pdsr_sdk.errors import ConfigError, ConfigValueError
from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig, StepStreamConfig, check_output_penalties
from pdsr_sdk.dispatch.steps import check_agent_streaming
from pdsr_sdk.engines.config import (SPECULATIVE_METHODS, EngineSpec, RayConfig, SpeculativeSettings,
                                     unknown_speculative)
from pdsr_sdk.io.paths import UserPath, UserPathText
from pdsr_sdk.io.tables import ParquetPath
from pdsr_sdk.policies.choice import PolicyChoice

#: standard instructions by name (``data.instruction``, ``--instruction``), appended to the last user message
INSTRUCTIONS: dict[str, str] = {
    "math": "Please reason step by step, and put your final answer within \\boxed{}.",
}

__all__ = ["INSTRUCTIONS", "AgentConfig", "DataConfig", "EngineSpec", "OutputConfig", "RayConfig", "RolloutConfig",
           "SamplingConfig", "SegmentConfig", "SpeculativeSettings"]


class DataConfig(ConfigModel):
    """Where prompts come from."""

    path: UserPath | None = Field(None, description="Parquet, JSONL (or a .json array of objects), Arrow IPC or "
                                                    "CSV/TSV file of prompts, or a folder or glob pattern "
                                                    "(train-*.parquet) of such shards, read in name order; default: "
                                                    "the built-in sample prompts.")
    prompt_column: str | None = Field(None, description="Column with the prompt text, or with chat messages (then used "
                                                        "as messages_column); default: the first of 'prompt', "
                                                        "'problem', 'question', 'input', 'context_messages' present. "
                                                        "Column names may be dotted paths into struct columns.")
    messages_column: str | None = Field(None, description="Column with chat messages (a list of {role, content}); used "
                                                          "instead of prompt_column.")
    id_column: str | None = Field(None, description="Column with a unique prompt id; default: "
                                                    "'id'/'unique_id'/'prompt_id' if present, else the row number.")
    ground_truth_column: str | None = Field(
        None, description="Column with the reference answer for the reward: a string or number (read as text), or a "
                          "list or struct (passed to a reward function as it is, a dict or list; the built-in math "
                          "rewards refuse it); default: the first of 'answer', 'ground_truth', "
                          "'reward_model.ground_truth' (verl), 'label' (OpenRLHF) present.")
    data_source: str | None = Field(None, description="The reward's data_source for rows without one (no data_source "
                                                      "column, or null): verl's default_compute_score picks its scorer "
                                                      "by it ('openai/gsm8k', 'lighteval/MATH', ...). The scorer gets "
                                                      "the ground truth as the data has it, and verl's gsm8k one "
                                                      "compares only a number ('18'), so a raw GSM8K file's worked "
                                                      "solution ('... #### 18') scores 0: give it data prepared as "
                                                      "verl's gsm8k preprocessing does.")
    apply_chat_template: bool = Field(True,
                                      description="Wrap prompts with the tokenizer's chat template (when it has one).")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra variables for the chat template wherever pdsr renders one (prompts, "
                                          "an agent's new messages, serve's chat requests), e.g. {'enable_thinking': "
                                          "false} for Qwen3 (verl's data.apply_chat_template_kwargs).")
    system_prompt: str | None = Field(None, description="System message put first in every prompt (without a chat "
                                                        "template: the first paragraph of the prompt text). A prompt "
                                                        "whose chat messages already start with a system message is an "
                                                        "error naming its row.")
    instruction: str | None = Field(
        None, description="Name of a standard instruction appended to each prompt's last user message, after a "
                          "newline: " + "; ".join(f"'{k}': '{v}'" for k, v in INSTRUCTIONS.items())
                          + " ('math' asks for what the math_verify and math_boxed rewards read).")
    limit: int | None = Field(None, ge=1, description="Use only the first N prompts.")
    target_lengths_column: str | None = Field(
        None,
        description="Column of per-sample response lengths to force (length-controlled replay, needs ignore_eos).")
    skip_long: bool = Field(False, description="Skip prompts whose tokens plus max_tokens exceed the model's context "
                                               "(counted in the summary) instead of failing.")

    @field_validator("instruction")
    @classmethod
    def _known_instruction(cls, name: str | None) -> str | None:
        if name is not None and name not in INSTRUCTIONS:
            raise ValueError(f"unknown instruction {name!r}; valid names: {', '.join(INSTRUCTIONS)}")
        return name


class OutputConfig(ConfigModel):
    """Where trajectories and the summary go."""

    path: ParquetPath = Field(
        Path("runs/rollout.parquet"), description="Trajectories Parquet file (one row per sample).")
    summary_path: UserPath | None = Field(None, description="Run summary JSON; default: <path without "
                                                            "suffix>.summary.json.")
    resume: bool = Field(False,
                         description="Skip prompt groups already finished in the output (after an interrupted run).")
    overwrite: bool = Field(False, description="Replace an existing output instead of failing.")
    flush_groups: int = Field(16, ge=1, description="Write finished groups to disk at least every this many groups.")
    flush_interval_s: float = Field(10.0, gt=0, description="... or at least this often (seconds).")


class RolloutConfig(StepStreamConfig, PolicyChoice):
    """``pdsr rollout``: generate GRPO groups with a P-DSR dispatch policy."""

    model: UserPathText | None = Field(None, description="Local model directory (Hugging Face format); default: the "
                                                         "built-in tiny random model.")
    tokenizer: UserPathText | None = Field(None, description="Tokenizer directory if not the model's.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompt source.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling settings.")
    batch_size: int = Field(128, ge=1, description="Prompts per batch (B); a batch is one GRPO step's rollout.")
    num_batches: int | None = Field(None, ge=1,
                                    description="Stop once the run has this many batches (of batch_size prompts, the "
                                                "data's order), counting those a --resume finds on disk.")
    policy: str = Field("v3", description="Dispatch policy: a registered name (see schemas/policy-*.schema.json), a "
                                          "built-in preset or a preset file, or 'package.module:Class'; a "
                                          "comma-separated list or 'all' (every registered policy that runs on real "
                                          "engines) runs one rollout per policy, each to <output.path "
                                          "stem>.<policy>.parquet.")
    policy_settings: dict[str, Any] = Field(
        default_factory=dict, description="Per-policy settings overrides, keyed by policy name: {'v2.5': "
                                          "{'cap_multiplier': 2.0}}; validated with the config, and carried as each "
                                          "policy's typed settings (see schemas/policy-<name>.schema.json).")
    engines: list[EngineSpec] | None = Field(
        None, description="Explicit engine list; default: an automatic layout from fast/heavy.")
    fast: int | None = Field(None, ge=0,
                             description="Engines in the fast pool for the automatic layout (default: most devices).")
    heavy: int | None = Field(None, ge=0, description="Engines in the heavy pool for the automatic layout (default: 1 "
                                                      "per 4 devices, at least 1).")
    engine_defaults: dict[str, Any] = Field(
        default_factory=dict, description="Settings applied to every automatically laid-out engine (keys of an engine "
                                          "entry), over the layout's own `max_num_seqs: 128` (an engine listed in "
                                          "`engines` defaults to 64).")
    segments: SegmentConfig = Field(default_factory=SegmentConfig, description="Budget-aware dynamic segments.")
    reward: str | None = Field("auto", description="Reward: 'math_verify' (math-verify on the last \\boxed{}, else a "
                                                   "GSM8K '#### N', else a DAPO 'Answer: N'), 'math_boxed' (its "
                                                   "pure-Python fallback), 'none', an import path 'pkg.mod:fn' or a "
                                                   "file's 'path/to/file.py:fn' (verl's custom_reward_function), or "
                                                   "'auto' (math_verify when a ground truth exists).")
    reward_timeout_s: float = Field(5.0, gt=0, description="Seconds one math_verify check may take (it runs in a "
                                                           "worker process); a check that takes longer scores 0 and is "
                                                           "counted as reward_timeouts in the summary.")
    reward_time_limit_s: float | None = Field(
        None, gt=0, description="Seconds one reward call may run, from its start (a reward of your own, such as a code "
                                "sandbox's, or the built-in ones' whole call); one that runs longer is its sample's "
                                "reward error, counted in reward_errors. None (the default): no limit, so a call that "
                                "never returns holds its step until the run is stopped.")
    reward_workers: int = Field(1, ge=1,
                                description="Threads (or processes, with reward_executor 'process') that compute "
                                            "rewards as samples finish, off the loop that feeds the engines "
                                            "(math_verify's checks run in its own worker process beneath them). With "
                                            "1, the counters a reward keeps (math_verify's timeouts) are attributed to "
                                            "the sample that moved them.")
    reward_executor: Literal["thread", "process"] = Field(
        "thread", description="Where reward functions run: 'thread' (worker threads; any function), or 'process' "
                              "(worker processes, so a CPU-bound Python reward does not hold the interpreter lock the "
                              "loop feeding the engines needs; the function must pickle: a module-level function, "
                              "given by import path). A reward that uses signals, as math-verify's own timeouts do "
                              "(verl's math_verify.compute_score), needs 'process': on a thread they fail, and verl's "
                              "wrapper then scores every response 0.")
    overlong_buffer: int | None = Field(
        None, ge=1,
        description="DAPO's overlong reward shaping (verl's reward_model.overlong_buffer.len): a response longer than "
                    "sampling.max_tokens - overlong_buffer tokens loses overlong_penalty x (its tokens past that) / "
                    "overlong_buffer of reward, overlong_penalty at max_tokens. None = off.")
    overlong_penalty: float = Field(1.0, ge=0, description="DAPO's overlong penalty factor (verl's "
                                                           "overlong_buffer.penalty_factor): the most a response at "
                                                           "max_tokens loses.")
    seed: int = Field(0, description="Engine seed (per-request seeds are not used: they break vLLM's CPU build).")
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = Field(
        "processed_logprobs", description="Which log-probs engines report: after temperature/top-k/top-p ('processed', "
                                          "what was sampled from) or of the raw model.")
    policy_version: int = Field(0, description="Policy (weights) version recorded on every segment.")
    weights_bucket_bytes: int = Field(
        1 << 30, ge=1, description="RolloutSession.update_weights: an update bigger than this many bytes of tensors "
                                   "goes to the engines in buckets of at most this size (a tensor bigger than it "
                                   "alone), so shared memory holds one bucket, not the model (as slime and verl send "
                                   "weights); one that fits goes in one block. Default 1 GiB. "
                                   "update_weights(bucket_bytes=...) overrides it for one call.")
    speculative: Literal["off", "ngram", "group"] = Field(
        "off", description="Speculative decoding in the vLLM engines: 'off'; 'ngram' (vLLM's n-gram lookup: drafts the "
                           "tokens that followed the sequence's last n-gram where it occurred before in the request's "
                           "own prompt and output, and verifies them in one pass); or 'group' (pdsr's drafter: the "
                           "same lookup in the responses of the sample's siblings that had finished when its segment "
                           "was launched, and in its own prompt and output; every occurrence of the longest matching "
                           "n-gram votes on each drafted token). Same outputs as 'off' up to float rounding. Off by "
                           "default: on CPU engines every method was slower than off. vLLM's 'suffix' is left out (it "
                           "needs Arctic Inference built from source). Conflicts with a speculative_config in an "
                           "engine's engine_args.")
    speculative_settings: SpeculativeSettings = Field(
        default_factory=SpeculativeSettings,
        description="Parameters of the speculative method (number of drafted tokens, n-gram window); ignored while "
                    "speculative is 'off'.")
    agent: AgentConfig = Field(
        default_factory=AgentConfig,
        description="Multi-turn rollouts: the agent function that runs each sample (turns of the model, tool results "
                    "and user turns between them, token-exact) and its limits (see docs/agents.md). Its function unset "
                    "= single-turn.")
    output: OutputConfig = Field(default_factory=OutputConfig, description="Outputs.")
    ray: RayConfig | None = Field(None, description="Run engines as Ray actors: when set, the automatic layout's "
                                                    "engines use backend 'ray', and engines listed with backend 'ray' "
                                                    "take their defaults from here (see docs/ray.md).")

    # partial rollout across steps (pdsr_sdk.dispatch.steps; step_groups, max_staleness, group_deadline above)
    steps: int | None = Field(None, ge=1, description="Multi-step run (`pdsr rollout --steps K`): K training steps "
                                                      "over a stream of the data's prompts, each step's end bumping "
                                                      "the policy version as a trainer's update would; unfinished "
                                                      "samples carry into the next step with their tokens, and the "
                                                      "last step drains. K counts the run's steps in all, those a "
                                                      "--resume finds on disk included. None = batch by batch.")
    over_provision: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="Multi-step: keep ceil(step_groups x (1 + over_provision)) groups in flight (carried + newly "
                    "launched); a step ends when step_groups groups are complete. With steps set, default 0 (each step "
                    "waits for its own groups). In the SDK, setting it makes RolloutSession.step stream.")

    renamed_keys: ClassVar[dict[str, str]] = {"fast_engines": "fast", "heavy_engines": "heavy"}

    @property
    def streaming(self) -> bool:
        """Whether steps stream (partial rollout): ``steps``, ``over_provision`` or ``filter_groups`` set."""
        return self.steps is not None or self.over_provision is not None or self.filter_groups is not None

    @model_validator(mode="after")
    def _engine_defaults_are_engine_keys(self, info: ValidationInfo) -> "RolloutConfig":
        """``engine_defaults`` holds an engine entry's keys: checked when the config is read, naming the file and
        the dotted key (``engine_defaults.max_num_seq``), not when the layout is built after the other checks."""
        validate_config(EngineSpec, {"name": "engine_defaults", "pool": "fast", **self.engine_defaults},
                        source=(info.context or {}).get("source"), prefix="engine_defaults")
        return self

    @field_validator("reward")
    @classmethod
    def _known_reward(cls, name: str | None) -> str | None:
        from pdsr_sdk.rollout.reward import REWARD_WORDS, REWARDS

        return None if name is None else REWARDS.check_name(name, also=REWARD_WORDS)

    @field_validator("speculative", mode="before")
    @classmethod
    def _known_speculative(cls, method: Any) -> Any:
        if method is False:
            return "off"   # YAML 1.1 reads a bare `speculative: off` as false
        if method is True:
            raise ConfigValueError(f"speculative is true (YAML reads a bare on, yes or true so); name a method: "
                                   f"{', '.join(m for m in SPECULATIVE_METHODS if m != 'off')}")
        if method not in SPECULATIVE_METHODS:
            raise ConfigValueError(unknown_speculative(method))
        return method

    def _own_speculative_configs(self) -> list[str]:
        """Where a vLLM ``speculative_config`` is passed through engine_args (the keys, as a config names them)."""
        given = [f"engines[{i}].engine_args.speculative_config" for i, spec in enumerate(self.engines or ())
                 if "speculative_config" in spec.engine_args]
        defaults_args = self.engine_defaults.get("engine_args")
        if isinstance(defaults_args, dict) and "speculative_config" in defaults_args:
            given.append("engine_defaults.engine_args.speculative_config")
        return given

    @model_validator(mode="after")
    def _one_speculative_config(self) -> "RolloutConfig":
        """``speculative`` and a vLLM ``speculative_config`` passed through engine_args would fight: one of them."""
        if self.speculative == "off":
            return self
        given = self._own_speculative_configs()
        if given:
            raise ConfigValueError(f"speculative ({self.speculative!r}) and {given[0]} are both set; set one of "
                                   f"them (speculative builds vLLM's speculative_config)")
        return self

    @model_validator(mode="after")
    def _min_p_sampled(self) -> "RolloutConfig":
        """vLLM (0.32) has no min-p processor in an engine with a speculative_config and refuses each request with
        min_p there: every sample would fail, once the engines had started."""
        if not self.sampling.min_p:
            return self
        given = [f"speculative ({self.speculative!r})"] if self.speculative != "off" else []
        given += self._own_speculative_configs()
        if given:
            raise ConfigValueError(f"sampling.min_p ({self.sampling.min_p}) and {given[0]} are both set: vLLM "
                                   f"refuses min_p in an engine with speculative decoding (every request would "
                                   f"fail); set sampling.min_p to 0 or turn speculation off")
        return self

    @model_validator(mode="after")
    def _history_file_drafted(self) -> "RolloutConfig":
        """A draft history file is read only by ``group`` with history kept: anything else would ignore it."""
        spec = self.speculative_settings
        if spec.history_file is None:
            return self
        if self.speculative != "group":
            raise ConfigValueError(f"speculative_settings.history_file is drafted from by speculative 'group' only, "
                                   f"and speculative is {self.speculative!r}")
        if spec.history_responses == 0:
            raise ConfigValueError("speculative_settings.history_file is given and speculative_settings."
                                   "history_responses is 0 (keep no history); set it above 0")
        return self

    @model_validator(mode="after")
    def _agent_never_restarted(self) -> "RolloutConfig":
        """A multi-turn sample is never restarted (its agent holds the conversation): partial rollout with an
        agent runs without a staleness bound (or on-policy dynamic sampling, which drops instead)."""
        if self.agent.function is not None:
            check_agent_streaming(self.max_staleness, self.filter_groups is not None)
        return self

    @model_validator(mode="after")
    def _penalties_in_one_request(self) -> "RolloutConfig":
        check_output_penalties(self.sampling, segments=self.segments.enabled, steps=self.steps is not None,
                               agent=self.agent.function is not None)
        return self

    def vllm_speculative_config(self) -> dict[str, Any] | None:
        """vLLM's ``speculative_config`` the engines get (None with speculative 'off')."""
        return self.speculative_settings.vllm_config(self.speculative)

    @model_validator(mode="after")
    def _stream_keys(self) -> "RolloutConfig":
        if self.overlong_buffer is not None and self.overlong_buffer > self.sampling.max_tokens:
            raise ConfigValueError(f"overlong_buffer ({self.overlong_buffer}) must be at most sampling.max_tokens "
                                   f"({self.sampling.max_tokens}): shaping starts overlong_buffer tokens before the "
                                   "cap")
        if self.overlong_buffer is not None and self.reward == "none":   # it would shape nothing, silently
            raise ConfigValueError("overlong_buffer shapes the scores of a reward function (and an agent's own reward "
                                   "beside one): set a reward (reward is 'none'), or leave overlong_buffer out")
        if self.filter_groups is not None and self.reward == "none":
            raise ConfigValueError("filter_groups filters groups by their rewards: set a reward (reward is 'none')")
        if not self.streaming:
            for key in ("step_groups", "max_staleness", "group_deadline"):
                if getattr(self, key) is not None:
                    raise ConfigValueError(f"{key} applies to multi-step runs only; set steps too, or over_provision")
            if self.update != "all":
                raise ConfigValueError("update applies to multi-step runs only; set steps too, or over_provision")
        return self

    @classmethod
    def upgrade(cls, data: dict[str, Any], source: str | Path | None = None, *, saved: bool = False) -> dict[str, Any]:
        """Also the old ``policy: {name, settings}`` section -> ``policy`` and ``policy_settings.<name>``."""
        data = super().upgrade(data, source, saved=saved)
        old = data.get("policy")
        if not isinstance(old, dict):
            return data
        unknown = sorted(set(old) - {"name", "settings"})
        if unknown:
            raise ConfigError(f"{source or 'config'}: policy.{unknown[0]}: unknown config key; 'policy' is a "
                              f"policy name, and its settings go in policy_settings.<name>")
        name = old.get("name", cls.model_fields["policy"].default)
        data.pop("policy")
        if "name" in old:
            deprecated_key("policy.name", "policy", source)
            data["policy"] = name
        if old.get("settings") is not None:
            if not isinstance(old["settings"], dict):
                raise ConfigError(f"{source or 'config'}: policy.settings: expected a mapping of policy settings")
            deprecated_key("policy.settings", f"policy_settings.{name}", source)
            merged = dict(data.get("policy_settings") or {})
            merged[name] = {**old["settings"], **(merged.get(name) or {})}
            data["policy_settings"] = merged
        return data

