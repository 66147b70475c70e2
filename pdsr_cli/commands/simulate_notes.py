"""What ``pdsr simulate`` prints around its tables: the header's words about the trace and the cost model, and the
notes under each table that say what its columns mean (only the columns shown)."""

from __future__ import annotations

from typing import Any

#: counter columns of the side-by-side table, left out when every policy's is zero (simulate.json has them all)
COUNTER_COLUMNS = ("probes", "offloads", "breaks", "moves", "steals", "restarts", "wasted", "trunc", "preempt")

#: what each column of the side-by-side table means, in the order the table shows them
TABLE_NOTES = (
    ("makespan_s", "makespan = seconds from each batch's start to its last sample's end, summed over batches"),
    ("vs_base", "vs_base = makespan / baseline's"),
    ("bound_s", "bound = max(work / engines, longest sample alone) per batch, vs_bound = makespan / bound"),
    ("of_oracle", "of_oracle, of_probe = (baseline - policy) / (baseline - reference) for oracle and "
                  "oracle-probe, n/a when the reference gains under 1% of baseline"),
    ("tok/s", "tok/s = response tokens / makespan"),
    ("util_", "util_<pool> = share of the pool's engine-time with a step running"),
    ("tail", "tail = share of the makespan after 90% of each batch's samples finished"),
    ("env_slot", "env_slot = share of slot-time held by samples waiting on their environment, baseline-hold = "
                 "baseline keeping each slot through the wait"),
    ("probes", "probes = probe samples (each group's sample 0, run first)"),
    ("offloads", "offloads = prompts sent to the heavy pool"),
    ("breaks", "breaks = requests over the fast pool's cap (v2's breaker, v2.5's cap), sent to the heavy pool"),
    ("moves", "moves = times the policy moved a sample to another engine or pool"),
    ("steals", "steals = queued requests an engine with free slots took from another's queue"),
    ("restarts", "restarts = samples started over"),
    ("wasted", "wasted = the tokens restarts threw away"),
    ("trunc", "trunc = responses a policy's cap cut short (v1's fast_max_tokens): its makespan and bound are of "
              "shorter responses than the others', not comparable"),
    ("preempt", "preempt = running requests evicted because the KV cache was full (prefilled again)"),
)


def table_notes(rows: list[dict[str, Any]], sim_s: float) -> str:
    """The lines under the side-by-side table: what each column shown means, then each counter column shown (one
    that some policy moved, as the table shows it), and the simulation's own time."""
    from pdsr_cli.common import is_empty

    shown = set(rows[0]) if rows else set()
    shown -= {c for c in COUNTER_COLUMNS if all(is_empty(r.get(c)) for r in rows)}
    shown |= {"util_"} if any(c.startswith("util_") for c in shown) else set()
    words = [w for col, w in TABLE_NOTES if col in shown and col not in COUNTER_COLUMNS]
    counters = [w for col, w in TABLE_NOTES if col in shown and col in COUNTER_COLUMNS]
    return ("(" + "; ".join(words + [f"simulated in {sim_s:.2f} s"]) + ")"
            + ("\n(counters, summed over batches: " + "; ".join(counters) + ")" if counters else ""))


def steady_words(steps: int) -> str:
    """Which steps ``step_s`` averages: the steady window of ``steady_window``, in the user's 1-based count."""
    from pdsr_sdk.sim.steps_report import steady_window

    window = range(steps)[steady_window(steps)]
    if steps == 1:
        return "step_s: the one step's time (it fills the pipeline: run 4 or more for a steady number)"
    if len(window) == steps:
        return (f"step_s: mean of all {steps} steps (under 4, the first two, which fill the pipeline, are not left "
                f"out: run more for a steady number)")
    first, last = window[0] + 1, window[-1] + 1
    return f"step_s: mean of step {first}" if first == last else f"step_s: mean of steps {first} to {last}"


def cost_words(cfg) -> str:
    """Says when the seconds are the cost model's illustrative defaults (no pool's costs given)."""
    from pdsr_sdk.sim.config import COST_KEYS, EngineProfile

    default = EngineProfile()
    if all(getattr(p, k) == getattr(default, k) for p in (cfg.profiles.fast, cfg.profiles.heavy) for k in COST_KEYS):
        return "; seconds from the illustrative cost model (--profile gives measured ones; ratios are what to read)"
    return ""


def batch_words(tb, cfg) -> str:
    """How the trace was cut into batches, saying where a batch is short or fewer ran than --num-batches asked."""
    sizes = [len(b) for b in tb.batches]
    words = f"{len(sizes)} batch(es) of {cfg.batch_size} prompts"
    if sizes[-1] < cfg.batch_size:
        words += (f" (the last has {sizes[-1]}: the trace ran out)" if len(sizes) > 1
                  else f" (the trace holds only {sizes[0]} group{'' if sizes[0] == 1 else 's'}: one short batch)")
    if cfg.num_batches is not None and len(sizes) < cfg.num_batches:
        words += f"; --num-batches asked for {cfg.num_batches}, the trace holds {len(sizes)}"
    return words


def fastest_words(report) -> str:
    budget = report.cfg.max_partial_share
    pick = report.fastest_within()
    floor = (f"\nfloor: no schedule of these engines in equal steps goes below {report.floor_s:.4g} s = "
             f"{report.floor_ratio:.3f}x within {budget:.1%} partial tokens (steps.json's floor_s)"
             if report.floor_ratio is not None else "")
    if pick is None:
        return f"no over-provision kept the partial share within {budget:.1%}" + floor
    auto = report.cfg.update == "auto"
    return (f"fastest within {budget:.1%} partial tokens: " + (f"update {pick.update}, " if auto else "")
            + f"F = {pick.over_provision:.3g} ({pick.in_flight} groups in flight), steady step "
            f"{pick.steady_step_s:.4g} s = {report.ratio(pick) or 0.0:.3f}x the on-policy step "
            f"(partial {pick.partial_share:.1%}, oldest token {pick.max_age} version{'' if pick.max_age == 1 else 's'} "
            f"old; per consumed token "
            f"{report.ratio_per_token(pick) or 0.0:.3f}x)" + _carried_words(pick)
            + (_other_update_words(report, pick) if auto else "") + floor)


def _other_update_words(report, pick) -> str:
    """With ``update: auto``: the fastest run within the budget of the update the pick does not have."""
    update = "all" if pick.update == "staggered" else "staggered"
    other = report.fastest_within(update)
    if other is None:
        return f"\nwith update {update}: no F within the budget"
    return (f"\nwith update {other.update}: fastest within F = {other.over_provision:.3g}, "
            f"{report.ratio(other) or 0.0:.3f}x (partial {other.partial_share:.1%}; off-policy tokens "
            f"{other.off_policy_share:.1%} against {pick.off_policy_share:.1%})")


def _carried_words(run) -> str:
    made = run.carried_made_before
    if made is None:
        return ""
    per_step = run.carried_responses / len(run.steps)
    return (f"\nits partial tokens: {per_step:.3g} responses a step crossed an update, {made:.0%} of their tokens "
            f"made before it")


#: how the run's header names the update (``--update``)
UPDATE_WORDS = {"all": "", "staggered": "; staggered update", "auto": "; each F with update all and staggered"}


def trainer_words(cfg) -> str:
    if not cfg.trained:
        return ""
    how = "pipelined" if cfg.pipeline else "synchronous"
    return (f"; {how} trainer {cfg.trainer_s:g} s a step, weight load {cfg.weight_update_s:g} s (in the on-policy "
            f"step too)")
