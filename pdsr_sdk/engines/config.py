"""Configuration of one engine (:class:`EngineSpec`), of Ray engine actors (:class:`RayConfig`) and of
speculative decoding (:class:`SpeculativeSettings`, the parameters of ``RolloutConfig.speculative``).

``pdsr rollout``'s config lists engines with these (:mod:`pdsr_sdk.rollout.config` re-exports them);
the engine backends build themselves from an :class:`EngineSpec`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.errors import ConfigValueError

#: speculative decoding methods pdsr runs (``speculative``), and vLLM's that pdsr leaves out (each with why)
SPECULATIVE_METHODS = ("off", "ngram", "group")
SPECULATIVE_LEFT_OUT = {
    "suffix": "vLLM's suffix decoding needs Arctic Inference, which PyPI has only as source to build (C++20, CMake, "
              "nanobind, and a PyTorch in its build environment), so pdsr's install does not include it; with "
              "arctic-inference built and installed yourself, pass vLLM's speculative_config {'method': 'suffix'} "
              "in an engine's engine_args",
}
#: vLLM loads pdsr's group drafter by this import path (pdsr_sdk/engines/group_drafter.py; a string: no import here)
GROUP_PROPOSER = "pdsr_sdk.engines.group_drafter.GroupProposer"
#: the end of the batch-size schedule's last range (vLLM clips it to the engine's max_num_seqs)
NO_BATCH_LIMIT = 1 << 20


class RayConfig(ConfigModel):
    """Ray: engines as Ray actors (backend 'ray'). Engine-level keys may be overridden per engine."""

    address: str = Field("auto", description="Ray cluster: 'auto' (the cluster this machine joined with `ray start`), "
                                             "'local' (start a one-machine cluster in this process), a head address "
                                             "'host:6379', or a Ray Client address 'ray://host:10001'. Ignored when "
                                             "Ray is already initialised in this process.")
    namespace: str | None = Field(None, description="Ray namespace of the engine actors (also where your own process "
                                                    "called ray.init); default: the connection's, an anonymous one for "
                                                    "this run where pdsr connects.")
    local_num_cpus: int | None = Field(
        None, ge=1,
        description="With address 'local': logical CPUs of the started cluster (default: this machine's count).")
    num_cpus: float = Field(1.0, ge=0, description="Logical CPUs Ray reserves for each engine actor.")
    num_gpus: float | None = Field(None, ge=0, description="GPUs per tensor-parallel rank of each engine; default: 1 "
                                                           "when the cluster has GPUs, else 0.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources each engine needs, e.g. {'heavy_node': 1} to keep "
                                          "heavy engines on nodes started with --resources='{\"heavy_node\": 8}'.")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "STRICT_PACK",
        description="Placement-group strategy for the GPUs of a tensor-parallel engine (tensor_parallel_size > 1, one "
                    "bundle per GPU); STRICT_PACK keeps them on one node.")
    scheduling_strategy: Literal["DEFAULT", "SPREAD"] = Field(
        "DEFAULT", description="How engine actors without a placement group are spread over nodes: Ray's DEFAULT "
                               "(fills nodes) or SPREAD (different nodes first).")
    env_vars: dict[str, str] = Field(
        default_factory=dict, description="Environment variables of the engine actors (Ray runtime_env env_vars), e.g. "
                                          "NCCL_SOCKET_IFNAME, HF_HUB_OFFLINE, VLLM_CPU_OMP_THREADS_BIND.")
    placement_timeout_s: float = Field(
        300.0, gt=0, description="Longest wait for Ray to find resources for an engine (its actor scheduled, its "
                                 "placement group ready); then the run stops with an error naming what was missing.")


class EngineSpec(ConfigModel):
    """One engine (one vLLM instance) and the pool it serves."""

    name: str = Field(description="Unique engine name, used in logs, errors and the trajectories' segment records.")
    pool: str = Field(description="Pool this engine serves: 'fast' or 'heavy', a role the policy gives it (e.g. v2.5 "
                                  "sends long prompts to 'heavy'); the automatic layout starts engines of both pools "
                                  "with the same settings.")
    backend: str = Field("vllm", description="Engine backend: 'vllm' (local process), 'ray' (Ray actor), 'sim' "
                                             "(simulated), or an import path.")
    devices: list[int] = Field(
        default_factory=list, description="GPU ids for this engine (CUDA_VISIBLE_DEVICES); on the CPU build, the CPU "
                                          "cores its threads are bound to (on its node, for Ray engines). Empty = "
                                          "automatic. Ray engines on GPUs get their GPUs from Ray.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine (tensor parallel).")
    max_num_seqs: int = Field(64, ge=1, description="Most requests running at once on this engine.")
    max_model_len: int = Field(4096, ge=16, description="Longest context (prompt + response) this engine accepts.")
    kv_cache_gib: float | None = Field(
        None, gt=0, description="KV-cache size in GiB on the CPU build (VLLM_CPU_KVCACHE_SPACE); default 1.")
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Fraction of GPU memory vLLM may use (GPU builds).")
    dtype: str = Field("auto", description="Model dtype for vLLM ('auto', 'bfloat16', 'float16', 'float32'). 'auto' on "
                                           "the CPU build: bfloat16 where the CPU computes in bf16 natively (flags "
                                           "avx512_bf16 or amx_bf16), else float32 (bf16 is emulated and slower "
                                           "there); on GPUs, vLLM's choice.")
    segment_capacity_tokens: int = Field(
        8192, ge=1, description="Total_Token_Capacity of the segment formula for this engine.")
    warmup_tokens: int = Field(4, ge=0, description="Tokens generated by one throw-away request when the engine "
                                                    "starts, so one-time costs of the first sampling step with "
                                                    "log-probs (seconds on the CPU build) are paid at start-up, not "
                                                    "inside the first batch's timings; 0 = no warm-up.")
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra vLLM engine arguments (keys of vLLM's AsyncEngineArgs) passed through unchanged, e.g. "
                    "{'max_num_batched_tokens': 8192, 'kv_cache_dtype': 'fp8', 'enable_sleep_mode': true}; a key vLLM "
                    "does not take is an error naming it, and so is one pdsr sets from its own settings (model, "
                    "tokenizer, seed, logprobs_mode, max_model_len, max_num_seqs, tensor_parallel_size, "
                    "worker_extension_cls), checked when the engines are built, before any starts.")
    ray: RayConfig | None = Field(None, description="Ray settings of this engine (backend 'ray'); keys not given here "
                                                    "come from the run's top-level 'ray' section (env_vars and "
                                                    "resources are added to the run's).")


class SpeculativeSettings(ConfigModel):
    """Parameters of speculative decoding (used when ``speculative`` is not 'off'); not tuned yet."""

    num_speculative_tokens: int = Field(
        4, ge=1, description="Tokens drafted per request per step, all verified in one forward pass (vLLM's "
                             "num_speculative_tokens).")
    prompt_lookup_min: int = Field(2, ge=1, description="Shortest n-gram at the end of the sequence that is looked up: "
                                                        "by ngram in the request's own prompt and output (vLLM's "
                                                        "prompt_lookup_min), by group in the finished siblings' "
                                                        "responses as well.")
    prompt_lookup_max: int = Field(4, ge=1, description="Longest such n-gram, tried first (vLLM's prompt_lookup_max; "
                                                        "group uses it the same way).")
    max_batch_size: int | None = Field(
        32, ge=1, description="Draft only while the engine runs at most this many sequences (vLLM's "
                              "num_speculative_tokens_per_batch_size; none drafts at any batch size). 32: on an H100 "
                              "checking 4 drafted tokens costs 1.22 decode steps at batch 32 and 1.36 at 128 "
                              "(bench/verify_cost.py), while a verify step in a step's tail yields 1.2-1.5 tokens "
                              "(bench/spec.py).")
    history_responses: int = Field(8, ge=0, description="group: besides the finished siblings, draft from up to this "
                                                        "many of the most recent responses to the same prompt (the "
                                                        "same prompt token ids) in groups the session finished before "
                                                        "(earlier steps: older weights); 0 = siblings only.")
    history_tokens: int | None = Field(
        1 << 30, ge=1, description="group: at most this many response tokens kept in that history over every prompt (4 "
                                   "bytes each: the default, 2^30, is 4 GiB), the prompts recorded least recently "
                                   "dropped first; null = no bound (in training the dataset bounds it, under serve "
                                   "every distinct request prompt adds to it).")
    history_file: str | None = Field(None, description="group: a trajectories file (a pdsr rollout output, e.g. the "
                                                       "previous run's) whose responses count as earlier responses to "
                                                       "their prompts, before any of this session's; its failed and "
                                                       "dropped samples are skipped.")

    @model_validator(mode="after")
    def _window(self) -> "SpeculativeSettings":
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigValueError(f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= prompt_lookup_max "
                                   f"({self.prompt_lookup_max})")
        return self

    def vllm_config(self, method: str) -> dict[str, Any] | None:
        """vLLM's ``speculative_config`` for ``method`` (None for 'off': the engine arguments stay as they were)."""
        if method == "off":
            return None
        if method not in ("ngram", "group"):
            raise ConfigValueError(unknown_speculative(method))
        out: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": self.num_speculative_tokens,
                               "prompt_lookup_min": self.prompt_lookup_min, "prompt_lookup_max": self.prompt_lookup_max}
        if method == "group":
            # vLLM zeroes prompt_lookup_* for a custom_class proposer; the engine reads them here and sends them
            # with each request's corpus (group_drafter.group_extra_args)
            out.update(method="custom_class", model=GROUP_PROPOSER)
        if self.max_batch_size is not None:
            # vLLM's scheduler passes ngram the drafted-token count for the running batch; a custom_class proposer
            # is passed none, so group's proposer reads the same schedule (GroupProposer.k_for)
            out["num_speculative_tokens_per_batch_size"] = [[1, self.max_batch_size, self.num_speculative_tokens],
                                                            [self.max_batch_size + 1, NO_BATCH_LIMIT, 0]]
        return out


def unknown_speculative(method: object) -> str:
    """The error for a ``speculative`` value pdsr does not run (one of vLLM's left out says why)."""
    if method in SPECULATIVE_LEFT_OUT:
        return (f"speculative {method!r} is not available: {SPECULATIVE_LEFT_OUT[method]}; valid values: "
                f"{', '.join(SPECULATIVE_METHODS)}")
    return f"unknown speculative method {method!r}; valid values: {', '.join(SPECULATIVE_METHODS)}"
