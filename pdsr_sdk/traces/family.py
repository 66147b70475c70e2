"""The family of workloads policies are judged on: named, seeded length-trace generators (``WORKLOADS``).

Each member is :func:`~pdsr_sdk.traces.synth.synth_trace` with its own defaults (``synth``), or a recorded
trace resampled by seed (``recorded``), and pins how it is measured (:class:`Measurement`): the engine
profile whose KV tokens and ``max_model_len`` decide whether the member is KV-bound, K steps (the steady
state is steps 3 to K-1) and its seeds. ``pdsr trace synth --family NAME`` draws one (``--family list``
lists them); in Python ``synth_trace(family="heavy", groups=512, seed=101)`` or
``WORKLOADS.get("heavy").trace(groups=512, seed=101)``; keys given override the member's defaults.
docs/notes/workload-family.md has each member's statistics. A user's member is registered with
:func:`register_workload` or named by import path (``my_pkg.workloads:MINE``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from pdsr_sdk.errors import ConfigError, ConfigValueError, DataError
from pdsr_sdk.registry import Registry
from pdsr_sdk.traces.trace import LengthTrace

#: the seeds every built-in member is measured on (none of them was used to tune a policy)
SEEDS = (101, 102, 103, 104, 105)
#: the engines of bench/policies.py and of the partial-rollout searches: 256 sequences and 262,144 KV tokens each
EQUAL_ENGINE = MappingProxyType({"max_num_seqs": 256, "kv_cache_tokens": 262144, "max_model_len": 32768})
#: config keys a recorded member takes; the others describe a synthetic trace and must stay at its defaults
RECORDED_KEYS = frozenset({"family", "groups", "seed"})


@dataclass(frozen=True)
class Measurement:
    """How a member is measured: the engine profile (``pdsr simulate``'s ``profiles`` keys; its
    ``kv_cache_tokens`` against ``max_num_seqs`` full contexts says whether the member is KV-bound), K steps
    of a partial-rollout stream (the steady state is steps 3 to K-1) and the trace seeds (at least 5)."""

    profile: Mapping[str, int] = field(default_factory=lambda: EQUAL_ENGINE)
    steps: int = 10
    seeds: tuple[int, ...] = SEEDS

    def __post_init__(self) -> None:
        object.__setattr__(self, "profile", MappingProxyType(dict(self.profile)))
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        if len(set(self.seeds)) < 5:
            raise ConfigValueError(f"a workload is measured on at least 5 distinct seeds, got {list(self.seeds)}")
        if self.steps < 4:
            raise ConfigValueError(f"a workload's K must be at least 4 (the steady state is steps 3 to K-1), "
                                   f"got {self.steps}")

    def kv_demand(self, trace: LengthTrace) -> float:
        """``max_num_seqs`` full contexts (mean prompt + mean response of ``trace``) over ``kv_cache_tokens``:
        above 1 a full engine's sequences do not fit in its KV cache together (the member is KV-bound)."""
        context = float(np.mean(trace.prompt_lens)) + float(np.mean(trace.lengths))
        return self.profile["max_num_seqs"] * context / self.profile["kv_cache_tokens"]

    @staticmethod
    def spread(values, fmt: str = ".3f") -> str:
        """How a member's numbers over its seeds are reported: ``median [min, max]`` of ``values``, each
        formatted with ``fmt`` (the value alone for one)."""
        if len(values) == 1:
            return format(values[0], fmt)
        return f"{format(float(np.median(values)), fmt)} [{format(min(values), fmt)}, {format(max(values), fmt)}]"

    def describe(self) -> str:
        p = self.profile
        seeds = ", ".join(map(str, self.seeds))
        return (f"engines of {p['max_num_seqs']} sequences, {p['kv_cache_tokens']:,} KV tokens, max_model_len "
                f"{p['max_model_len']:,}; K = {self.steps} steps (steady: 3 to {self.steps - 1}); seeds {seeds}")


