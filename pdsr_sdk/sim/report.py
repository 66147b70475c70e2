"""Metrics of a simulated run: makespan, a lower bound, utilisation, tail share, policy counters.

Lower bound (per batch, summed over batches, since batches run one after
another). With the cheapest coefficient of each term over the pools in use
(``c0, c1, c2, p``) and the largest ``max_num_seqs`` M:

- *work* of a sample with prompt P, L kept tokens and least prefill Q:
  ``W = p*Q + L*(c0/M + c1) + c2*(L*P + L(L-1)/2)`` engine-seconds. A step of R
  <= M requests costs ``c0 + c1 R + c2 C + p Q``; split over its requests, each
  token pays at least ``c0/M + c1 + c2 * its context`` (its context at token j is
  P + j), and each prompt is prefilled whole at least once in a batch (the
  engines start each batch empty); with the prompt cache (a profile's
  ``prompt_cache``) a later sample of the same prompt prefills at least what
  lies past the prompt's whole blocks (``cost.least_prefill``), without it its
  whole prompt. So the engines' busy time is at least the batch's total work.
- *capacity*: E engines deliver at most E engine-seconds per second, so
  ``makespan >= sum(W) / E``.
- *longest request*: a sample's tokens come one step at a time, each step at
  least ``c0 + c1 + c2 * context``, the first with its prompt's prefill, so
  ``makespan >= max over samples of p*Q + L(c0 + c1) + c2 (L P + L(L-1)/2)``,
  Q the least it may prefill: its whole prompt if no other sample of the batch
  shares it, else (with the prompt cache) what lies past the whole blocks,
  since any of them may come first.

``lower_bound = max(work / capacity, longest)``. Preemption, re-prefill,
restarts, idle slots and segment boundaries only add time. Kept tokens are the
samples' final lengths (a policy that truncates, v1, lowers its own bound).

Comparisons (every policy against the runs of the same simulation): ``vs_baseline`` =
makespan / baseline's; ``vs_lower_bound`` = makespan / lower bound; the share of a reference
schedule's gain (``oracle``, ``oracle-probe``) = (baseline - policy) / (baseline - reference),
None ("n/a" in the table) when that run is missing or the reference gains less than 1% of
baseline's makespan (the share would divide by noise).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from pdsr_sdk.sim.cost import alone_time, sample_work

DEFINITIONS = {
    "makespan_s": "Virtual seconds from each batch's start to its last sample's finish, summed over batches.",
    "lower_bound_s": "Per batch max(work / engines, longest sample alone), summed over batches; work = "
                     "p*Q + L*(c0/M + c1) + c2*(L*P + L(L-1)/2) engine-seconds per sample with the cheapest "
                     "coefficients of the pools in use and M their largest max_num_seqs; Q, the least tokens it "
                     "prefills: its prompt P for the first sample of each prompt, and with the prompt cache what "
                     "lies past the prompt's whole blocks for the others.",
    "ratio": "makespan_s / lower_bound_s (>= 1; 1 would be perfect packing); the same as vs_lower_bound.",
    "vs_baseline": "makespan_s / baseline's makespan_s (null without a baseline run).",
    "vs_lower_bound": "makespan_s / lower_bound_s.",
    "share_of_oracle_gain": "(baseline - policy) / (baseline - oracle) makespans: the share of the true-length "
                            "reference's gain this policy takes; null when oracle gains under 1% of baseline "
                            "(or either run is missing).",
    "share_of_oracle_probe_gain": "The same against oracle-probe (each group's probe length known for free at "
                                  "the start).",
    "tokens_per_s": "Kept response tokens / makespan_s.",
    "utilisation": "Per pool with engines: busy engine-seconds of the pool (a step running) / (its engines x "
                   "makespan_s); the table's util_<pool>.",
    "policy": "The policy's name (or a reference schedule's: oracle, oracle-probe).",
    "variants": "A reference kept per batch from several schedules (oracle): per variant, its makespan_s over "
                "every batch and batches_kept, how many batches it was the shorter in; each batch's policy.variant "
                "names the one kept.",
    "tokens": "Kept response tokens of the run's samples (tokens thrown away by restarts not counted).",
    "settings": "The policy's settings as it ran (its defaults, its preset's and those given).",
    "counters": "probes, offloaded_prompts, breaks, moves, steals, restarts, wasted_tokens, retries, truncations, "
                "probe_timeouts, steal_timeouts, engines_lost (0 when nothing happened), and any other counter "
                "the policy moved: the counters of a `pdsr rollout` summary, summed over batches.",
    "events": "Events the simulator's virtual clock ran (a measure of its own work, not of the engines').",
    "sim_wall_s": "Wall-clock seconds the simulation of this policy took (not virtual time).",
    "batches": "Per batch: its own makespan_s, lower_bound_s (work_bound_s and longest_bound_s, its two terms), "
               "tail_s, tokens and counters.",
    "tail_share": "Per batch, the time from when ceil((1 - tail_fraction) x samples) had finished to the batch's "
                  "end, summed over batches, / makespan_s.",
    "preemptions": "Running requests evicted because the KV cache was full (their context is re-prefilled).",
    "prefill_tokens": "Context tokens prefilled by the engines (prompts, uncached continuation tails, recomputes).",
    "env_slot_share": "A trace of turns: slot-seconds held by samples waiting on their environment / all slot-seconds "
                      "held (those plus requests on engines, launch to segment end); 0 where a parked sample holds no "
                      "slot (pdsr), above 0 for the slot-holding reference (baseline-hold: baseline with each slot "
                      "kept through the environment's wait).",
    "env_wait_s": "A trace of turns: seconds samples waited on their environment, summed over samples.",
}


def batch_bounds(prompt_len, length, engines: int, *, c0: float, c1: float, c2: float, prefill: float,
                 max_seqs: int, prefill_len=None, alone_prefill_len=None) -> tuple[float, float]:
    """(work / capacity, longest alone) of one batch, from per-sample prompt and kept lengths and the
    least tokens the samples prefill together (``prefill_len``) and each alone (``alone_prefill_len``;
    default: ``prefill_len``, and by default its prompt)."""
    work = float(sample_work(prompt_len, length, c0=c0, c1=c1, c2=c2, prefill=prefill, max_seqs=max_seqs,
                             prefill_len=prefill_len).sum())
    alone = alone_time(prompt_len, length, c0=c0, c1=c1, c2=c2, prefill=prefill,
                       prefill_len=prefill_len if alone_prefill_len is None else alone_prefill_len)
    return work / engines, float(alone.max()) if alone.size else 0.0


#: the smallest gain (as a share of baseline's makespan) a reference must make for shares of it to be reported
MIN_REFERENCE_GAIN = 0.01

#: reference schedule -> its share key in the report
REFERENCES = {"oracle": "share_of_oracle_gain", "oracle-probe": "share_of_oracle_probe_gain"}
#: reference schedule -> its share column in the table
SHARE_COLUMNS = {"oracle": "of_oracle", "oracle-probe": "of_probe"}


def gain_share(baseline: float | None, policy: float, reference: float | None, *,
               min_gain: float = MIN_REFERENCE_GAIN) -> float | None:
    """(baseline - policy) / (baseline - reference), or None when a makespan is missing or the reference
    gains less than ``min_gain`` x baseline (then any share would mostly measure noise)."""
    if baseline is None or reference is None or baseline <= 0:
        return None
    gain = baseline - reference
    if gain < min_gain * baseline:
        return None
    return (baseline - policy) / gain


def tail_time(finish_times, end: float, fraction: float) -> float:
    """Seconds from when ``ceil((1 - fraction) * S)`` samples had finished to ``end``."""
    t = np.sort(np.asarray(finish_times, dtype=np.float64))
    if t.size == 0:
        return 0.0
    k = max(1, math.ceil((1.0 - fraction) * t.size - 1e-9))
    return float(end - t[k - 1])


class SimulationReport:
    """All policies' results, as JSON (``to_dict``) and table rows (``rows``)."""

    def __init__(self, cfg, batches, runs):
        self.cfg = cfg
        self.batches = batches
        self.runs = runs
        self.timelines: list[str] = []

    def makespan_of(self, policy: str) -> float | None:
        """The makespan of the run named ``policy`` in this report, or None."""
        for r in self.runs:
            if r.policy == policy:
                return r.makespan_s
        return None

    def policy_summary(self, run) -> dict[str, Any]:
        cfg = self.cfg
        makespan = run.makespan_s
        bound = run.lower_bound_s
        pools = {"fast": cfg.fast, "heavy": cfg.heavy}
        util = {}
        for pool, count in pools.items():
            if count:
                busy = sum(b.busy_s[e.name] for b in run.batches for e in run.engines if e.pool == pool)
                util[pool] = busy / (count * makespan) if makespan > 0 else 0.0
        tail = sum(b.tail_s for b in run.batches)
        base = self.makespan_of("baseline")
        out = {
            "policy": run.policy,
            "settings": run.settings,
            "makespan_s": makespan,
            "lower_bound_s": bound,
            "ratio": makespan / bound if bound > 0 else None,
            "vs_baseline": makespan / base if base else None,
            "vs_lower_bound": makespan / bound if bound > 0 else None,
            **{key: gain_share(base, makespan, self.makespan_of(ref)) for ref, key in REFERENCES.items()},
            "tokens": run.tokens,
            "tokens_per_s": run.tokens / makespan if makespan > 0 else 0.0,
            "utilisation": util,
            "tail_share": tail / makespan if makespan > 0 else 0.0,
            **{k: run.stats.get(k, 0) for k in run.stats},
            "preemptions": sum(b.preemptions for b in run.batches),
            "prefill_tokens": sum(b.prefill_tokens for b in run.batches),
            "events": run.events,
            "sim_wall_s": run.wall_s,
            "batches": [{
                "batch_index": b.batch_index, "groups": b.groups, "samples": b.samples,
                "makespan_s": b.makespan_s, "lower_bound_s": b.lower_bound_s, "work_bound_s": b.work_bound_s,
                "longest_bound_s": b.longest_bound_s, "tail_s": b.tail_s, "tokens": b.tokens, **b.stats,
                "preemptions": b.preemptions, "prefill_tokens": b.prefill_tokens, "policy": b.policy,
            } for b in run.batches],
        }
        if run.variants:
            out["variants"] = run.variants
        if self.batches.multi_turn:
            out["env_slot_share"] = run.env_slot_share
            out["env_wait_s"] = sum(b.env_wait_s for b in run.batches)
        return out

    def to_dict(self) -> dict[str, Any]:
        cfg = self.cfg
        tb = self.batches
        return {
            "trace": {"source": tb.source, "groups": tb.num_groups, "samples": tb.num_samples,
                      "batches": len(tb.batches), "batch_size": cfg.batch_size, "n": tb.n,
                      "zero_length_samples": tb.zero_length_samples},
            "engines": {"fast": {"count": cfg.fast, **cfg.profiles.fast.model_dump()},
                        "heavy": {"count": cfg.heavy, **cfg.profiles.heavy.model_dump()}},
            "segments": cfg.segments.model_dump(),
            "tail_fraction": cfg.tail_fraction,
            "definitions": DEFINITIONS,
            "policies": [self.policy_summary(r) for r in self.runs],
            "timelines": self.timelines,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=_jsonable)

    def rows(self) -> list[dict[str, Any]]:
        """One row per policy for a side-by-side table. The comparison columns (``vs_base``, ``of_oracle``,
        ``of_probe``) are there when the runs they compare with are."""
        out = []
        has_base = self.makespan_of("baseline") is not None
        for r in self.runs:
            s = self.policy_summary(r)
            row = {"policy": s["policy"], "makespan_s": s["makespan_s"]}
            if has_base:
                row["vs_base"] = _or_na(s["vs_baseline"])
            row.update({"bound_s": s["lower_bound_s"], "vs_bound": s["vs_lower_bound"]})
            for ref, key in REFERENCES.items():
                if has_base and self.makespan_of(ref) is not None:
                    row[SHARE_COLUMNS[ref]] = _or_na(s[key])
            row["tok/s"] = s["tokens_per_s"]
            for pool, u in s["utilisation"].items():
                row[f"util_{pool}"] = u
            row["tail"] = s["tail_share"]
            if "env_slot_share" in s:
                row["env_slot"] = s["env_slot_share"]
            for key, label in (("probes", "probes"), ("offloaded_prompts", "offloads"), ("breaks", "breaks"),
                               ("moves", "moves"), ("steals", "steals"), ("restarts", "restarts"),
                               ("wasted_tokens", "wasted"), ("truncations", "trunc"), ("preemptions", "preempt")):
                row[label] = s.get(key, 0)
            out.append(row)
        return out


def _or_na(value):
    return "n/a" if value is None else value


def _jsonable(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return str(value)
