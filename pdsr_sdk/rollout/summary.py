"""A rollout run's summary (``<out>.summary.json``): the batches on disk before a resume and this call's."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import BaseModel

from pdsr_sdk.dispatch.run import STAT_KEYS
from pdsr_sdk.engines.vllm_stats import SPECULATION_KEYS
from pdsr_sdk.rollout.resume import ResumeState, merged_batches
from pdsr_sdk.rollout.reward_totals import GroupRewards, add_extra_sums, extra_means
from pdsr_sdk.rollout.session import BatchResult, RolloutSession


@dataclass
class RolloutSummary:
    policy: str
    model: str
    output: str
    groups: int
    samples: int
    skipped_groups: int       # groups on disk before this call (--resume); groups counts them too
    batches: list[dict[str, Any]]
    makespan_s: float
    tokens: int
    tokens_per_s: float
    engine_busy_fraction: dict[str, float]
    stats: dict[str, int]
    engines: list[dict[str, Any]] = field(default_factory=list)
    engine_errors: list[str] = field(default_factory=list)
    skipped_long: int = 0     # prompts longer than the context, skipped (data.skip_long)
    reward_mean: float | None = None   # over the samples with a reward (None: no reward function)
    #: the mean of each numeric key of the rewards' dicts (verl's reward_extra_info: acc, overlong_reward ...)
    #: over the samples that have it
    reward_extra_means: dict[str, float] = field(default_factory=dict)
    filtered_groups: int = 0   # groups dynamic sampling filtered out (filter_groups), not in groups
    filtered_reward_errors: int = 0   # samples of those groups whose reward failed (not in stats' reward_errors)
    dropped_groups: int = 0    # groups on-policy dynamic sampling dropped at a step's end, not in groups
    rewarded_samples: int = 0          # samples with a reward
    run_id: str = ""          # the same across a run and its resumes
    #: the settings the policy ran with: its defaults, under its preset's and the config's (to tell A/B runs apart)
    policy_settings: dict[str, Any] = field(default_factory=dict)
    #: speculative decoding's method and settings (None: off); `pdsr simulate calibrate` reads max_batch_size
    speculative_settings: dict[str, Any] | None = None
    #: speculative decoding's counts over the run's engines (:func:`speculation_totals`; None: off, or no engine
    #: reports them)
    speculation: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


@dataclass
class BatchTally:
    """What a run's summary reads of one finished batch (or step): its report without its groups, and the groups'
    count, samples and prompt ids. ``pdsr rollout`` keeps these, not the groups, which are on disk by then (kept,
    every sample's tokens and log-probs stayed in memory until the run ended)."""

    report: BatchResult
    groups: int
    samples: int
    prompt_ids: list[str]

    @classmethod
    def of(cls, report: BatchResult) -> "BatchTally":
        return cls(dataclasses.replace(report, groups=[]), len(report.groups),
                   sum(len(g.samples) for g in report.groups), [g.prompt_id for g in report.groups])


def run_summary(config, model_dir: str, session: RolloutSession, tallies: list[BatchTally], prior: ResumeState,
               rewards: dict[str, GroupRewards], *, skipped_long: int = 0) -> RolloutSummary:
    """The whole run's summary: the batches on disk before a resume (``prior``) and this call's."""
    sched = session.scheduler

    results = [t.report for t in tallies]

    def batch_rewards(t: BatchTally) -> dict[str, Any]:
        total = GroupRewards()
        for prompt_id in t.prompt_ids:
            total.add(rewards.get(prompt_id, GroupRewards()))
        return {**asdict(total), "reward_s": round(total.reward_s, 4)}

    batches = merged_batches(prior.batches, [{
        "batch_index": r.batch_index, "groups": t.groups, "makespan_s": round(r.makespan_s, 4),
        "tokens": r.tokens, "tokens_per_s": round(r.tokens_per_s, 2), "l_cut": r.l_cut, "fast_cap": r.fast_cap,
        **{k: r.stats.get(k, 0) for k in STAT_KEYS}, "policy": r.policy, **batch_rewards(t), **(r.step or {}),
    } for t in tallies for r in [t.report]])
    extra: dict[str, list[float]] = {}
    for b in batches:
        extra = add_extra_sums(extra, b.get("reward_extra_sums") or {})
    reward_sum = sum(b.get("reward_sum", 0.0) for b in batches)
    rewarded = sum(b.get("rewarded_samples", 0) for b in batches)
    makespan = sum(r.makespan_s for r in results) + sum(b["makespan_s"] for b in prior.batches)
    tokens = sum(r.tokens for r in results) + sum(b["tokens"] for b in prior.batches)
    stats = {k: 0 for k in STAT_KEYS}
    for r in results:
        for k, v in r.stats.items():
            stats[k] = stats.get(k, 0) + v
    for b in prior.batches:
        for k in STAT_KEYS:
            stats[k] += b.get(k, 0)
    stats.pop("samples_finished", None)
    stats["reward_timeouts"] = sum(b.get("reward_timeouts", 0) for b in batches)   # math_verify checks that timed out
    stats["reward_errors"] = sum(b.get("reward_errors", 0) for b in batches)   # samples whose reward function raised
    stats.pop("tokens_generated", None)
    busy = dict.fromkeys(sched.usage if sched else {}, 0.0)
    for name, b in prior.busy_s.items():
        busy[name] = busy.get(name, 0.0) + b
    for r in results:
        for name, b in r.engine_busy_s.items():
            busy[name] = busy.get(name, 0.0) + b
    engines = [{"name": s.name, "pool": s.pool, "devices": s.devices, "max_num_seqs": s.max_num_seqs,
                "max_model_len": s.max_model_len, **kv_capacity(session, s.name),
                **speculation_counts(config, session, s.name)}
               for s in session.engine_specs]
    return RolloutSummary(
        policy=config.policy, model=model_dir, output=str(config.output.path),
        policy_settings=ran_settings(session.policy_settings),
        groups=prior.groups + sum(t.groups for t in tallies),
        samples=prior.samples + sum(t.samples for t in tallies),
        skipped_groups=prior.groups, batches=batches, makespan_s=makespan, tokens=tokens,
        tokens_per_s=tokens / makespan if makespan > 0 else 0.0,
        engine_busy_fraction={k: (v / makespan if makespan > 0 else 0.0) for k, v in busy.items()},
        stats=stats,
        engines=engines,
        engine_errors=[str(e) for e in (sched.engine_errors if sched else [])],
        skipped_long=skipped_long, run_id=prior.run_id,
        reward_mean=reward_sum / rewarded if rewarded else None, rewarded_samples=rewarded,
        reward_extra_means=extra_means(extra),
        filtered_groups=sum(b.get("filtered_groups", 0) for b in batches),
        filtered_reward_errors=sum(b.get("filtered_reward_errors", 0) for b in batches),
        dropped_groups=sum(b.get("dropped_groups", 0) for b in batches),
        speculative_settings=(None if config.speculative == "off" else
                              {"method": config.speculative, **config.speculative_settings.model_dump()}),
        speculation=speculation_totals(engines),
    )


def ran_settings(settings: Any) -> dict[str, Any]:
    """A policy's resolved settings (its settings model, or a plain mapping) as JSON-ready values, defaults too."""
    if isinstance(settings, BaseModel):
        return settings.model_dump(mode="json")
    return json.loads(json.dumps(dict(settings or {}), default=str))


def kv_capacity(session: RolloutSession, name: str) -> dict[str, Any]:
    """An engine's KV-cache capacity in tokens, where it knows it (vLLM sizes it at start-up), for
    `pdsr simulate calibrate` to write into the profile beside the fitted costs."""
    engine = next((e for e in session.engines if e.name == name), None)
    tokens = getattr(engine, "kv_cache_tokens", None)
    return {"kv_cache_tokens": int(tokens)} if isinstance(tokens, int) and tokens > 0 else {}


def speculation_counts(config, session: RolloutSession, name: str) -> dict[str, Any]:
    """An engine's speculative decoding counts since it started (``VllmEngine.speculation_stats``), with
    ``speculative`` on and where the engine reports them (local vLLM engines; Ray engines do not yet)."""
    if config.speculative == "off":
        return {}
    engine = next((e for e in session.engines if e.name == name), None)
    stats = getattr(engine, "speculation_stats", None)
    return {"speculation": stats()} if callable(stats) else {}


def speculation_totals(engines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The engines' speculation counts summed (``drafts``: verify steps that checked drafted tokens), with
    ``acceptance_rate`` (accepted / drafted tokens) and ``accepted_per_verify_step`` (accepted / drafts; each verify
    step also yields a token of its own, so a verify step yields 1 + this, vLLM's mean acceptance length); None
    where no engine reports counts."""
    counts = [e["speculation"] for e in engines if "speculation" in e]
    if not counts:
        return None
    out: dict[str, Any] = {k: sum(c[k] for c in counts) for k in SPECULATION_KEYS}
    out["acceptance_rate"] = out["accepted_tokens"] / out["drafted_tokens"] if out["drafted_tokens"] else None
    out["accepted_per_verify_step"] = out["accepted_tokens"] / out["drafts"] if out["drafts"] else None
    return out
