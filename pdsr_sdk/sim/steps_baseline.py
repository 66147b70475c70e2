"""The on-policy step times a multi-step run (:mod:`pdsr_sdk.sim.steps`) is compared with: the ordinary batch
simulation with ``baseline`` at the same B (:func:`on_policy_steps`), or under dynamic sampling verl's DAPO recipe
(:func:`dapo_recipe_steps`), each step after the first with the trainer's time and the weight load added."""

from __future__ import annotations

from pdsr_sdk.dispatch.steps import GROUP_FILTERS
from pdsr_sdk.errors import DataError
from pdsr_sdk.progress import ProgressFactory, silent_progress
from pdsr_sdk.sim.batches import trace_batches
from pdsr_sdk.sim.config import SimulateConfig

#: verl's DAPO recipe: prompts a generation batch takes, as a multiple of B (``data.gen_batch_size``), and the most
#: generation batches a step may take (``algorithm.filter_groups.max_num_gen_batches``; 0 = no limit)
DAPO_GEN_FACTOR = 3
DAPO_MAX_GEN_BATCHES = 10


def trace_rewards(trace, cfg: SimulateConfig) -> dict[str, list[float | None]]:
    """Dynamic sampling's rewards by prompt id (the trace's ``rewards``), or a DataError saying the trace has none."""
    rewards = trace.group_rewards()
    if not rewards:
        raise DataError(f"{cfg.trace or trace.source}: filter_groups (--filter-groups) filters groups by their "
                        f"rewards, and the trace has none: give each line a 'rewards' list (one number or null "
                        f"per sample), or a trajectories file with a reward column")
    return rewards


def on_policy_steps(trace, cfg: SimulateConfig, *, progress: ProgressFactory = silent_progress) -> list[float]:
    """Makespans of the ordinary batch simulation with ``baseline`` at the same B over K batches, each after the
    first with the trainer's time and the weight load added (a synchronous loop, whatever ``pipeline`` says)."""
    from pdsr_sdk.sim.driver import run_policy

    b = cfg.step_groups or cfg.batch_size
    base_cfg = cfg.model_copy(update={"batch_size": b, "num_batches": cfg.steps})
    batches = trace_batches(trace, base_cfg)
    if len(batches.batches) < cfg.steps:
        raise DataError(f"{batches.source}: the on-policy baseline needs {cfg.steps} batches of {b} groups; the "
                        f"trace has {batches.num_groups} groups")
    run = run_policy(batches, base_cfg, "baseline", record=False, progress=progress)
    # a synchronous trainer between batches: the engines idle while it trains and while they load
    between = cfg.trainer_s + cfg.weight_update_s
    return [o.makespan_s + (between if i else 0.0) for i, o in enumerate(run.batches)]


def dapo_plan(trace, cfg: SimulateConfig, *, gen_factor: int = DAPO_GEN_FACTOR,
              max_gen_batches: int = DAPO_MAX_GEN_BATCHES) -> list[int]:
    """How many generation batches of ``gen_factor x B`` groups (consecutive groups of the trace) each of
    ``cfg.steps`` steps of verl's DAPO recipe takes until B of their groups pass the filter (the trace's rewards)."""
    b = cfg.step_groups or cfg.batch_size
    rewards = trace_rewards(trace, cfg)
    kind = GROUP_FILTERS[cfg.filter_groups.kind] if cfg.filter_groups is not None else (lambda rs: True)
    batches = trace_batches(trace, cfg.model_copy(update={"batch_size": gen_factor * b, "num_batches": None})).batches
    plan: list[int] = []
    used = 0
    for step in range(cfg.steps):
        kept = made = 0
        while kept < b:
            if max_gen_batches > 0 and made >= max_gen_batches:
                raise DataError(f"{cfg.trace or trace.source}: DAPO recipe: step {step + 1} generated {made} batches "
                                f"(max_num_gen_batches) with {kept} of {b} groups passing the filter")
            if used >= len(batches) or len(batches[used]) < gen_factor * b:
                raise DataError(f"{cfg.trace or trace.source}: the DAPO recipe ran out of groups at step {step + 1} "
                                f"of {cfg.steps} (batches of {gen_factor * b}); give a longer trace")
            kept += sum(bool(kind(rewards[pid][:len(lens)])) for pid, _, lens, *_ in batches[used])
            used += 1
            made += 1
        plan.append(made)
    return plan


def dapo_recipe_steps(trace, cfg: SimulateConfig, *, gen_factor: int = DAPO_GEN_FACTOR,
                      max_gen_batches: int = DAPO_MAX_GEN_BATCHES,
                      progress: ProgressFactory = silent_progress) -> list[float]:
    """Step times of verl's DAPO recipe (``recipe/dapo``: dynamic sampling, on-policy) on the trace, with ``baseline``:
    each step generates batches of ``gen_factor x B`` groups one after another (each waits for its longest
    sample), filters each batch's groups (``cfg.filter_groups``, the trace's rewards), and stops once B groups have
    passed, keeping B (the rest are dropped); more than ``max_gen_batches`` batches in one step is an error, as in
    verl. Each step after the first also has the trainer's time and the weight load (a synchronous loop)."""
    from pdsr_sdk.sim.driver import run_policy

    b = cfg.step_groups or cfg.batch_size
    plan = dapo_plan(trace, cfg, gen_factor=gen_factor, max_gen_batches=max_gen_batches)
    used = sum(plan)
    run_cfg = cfg.model_copy(update={"batch_size": gen_factor * b, "num_batches": used})
    run = run_policy(trace_batches(trace, run_cfg), run_cfg, "baseline", record=False, progress=progress)
    makespans = [o.makespan_s for o in run.batches]
    between = cfg.trainer_s + cfg.weight_update_s
    steps, i = [], 0
    for k, made in enumerate(plan):
        steps.append(sum(makespans[i:i + made]) + (between if k else 0.0))
        i += made
    return steps
