"""Configs of ``pdsr simulate``: engine profiles (the cost model's numbers) and the run itself.

Default profiles are illustrative, GPU-like numbers for a ~7B model on one
modern GPU, not measurements: a fixed per-step cost ``c0`` of 5 ms (kernel
launches, sampling, scheduling), 0.05 ms per running sequence, 1e-7 s per
context token read by attention (256 sequences x 1,000 tokens add 26 ms), and
2e-5 s per prefill token (50k tokens/s). ``pdsr simulate calibrate`` fits real
ones from a ``pdsr rollout`` run.

Engines are equal by default: every engine, fast or heavy, gets the same
profile (256 sequences, 262,144 KV tokens); "heavy" is a role a policy gives
some engines, not bigger hardware (a policy may run its heavy engines with
fewer sequences as one of its own settings; baseline runs every engine at the
profile's limits). A profile file, a config or ``--profile`` may still give a
pool other numbers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from pdsr_sdk.config import ConfigModel, validate_config
from pdsr_sdk.dispatch.config import SegmentConfig, StepStreamConfig
from pdsr_sdk.errors import ConfigError, ConfigValueError
from pdsr_sdk.io.paths import UserPath
from pdsr_sdk.policies.choice import PolicyChoice

#: cost/KV keys of a profile (the rest mirror EngineSpec's fields of the same name)
COST_KEYS = ("c0_s", "c1_s_per_seq", "c2_s_per_token", "prefill_s_per_token")


#: a verify step's cost relative to a decode step, by running requests, checking 4 drafted tokens a request:
#: measured on one H100 (one 7B-shaped layer at context 2048, CUDA graphs; bench/verify_cost.py, 2026-11-27)
H100_VERIFY_COST_K4: list[tuple[int, float]] = [(1, 1.08), (8, 1.15), (32, 1.22), (128, 1.36), (256, 1.41)]


class SpeculationProfile(ConfigModel):
    """Speculative decoding in a simulated engine: while few requests run, a step checks drafted tokens and
    yields more than one token per request, for a dearer step."""

    tokens_per_step: float = Field(
        1.0, ge=1.0, allow_inf_nan=False,
        description="Tokens a step yields per running request while drafting is on: 1 plus the drafted tokens accepted "
                    "per step, the steps that drafted nothing included (bench/spec.py: tokens / (tokens - accepted)). "
                    "1 = no gain.")
    draft_load: float = Field(
        1.0, ge=0.0, le=1.0, description="Drafted tokens per request and step, as a share of num_speculative_tokens: a "
                                         "verify step's extra cost over a decode step (verify_cost - 1) scales with "
                                         "it. 1: every step drafts them all; a drafter that often finds nothing drafts "
                                         "far less (bench/spec.py: 0.05-0.15 in a SmolLM2 tail).")
    verify_cost: list[tuple[int, float]] = Field(
        default_factory=lambda: list(H100_VERIFY_COST_K4),
        description="A verify step's cost relative to a plain decode step, as [running requests, factor] pairs, "
                    "interpolated linearly between them and held flat past the ends; default: 4 drafted tokens on one "
                    "H100, measured by bench/verify_cost.py.")
    max_batch: int = Field(32, ge=0, description="Drafting runs only while at most this many requests run on the "
                                                 "engine (verl's MTP lost about half its throughput at high batch); "
                                                 "above it steps are plain.")
    num_speculative_tokens: int = Field(
        4, ge=1, description="Tokens a full draft holds (k): verify_cost is for drafts of k tokens, and the drafted "
                             "tokens a span reports are draft_load x k a verify step.")
    by_position: list[tuple[int, float, float]] | None = Field(
        None, description="Acceptance along the response, as [first response position of a bin, tokens_per_step, "
                          "draft_load] rows from position 0 up (bench/spec.py's by_position); past the last row's "
                          "start its values hold. None: tokens_per_step and draft_load at every position.")
    by_position_and_siblings: list[tuple[int, int, float, float]] | None = Field(
        None, description="Acceptance by position bin and by the siblings finished when the request was launched, as "
                          "[bin start (one of by_position's), finished siblings, tokens_per_step, draft_load] rows "
                          "(bench/spec.py's joint table); a request whose cell is missing takes its by_position row.")

    @model_validator(mode="after")
    def _sorted(self) -> "SpeculationProfile":
        sizes = [b for b, _ in self.verify_cost]
        if not sizes or sizes != sorted(set(sizes)) or any(not 0 < f < math.inf for _, f in self.verify_cost):
            raise ConfigValueError("speculation.verify_cost: give [running, factor] pairs with increasing running "
                                   f"counts and finite positive factors, got {self.verify_cost}")
        rows = self.by_position
        if rows is not None:
            starts = [p for p, _, _ in rows]
            if (not rows or starts[0] != 0 or starts != sorted(set(starts))
                    or any(not 1.0 <= y < math.inf or not 0.0 <= d <= 1.0 for _, y, d in rows)):
                raise ConfigValueError("speculation.by_position: give [position, tokens_per_step, draft_load] rows "
                                       "with positions increasing from 0, tokens_per_step >= 1 and draft_load in "
                                       f"[0, 1], got {rows}")
        joint = self.by_position_and_siblings
        if joint is not None:
            starts = {p for p, _, _ in rows or ()}
            if not starts or any(p not in starts or f < 0 or not 1.0 <= y < math.inf or not 0.0 <= d <= 1.0
                                 for p, f, y, d in joint):
                raise ConfigValueError("speculation.by_position_and_siblings: give [bin start, finished siblings, "
                                       "tokens_per_step, draft_load] rows whose starts are by_position's (which it "
                                       f"needs), finished >= 0, tokens_per_step >= 1, draft_load in [0, 1]; got "
                                       f"{joint}")
        return self

    @property
    def position_width(self) -> int:
        """Steps between re-reads of the running requests' positions: the first bin's width (by_position)."""
        rows = self.by_position or []
        return rows[1][0] - rows[0][0] if len(rows) > 1 else 1 << 30


class EngineProfile(ConfigModel):
    """One simulated engine: limits (named as in EngineSpec) and the step-time cost model.

    ``t_step = c0_s + c1_s_per_seq * running + c2_s_per_token * context_tokens_in_batch
    + prefill_s_per_token * prefill_tokens``.
    """

    max_num_seqs: int = Field(256, ge=1, description="Most requests running at once (EngineSpec.max_num_seqs).")
    max_model_len: int = Field(32768, ge=16, description="Longest context (prompt + response) a request may reach; "
                                                         "longer ones are an error (EngineSpec.max_model_len).")
    segment_capacity_tokens: int = Field(
        8192, ge=1, description="Total_Token_Capacity of the segment formula (EngineSpec.segment_capacity_tokens).")
    kv_cache_tokens: int = Field(262144, ge=16, description="KV-cache capacity in tokens (rounded down to whole "
                                                            "blocks). When the running requests need more, the newest "
                                                            "is preempted and later recomputed.")
    block_size: int = Field(16, ge=1, description="KV-cache block size in tokens (vLLM's default 16); capacity and the "
                                                  "prefix cache are block-granular.")
    c0_s: float = Field(
        5e-3, gt=0, allow_inf_nan=False,
        description="Fixed seconds per decode step (illustrative default; calibrate for real numbers).")
    c1_s_per_seq: float = Field(5e-5, ge=0, allow_inf_nan=False, description="Seconds per step per running sequence.")
    c2_s_per_token: float = Field(
        1e-7, ge=0, allow_inf_nan=False,
        description="Seconds per step per context token in the batch (attention reads).")
    prefill_s_per_token: float = Field(
        2e-5, ge=0, allow_inf_nan=False,
        description="Seconds per prefilled (uncached) context token, added to the step that admits the request.")
    speculation: SpeculationProfile | None = Field(
        None, description="Speculative decoding in this engine (None: off): how many tokens a verify step yields, what "
                          "it costs by batch size, and the batch size up to which drafting runs.")
    prompt_cache: bool = Field(True, description="Requests of one prompt share its KV blocks, as vLLM's prefix caching "
                                                 "does (pdsr starts its engines with it): a request admitted while "
                                                 "another of the same prompt runs on the engine prefills only what "
                                                 "lies past the prompt's whole blocks. A group's samples on one engine "
                                                 "thus pay the prompt's prefill about once.")

    @model_validator(mode="after")
    def _fits(self) -> "EngineProfile":
        if self.kv_cache_tokens < self.block_size:
            raise ConfigValueError(f"kv_cache_tokens ({self.kv_cache_tokens}) must hold at least one block "
                                   f"({self.block_size} tokens)")
        return self

    @property
    def kv_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size

    @property
    def max_context(self) -> int:
        """The longest context one request can reach: ``max_model_len``, and the whole blocks of the KV cache."""
        return min(self.max_model_len, self.kv_blocks * self.block_size)

    @classmethod
    def from_spec(cls, spec, base: "EngineProfile | None" = None) -> "EngineProfile":
        """A profile from an :class:`EngineSpec` (``backend: sim``): its limits, plus cost keys from
        ``spec.engine_args`` (over ``base`` or the pool's default)."""
        start = base or default_profile(spec.pool)
        data = start.model_dump()
        data.update(max_num_seqs=spec.max_num_seqs, max_model_len=spec.max_model_len,
                    segment_capacity_tokens=spec.segment_capacity_tokens)
        data.update(spec.engine_args)
        return validate_config(cls, data, prefix=f"engines[{spec.name}].engine_args")


def default_profile(pool: str) -> EngineProfile:
    """The documented default profile of a pool: the same for every pool (equal engines; heavy is a role):
    256 sequences, 262,144 KV tokens."""
    return EngineProfile(max_num_seqs=256, kv_cache_tokens=262144)


class SimProfiles(ConfigModel):
    """Engine profiles of the two pools (equal engines by default; heavy is a role, not bigger hardware)."""

    fast: EngineProfile = Field(
        default_factory=lambda: default_profile("fast"),
        description="Profile of every fast-pool engine (default: 256 sequences, 262,144 KV tokens, the same as heavy).")
    heavy: EngineProfile = Field(
        default_factory=lambda: default_profile("heavy"),
        description="Profile of every heavy-pool engine (default: the fast profile, 256 sequences, 262,144 KV tokens: "
                    "equal engines; heavy is a role).")

    @model_validator(mode="before")
    @classmethod
    def _pool_defaults(cls, data: Any) -> Any:
        # a partial profile is completed from its own pool's defaults, not the class defaults
        if isinstance(data, dict):
            data = dict(data)
            for pool in ("fast", "heavy"):
                if isinstance(data.get(pool), dict):
                    data[pool] = {**default_profile(pool).model_dump(), **data[pool]}
        return data


class SimulateConfig(StepStreamConfig, PolicyChoice):
    """``pdsr simulate``: replay a length trace through dispatch policies on simulated engines."""

    simulation: ClassVar[bool] = True   # the reference schedules may be named (PolicyChoice)

    trace: UserPath | None = Field(None, description="Length trace (JSONL) or trajectories Parquet/Arrow file from "
                                                     "`pdsr rollout`. None: `pdsr simulate` uses a built-in synthetic "
                                                     "trace (`pdsr trace synth` defaults, cached; "
                                                     "`pdsr_sdk.traces.default_trace_path`).")
    policy: str = Field("v3", description="Policy name, preset or import path, or a comma-separated list; 'all' runs "
                                          "every registered policy that runs on real engines side by side. The "
                                          "simulator-only reference schedules (oracle, oracle-probe) may be named too.")
    references: bool | None = Field(None,
                                    description="Also run baseline (when missing) and the reference schedules oracle "
                                                "and oracle-probe, which the report's vs_baseline and share-of-gain "
                                                "columns need. null: on when more than one policy is selected.")
    policy_settings: dict[str, Any] = Field(
        default_factory=dict, description="Per-policy settings overrides, keyed by policy name: {'v2.5': "
                                          "{'cap_multiplier': 2.0}}; validated with the config, and carried as each "
                                          "policy's typed settings (schemas/policy-<name>.schema.json).")
    fast: int = Field(6, ge=0, description="Engines in the fast pool.")
    heavy: int = Field(2, ge=0, description="Engines in the heavy pool.")
    batch_size: int = Field(128, ge=1, description="Prompts per batch B; batches are consecutive groups of the trace, "
                                                   "run one after another (GRPO steps).")
    n: int | None = Field(None, ge=1,
                          description="Samples per prompt: the first n lengths of each group; default: all of them.")
    num_batches: int | None = Field(None, ge=1, description="Simulate only the first this many batches.")
    profiles: SimProfiles = Field(
        default_factory=SimProfiles, description="Engine profiles per pool (cost model, limits).")
    segments: SegmentConfig = Field(
        default_factory=SegmentConfig, description="Budget-aware dynamic segments (as in `pdsr rollout`).")
    tail_fraction: float = Field(
        0.1, gt=0, lt=1,
        description="The tail share measures the time spent on the last this fraction of each batch's samples.")
    hold_turn_slots: bool = Field(False, description="A trace of turns: every policy's samples keep their engine slot "
                                                     "while their environment works, as a framework that holds the "
                                                     "request through a tool call does (their KV blocks are not "
                                                     "counted against the cache). Default: a parked sample holds no "
                                                     "slot (pdsr); with references on, the report adds baseline so "
                                                     "held as the slot-holding reference.")
    out_dir: UserPath | None = Field(None, description="Directory for simulate.json (with steps: steps.json and the "
                                                       "curve's PNG) and the timeline PNG; none = print only.")
    timeline: bool = Field(True, description="Draw the engines x time occupancy timeline (needs out_dir; with steps, "
                                             "the engines record their occupancy only then).")
    # multi-step runs (partial rollout across steps; pdsr_sdk.sim.steps)
    steps: int | None = Field(None, ge=1,
                              description="Multi-step run: simulate this many training steps K over a stream of the "
                                          "trace's groups (in order), with over_provision groups in flight beyond each "
                                          "step's batch; unfinished groups carry into the next step. Reported next to "
                                          "the on-policy baseline at the same batch size. None = ordinary "
                                          "batch-by-batch simulation.")
    over_provision: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="Multi-step: keep ceil(step_groups x (1 + over_provision)) groups in flight (carried + newly "
                    "launched). None with steps set = the curve over 0, 0.25, 0.5 and 1.")
    trainer_s: float = Field(0.0, ge=0, description="Multi-step: seconds the trainer takes to train on one step's "
                                                    "groups before it updates the weights (virtual time; 0: the update "
                                                    "comes at the step's end). Without pipeline the engines stop for "
                                                    "it, as in a synchronous loop: a step's end aborts its running "
                                                    "samples (keeping their tokens) and they resume after the update. "
                                                    "The on-policy baseline's steps take it too.")
    weight_update_s: float = Field(0.0, ge=0, description="Multi-step: seconds the engines stop to load new weights at "
                                                          "each update (RolloutSession.update_weights); the on-policy "
                                                          "baseline's steps take it too.")
    pipeline: bool = Field(False, description="Multi-step: the trainer trains on step k while step k + 1 generates "
                                              "(one step off-policy, as examples/grpo_train.py --pipeline): its update "
                                              "lands in the middle of the next step (the engines stop keeping every "
                                              "token, load for weight_update_s, and go on under the new version), and "
                                              "no step ends before the update for its predecessor (a session's "
                                              "step(wait_for_update=True)), so token ages count at the weights the "
                                              "trainer trains with.")
    restart_lengths: Literal["replay", "redraw"] = Field(
        "redraw", description="Multi-step: the length a restarted sample (too stale, refreshed, or retried by its "
                              "policy) generates. redraw (the default): a fresh draw, as RL sampling makes one: the "
                              "response cap with the prompt's chance of reaching it (its group's share, shrunk toward "
                              "the trace's pooled share by a beta prior fitted to the trace: the pooled share itself "
                              "where runaways do not cluster by prompt), else one of its group's recorded lengths that "
                              "did not (pdsr_sdk.sim.redraw; on a real model a response that ran to the cap did again "
                              "49% of the times it was drawn afresh, where this predicted 52%: bench/recurrence.py). "
                              "replay: its recorded length again, as a length-controlled replay on real engines does "
                              "(bench/partial.py; a response that ran to the cap runs there again).")
    update: Literal["all", "staggered", "auto"] = Field(
        "all", description="Multi-step: how each update reaches the engines, as in a session: all (the default) or "
                           "staggered (StepStreamConfig.update). auto: run each over-provision value with both (with "
                           "max_partial_share, name the fastest of either within the budget).")
    max_partial_share: float | None = Field(
        None, gt=0, lt=1, description="Multi-step, with over_provision unset: run the curve over F = 0, 0.05, ..., "
                                      "0.5 (staggered runs also 0.75, 1, 1.25 and 1.5) instead of 0, 0.25, "
                                      "0.5 and 1, refine it by bisecting the groups in flight between the fastest F "
                                      "whose partial share (consumed tokens from responses carried across a weight "
                                      "update) is at most this and the next one over it, and name the fastest within:"
                                      " the over-provision to run within an off-policy budget. None: no search.")

    @model_validator(mode="after")
    def _engines(self) -> "SimulateConfig":
        if self.fast + self.heavy == 0:
            raise ConfigValueError("fast + heavy is 0: a simulation needs at least one engine")
        if self.steps is None:
            for key in ("over_provision", "step_groups", "max_staleness", "group_deadline", "filter_groups"):
                if getattr(self, key) is not None:
                    raise ConfigValueError(f"{key} applies to multi-step runs only; set steps too")
            for key in ("trainer_s", "weight_update_s", "pipeline"):
                if getattr(self, key):
                    raise ConfigValueError(f"{key} applies to multi-step runs only; set steps too")
            for key in ("restart_lengths", "kv_on_update", "update"):
                if key in self.model_fields_set:
                    raise ConfigValueError(f"{key} applies to multi-step runs only; set steps too")
            if self.max_partial_share is not None:
                raise ConfigValueError("max_partial_share applies to multi-step runs only; set steps too")
        elif self.num_batches is not None:
            raise ConfigValueError("num_batches applies to batch-by-batch runs only; with steps a run takes steps "
                                   "x step_groups groups (and more in flight): leave num_batches out")
        elif self.filter_groups is not None and "metric" in self.filter_groups.model_fields_set:
            raise ConfigValueError("filter_groups.metric chooses among a reward's values in pdsr rollout; the "
                                   "simulator compares the one reward per sample its trace records: leave it out")
        elif self.update != "all" and self.pipeline:
            raise ConfigValueError(f"update: {self.update}: a staggered update finishes responses under the "
                                   f"weights of the step that ended, with the engines stopped at its end: it needs "
                                   f"pipeline off")
        elif self.update == "auto" and self.max_staleness == 0:
            raise ConfigValueError("update: auto: a staggered update finishes responses under the weights of the step "
                                   "that ended, one version old: it needs max_staleness unset or at least 1")
        elif self.max_partial_share is not None and self.over_provision is not None:
            raise ConfigValueError("max_partial_share searches the over-provision: leave over_provision unset")
        return self

    @property
    def trained(self) -> bool:
        """Whether a multi-step run models the trainer (its time, the weight load, or pipelining)."""
        return self.pipeline or self.trainer_s > 0 or self.weight_update_s > 0