@dataclass(frozen=True)
class WorkloadMember:
    """One named workload: its description (one or two sentences), its defaults of
    :class:`~pdsr_sdk.traces.config.TraceSynthConfig` (``synth``), its :class:`Measurement` and, for a
    recorded member, the JSONL trace it resamples (``recorded``: absolute, or relative to the checkout)."""

    name: str
    description: str
    synth: Mapping[str, Any] = field(default_factory=dict)
    measure: Measurement = field(default_factory=Measurement)
    recorded: str | None = None

    def __post_init__(self) -> None:
        from pdsr_sdk.config import validate_config
        from pdsr_sdk.traces.config import TraceSynthConfig

        object.__setattr__(self, "synth", MappingProxyType(dict(self.synth)))
        if "family" in self.synth:
            raise ConfigValueError(f"workload {self.name!r}: its synth defaults cannot name a family")
        cfg = validate_config(TraceSynthConfig, self.synth, source=f"workload {self.name!r}")   # typos fail here
        need = cfg.max_length + cfg.prompt_len_max + (cfg.turns_max - 1) * cfg.env_tokens_max
        if self.measure.profile["max_model_len"] < need:
            raise ConfigValueError(f"workload {self.name!r}: max_model_len {self.measure.profile['max_model_len']} "
                                   f"is below the longest context, {need} (prompt_len_max + max_length, and the "
                                   f"environment's tokens between turns)")

    def config(self, **overrides):
        """The member's :class:`~pdsr_sdk.traces.config.TraceSynthConfig`; ``overrides`` replace its defaults.
        Its ``family`` is the member's name where the member is registered under it, else None."""
        from pdsr_sdk.config import validate_config
        from pdsr_sdk.traces.config import TraceSynthConfig

        registered = self.name in WORKLOADS and WORKLOADS.get(self.name) is self
        if self.recorded is not None and not registered:
            defaults = {k: f.default for k, f in TraceSynthConfig.model_fields.items()} | dict(self.synth)
            check_recorded_config(self, overrides, defaults)
        return validate_config(TraceSynthConfig, {**self.synth, **overrides,
                                                  "family": self.name if registered else None})

    def trace(self, **overrides) -> LengthTrace:
        """A trace of this member (``groups=``, ``seed=`` and any other config key override its defaults)."""
        from pdsr_sdk.traces.synth import synth_trace

        cfg = self.config(**overrides)
        return resampled_member_trace(self, cfg) if self.recorded is not None else synth_trace(cfg)

    def recorded_trace(self) -> LengthTrace:
        """The recorded trace a recorded member resamples (read once per process)."""
        if self.recorded is None:
            raise ConfigValueError(f"workload {self.name!r} is synthetic; it has no recorded trace")
        return _read_recorded(str(self.recorded))


WORKLOADS: Registry[WorkloadMember] = Registry("workload")


def register_workload(member: WorkloadMember) -> WorkloadMember:
    """Register ``member`` under its name (a taken name is an error)."""
    WORKLOADS.register(member.name, member)
    return member


def workload(name: str) -> WorkloadMember:
    """The member named ``name`` (an unknown name is an error listing the valid ones)."""
    member = WORKLOADS.get(name)
    if not isinstance(member, WorkloadMember):
        raise ConfigValueError(f"workload {name!r} is a {type(member).__name__}, not a WorkloadMember")
    return member


def resample_trace(trace: LengthTrace, groups: int, seed: int) -> LengthTrace:
    """``groups`` whole groups of the rectangular ``trace``, drawn with replacement by ``seed`` (seed 0: in
    recorded order, repeated as needed), each with its recorded rewards and turns where it has them. Group j's id
    is its recorded id with ``#j``."""
    trace.require_rectangular("resampling needs")
    k = trace.num_groups
    pick = np.arange(groups) % k if seed == 0 else np.random.default_rng(seed).integers(0, k, size=groups)
    reasons, durations = trace.finish_reasons, trace.duration_matrix()
    n = trace.samples_per_group
    turns = None if trace.turns is None else trace.turns.take((pick[:, None] * n + np.arange(n)).reshape(-1))
    rewards = None if trace.rewards is None else trace.rewards.reshape(k, n)[pick]
    return LengthTrace.from_matrix(
        trace.matrix()[pick], prompt_ids=[f"{trace.prompt_ids[i]}#{j}" for j, i in enumerate(pick)],
        prompt_lens=np.asarray(trace.prompt_lens)[pick],
        durations_s=None if durations is None else durations[pick],
        finish_reasons=None if reasons is None else reasons.reshape(k, -1)[pick],
        source=f"{trace.source} (draw {seed})", rewards=rewards, turns=turns)


