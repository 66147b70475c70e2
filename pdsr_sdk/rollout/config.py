"""Configuration of ``pdsr rollout`` (one pydantic model per section)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from pdsr_sdk.config import ConfigModel


class SamplingConfig(ConfigModel):
    """How each response is sampled."""

    n: int = Field(8, ge=1, description="Samples per prompt (the GRPO group size N). Sample 0 is the probe.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature; 0 = greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Top-k sampling; 0 disables it.")
    max_tokens: int = Field(1024, ge=1, description="Most response tokens per sample (finish reason 'length' past it).")
    stop: list[str] = Field(default_factory=list, description="Stop strings that end a response.")
    ignore_eos: bool = Field(False, description="Keep generating past EOS until max_tokens (benchmarks).")


class SegmentConfig(ConfigModel):
    """Budget-aware dynamic segments: L_next = clamp(capacity / n_active, min_tokens, max_tokens)."""

    enabled: bool = Field(True, description="Generate in segments; if false each request runs to its end (or cap) in one go.")
    min_tokens: int = Field(64, ge=1, description="L_min: shortest segment (many active requests).")
    max_tokens: int = Field(4096, ge=1, description="L_max: longest segment (the last few requests).")

    @model_validator(mode="after")
    def _ordered(self) -> "SegmentConfig":
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        return self


class RayConfig(ConfigModel):
    """Ray: engines as Ray actors (backend 'ray'). Engine-level keys may be overridden per engine."""

    address: str = Field("auto", description="Ray cluster: 'auto' (the cluster this machine joined with `ray start`), 'local' (start a one-machine cluster in this process), a head address 'host:6379', or a Ray Client address 'ray://host:10001'. Ignored when Ray is already initialised in this process.")
    namespace: str | None = Field(None, description="Ray namespace of the engine actors; default: an anonymous one for this run.")
    local_num_cpus: int | None = Field(None, ge=1, description="With address 'local': logical CPUs of the started cluster (default: this machine's count).")
    num_cpus: float = Field(1.0, ge=0, description="Logical CPUs Ray reserves for each engine actor.")
    num_gpus: float | None = Field(None, ge=0, description="GPUs per tensor-parallel rank of each engine; default: 1 when the cluster has GPUs, else 0.")
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources each engine needs, e.g. {'heavy_node': 1} to keep heavy engines on nodes started with --resources='{\"heavy_node\": 8}'.")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field("STRICT_PACK", description="Placement-group strategy for the GPUs of a tensor-parallel engine (tensor_parallel_size > 1, one bundle per GPU); STRICT_PACK keeps them on one node.")
    scheduling_strategy: Literal["DEFAULT", "SPREAD"] = Field("DEFAULT", description="How engine actors without a placement group are spread over nodes: Ray's DEFAULT (fills nodes) or SPREAD (different nodes first).")
    env_vars: dict[str, str] = Field(default_factory=dict, description="Environment variables of the engine actors (Ray runtime_env env_vars), e.g. NCCL_SOCKET_IFNAME, HF_HUB_OFFLINE, VLLM_CPU_OMP_THREADS_BIND.")
    placement_timeout_s: float = Field(300.0, gt=0, description="Longest wait for Ray to find resources for an engine (its actor scheduled, its placement group ready); then the run stops with an error naming what was missing.")


class EngineSpec(ConfigModel):
    """One engine (one vLLM instance) and the pool it serves."""

    name: str = Field(description="Unique engine name, used in logs, errors and the trajectories' segment records.")
    pool: str = Field(description="Pool this engine serves: 'fast' (high concurrency, token cap) or 'heavy' (long context).")
    backend: str = Field("vllm", description="Engine backend: 'vllm' (local process), 'ray' (Ray actor), 'sim' (simulated), or an import path.")
    devices: list[int] = Field(default_factory=list, description="GPU ids for this engine (CUDA_VISIBLE_DEVICES); on the CPU build, the CPU cores its threads are bound to (on its node, for Ray engines). Empty = automatic. Ray engines on GPUs get their GPUs from Ray.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine (tensor parallel).")
    max_num_seqs: int = Field(64, ge=1, description="Most requests running at once on this engine.")
    max_model_len: int = Field(4096, ge=16, description="Longest context (prompt + response) this engine accepts.")
    kv_cache_gib: float | None = Field(None, gt=0, description="KV-cache size in GiB on the CPU build (VLLM_CPU_KVCACHE_SPACE); default 1.")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Fraction of GPU memory vLLM may use (GPU builds).")
    dtype: str = Field("auto", description="Model dtype for vLLM ('auto', 'bfloat16', 'float16', 'float32').")
    segment_capacity_tokens: int = Field(8192, ge=1, description="Total_Token_Capacity of the segment formula for this engine.")
    warmup_tokens: int = Field(4, ge=0, description="Tokens generated by one throw-away request when the engine starts, so one-time costs of the first sampling step with log-probs (seconds on the CPU build) are paid at start-up, not inside the first batch's timings; 0 = no warm-up.")
    engine_args: dict[str, Any] = Field(default_factory=dict, description="Extra vLLM engine arguments passed through unchanged (e.g. {'enable_chunked_prefill': true}).")
    ray: RayConfig | None = Field(None, description="Ray settings of this engine (backend 'ray'); keys not given here come from the run's top-level 'ray' section (env_vars and resources are added to the run's).")


class DataConfig(ConfigModel):
    """Where prompts come from."""

    path: Path | None = Field(None, description="Parquet or JSONL file of prompts; default: the built-in sample prompts.")
    prompt_column: str | None = Field(None, description="Column with the prompt text; default: the first of 'prompt', 'problem', 'question' present.")
    messages_column: str | None = Field(None, description="Column with chat messages (a list of {role, content}); used instead of prompt_column.")
    id_column: str | None = Field(None, description="Column with a unique prompt id; default: 'id'/'unique_id'/'prompt_id' if present, else the row number.")
    ground_truth_column: str | None = Field(None, description="Column with the reference answer for the reward; default: 'answer' or 'ground_truth' if present.")
    apply_chat_template: bool = Field(True, description="Wrap prompts with the tokenizer's chat template (when it has one).")
    system_prompt: str | None = Field(None, description="System message prepended when applying the chat template.")
    limit: int | None = Field(None, ge=1, description="Use only the first N prompts.")
    target_lengths_column: str | None = Field(None, description="Column of per-sample response lengths to force (length-controlled replay, needs ignore_eos).")


class PolicyConfig(ConfigModel):
    """The dispatch policy and its settings."""

    name: str = Field("v2.5", description="Policy name ('baseline', 'v1', 'v2', 'v2.5', or 'package.module:Class'), or a preset in policies/.")
    settings: dict[str, Any] = Field(default_factory=dict, description="The policy's own settings; see schemas/policy-<name>.schema.json.")


class OutputConfig(ConfigModel):
    """Where trajectories and the summary go."""

    path: Path = Field(Path("runs/rollout.parquet"), description="Trajectories Parquet file (one row per sample).")
    summary_path: Path | None = Field(None, description="Run summary JSON; default: <path without suffix>.summary.json.")
    resume: bool = Field(False, description="Skip prompt groups already finished in the output (after an interrupted run).")
    overwrite: bool = Field(False, description="Replace an existing output instead of failing.")
    flush_groups: int = Field(16, ge=1, description="Write finished groups to disk at least every this many groups.")
    flush_interval_s: float = Field(10.0, gt=0, description="... or at least this often (seconds).")


class RolloutConfig(ConfigModel):
    """``pdsr rollout``: generate GRPO groups with a P-DSR dispatch policy."""

    model: str | None = Field(None, description="Local model directory (Hugging Face format); default: the built-in tiny random model.")
    tokenizer: str | None = Field(None, description="Tokenizer directory if not the model's.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompt source.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling settings.")
    batch_size: int = Field(128, ge=1, description="Prompts per batch (B); a batch is one GRPO step's rollout.")
    num_batches: int | None = Field(None, ge=1, description="Stop after this many batches.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="Dispatch policy.")
    engines: list[EngineSpec] | None = Field(None, description="Explicit engine list; default: an automatic layout from fast_engines/heavy_engines.")
    fast_engines: int | None = Field(None, ge=0, description="Engines in the fast pool for the automatic layout (default: most devices).")
    heavy_engines: int | None = Field(None, ge=0, description="Engines in the heavy pool for the automatic layout (default: 1 per 4 devices, at least 1).")
    engine_defaults: dict[str, Any] = Field(default_factory=dict, description="Settings applied to every automatically laid-out engine (keys of an engine entry).")
    segments: SegmentConfig = Field(default_factory=SegmentConfig, description="Budget-aware dynamic segments.")
    reward: str | None = Field("auto", description="Reward: 'math_boxed', 'none', an import path 'pkg.mod:fn', or 'auto' (math_boxed when a ground truth exists).")
    seed: int = Field(0, description="Engine seed (per-request seeds are not used: they break vLLM's CPU build).")
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = Field("processed_logprobs", description="Which log-probs engines report: after temperature/top-k/top-p ('processed', what was sampled from) or of the raw model.")
    policy_version: int = Field(0, description="Policy (weights) version recorded on every segment.")
    output: OutputConfig = Field(default_factory=OutputConfig, description="Outputs.")
    ray: RayConfig | None = Field(None, description="Run engines as Ray actors: when set, the automatic layout's engines use backend 'ray', and engines listed with backend 'ray' take their defaults from here (see docs/ray.md).")