class CalibrateConfig(ConfigModel):
    """``pdsr simulate calibrate``: fit engine profiles from the segment timings of `pdsr rollout` runs."""

    trajectories: list[UserPath] = Field(
        default_factory=list, description="Trajectories Parquet/Arrow files written by `pdsr rollout` (their "
                                          "'segments' column).")
    out: UserPath | None = Field(None,
                                 description="Where to write the fitted profiles (YAML: {fast: {...}, heavy: {...}}).")
    overwrite: bool = Field(False,
                            description="Replace an existing output file (without it, an existing 'out' is an error).")
    block_size: int = Field(16, ge=1, description="KV block size of the engines that ran (prefix-cache granularity of "
                                                  "continuations).")
    iterations: int = Field(8, ge=1,
                            description="Refinement passes (step counts per interval re-estimated from the previous "
                                        "fit).")
    min_spans: int = Field(8, ge=1, description="A pool needs at least this many timed segments to be fitted.")
    per_pool: bool = Field(True, description="Fit each pool separately; false = one fit over all segments, written for "
                                             "every pool (engines of the same hardware and model).")
    speculation_max_batch: int | None = Field(
        None, ge=0, description="With speculation: the batch size up to which the run drafted, so that a span's "
                                "drafted tokens are placed where its engine ran at most that many (none: the runs' "
                                "summaries say, else every batch size).")


def load_profile_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a profile file ``{fast: {...}, heavy: {...}}`` (as written by calibrate) and validate each pool. A file
    giving one pool (calibrated on a run of one pool's engines) gives it to both: engines are equal unless told
    otherwise, and the other pool's illustrative GPU-like defaults would be seconds of another machine."""
    from pdsr_sdk.config import read_config_file

    data = read_config_file(path, "profile file")
    if not data:   # an empty file would run on the illustrative defaults while the user believes it measured
        raise ConfigError(f"{path}: no pool in the profile file; it maps 'fast' and/or 'heavy' to profile settings "
                          f"(`pdsr simulate calibrate` writes one)")
    unknown = sorted(set(data) - {"fast", "heavy"})
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: unknown pool; a profile file maps 'fast' and/or 'heavy' to "
                          f"profile settings")
    out = {}
    for pool, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: {pool}: expected a mapping of profile settings")
        merged = {**default_profile(pool).model_dump(), **values}
        validate_config(EngineProfile, merged, source=path, prefix=pool)
        out[pool] = dict(values)
    if len(out) == 1:
        (values,) = out.values()
        out = {"fast": values, "heavy": dict(values)}
    return out