def check_recorded_config(member: WorkloadMember, data: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """A recorded member takes only ``groups`` and ``seed``: any other key that differs from the member's
    defaults is an error naming it."""
    bad = sorted(k for k, v in data.items() if k not in RECORDED_KEYS and v != defaults.get(k))
    if bad:
        raise ConfigError(f"workload {member.name!r} resamples a recorded trace ({member.recorded}); it takes "
                               f"only groups and seed, not {', '.join(bad)}")


def resampled_member_trace(member: WorkloadMember, cfg) -> LengthTrace:
    """A recorded member's trace for ``cfg`` (its groups and seed), checked against the member's fixed N."""
    recorded = member.recorded_trace()
    if cfg.n != recorded.samples_per_group:
        raise ConfigValueError(f"workload {member.name!r}: its recorded trace has n = {recorded.samples_per_group}, "
                               f"the config asks for {cfg.n}")
    return resample_trace(recorded, cfg.groups, cfg.seed)


@functools.lru_cache(maxsize=8)
def _read_recorded(path: str) -> LengthTrace:
    from pdsr_sdk.traces.io import read_trace

    p = Path(path)
    if not p.is_absolute():
        p = Path(__file__).resolve().parents[2] / p
    if not p.exists():
        raise DataError(f"{p}: the recorded trace of this workload is not here; it ships with a pdsr checkout "
                        f"({path}), not with an installed package")
    trace = read_trace(p)
    trace.require_rectangular("a recorded workload needs")
    return trace


# -- the built-in family ---------------------------------------------------------------------------
# Parameters were fitted by measuring the statistics of docs/notes/workload-family.md (4,096 groups x 8,
# seeds 101-105); tests/traces/test_family.py pins them.

register_workload(WorkloadMember(
    "informative",
    "`pdsr trace synth`'s defaults, resembling the P-DSR length study of a 0.5B model on MATH: median 420 "
    "tokens, p99 1.4k, 0.3% at the 4,096 cap, and the probe ranks its siblings (Spearman 0.61).",
))
register_workload(WorkloadMember(
    "uninformative",
    "A small model that rambles: prompts differ little, samples vary widely and 35% run away independently "
    "(42% end at the 1,024 cap), so the probe says almost nothing (Spearman 0.01).",
    synth=dict(prompt_sigma=0.05, noise_sigma=0.7, runaway_frac=0.35, max_length=1024),
))
register_workload(WorkloadMember(
    "uninformative-by-prompt",
    "`uninformative` with each prompt's own runaway rate (Beta, concentration 5), as a small model's runs to "
    "the cap cluster by prompt; the probe tells a little (Spearman 0.1).",
    synth=dict(prompt_sigma=0.05, noise_sigma=0.7, runaway_frac=0.35, runaway_concentration=5, max_length=1024),
))
register_workload(WorkloadMember(
    "kv-bound",
    "`informative`'s shape scaled to long reasoning, median 3.4k tokens and a 32,768 cap: 256 such contexts "
    "need about four times an engine's 262,144 KV tokens, so memory, not slots, bounds the batch.",
    synth=dict(median_length=3400, max_length=32768),
    measure=Measurement(profile={**EQUAL_ENGINE, "max_model_len": 40960}),
))
register_workload(WorkloadMember(
    "seed002",
    "Built to seed 002's published statistics and issue 48's seed-002-like trace: CV 0.30, probe Spearman "
    "0.66, p99 2.2k tokens and 0.5% of samples at the 4,096 cap.",
    synth=dict(median_length=620, prompt_sigma=0.42, noise_sigma=0.28, runaway_frac=0.005),
))
register_workload(WorkloadMember(
    "heavy",
    "`seed002`'s body with a heavy tail: 7% of samples run to the 4,096 cap, clustered by prompt (Beta, "
    "concentration 10).",
    synth=dict(median_length=620, prompt_sigma=0.42, noise_sigma=0.28, runaway_frac=0.07, runaway_concentration=10),
))
register_workload(WorkloadMember(
    "longcot",
    "Long chain-of-thought reasoning: median 2k tokens, wide spread between and within prompts, 4.5% of "
    "samples at a 16,384 cap (clustered by prompt); KV-bound on the pinned engines.",
    synth=dict(median_length=2000, prompt_sigma=0.6, noise_sigma=0.4, runaway_frac=0.044, runaway_concentration=10,
               max_length=16384),
    measure=Measurement(profile={**EQUAL_ENGINE, "max_model_len": 20480}),
))
register_workload(WorkloadMember(
    "multi-turn",
    "An agent with tools: `informative`'s sampled lengths cut into 1-8 turns per sample (centred by prompt), "
    "16-256 environment tokens and a 0.1-5 s environment delay (log-uniform) after each turn but the last.",
    synth=dict(turns_min=1, turns_max=8, env_delay_min_s=0.1, env_delay_max_s=5.0),
))


def _recorded(name: str, description: str, cap: int, path: str) -> WorkloadMember:
    """A member resampling a recorded trace: SmolLM2-135M-Instruct's groups of 8 at a ``cap``-token response cap."""
    return WorkloadMember(name, description, synth=dict(n=8, max_length=cap), recorded=path)


register_workload(_recorded(
    "recorded-gsm8k",
    "SmolLM2-135M-Instruct on the first 128 GSM8K test prompts (vLLM CPU, n = 8, temperature 1, 512-token cap), "
    "resampled: each seed draws whole recorded groups with replacement (44% at the cap, probe Spearman 0.03).",
    512, "bench/data/smollm2-gsm8k-128x8.jsonl",
))
register_workload(_recorded(
    "recorded-math",
    "SmolLM2-135M-Instruct on the first 128 MATH-500 problems (vLLM CPU, n = 8, temperature 1, 512-token cap), "
    "resampled as recorded-gsm8k is (45% at the cap; with math_verify's rewards: 1 of 1,024 right).",
    512, "bench/data/smollm2-math500-128x8.jsonl",
))
register_workload(_recorded(
    "recorded-gsm8k-2048",
    "recorded-gsm8k's model and settings at a 2,048-token cap, on the first 32 GSM8K test prompts (what fits "
    "this machine's two cores in an hour), resampled as recorded-gsm8k is.",
    2048, "bench/data/smollm2-gsm8k-32x8-2048.jsonl",
))
register_workload(_recorded(
    "recorded-math-2048",
    "recorded-math's model and settings at a 2,048-token cap, on the first 24 MATH-500 problems (what fits this "
    "machine's two cores in an hour), resampled as recorded-math is.",
    2048, "bench/data/smollm2-math500-24x8-2048.jsonl",
))
