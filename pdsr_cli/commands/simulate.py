"""``pdsr simulate``: replay a length trace through dispatch policies on simulated engines;
``pdsr simulate calibrate``: fit engine profiles from a real run's timings."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pdsr_cli.common import (POLICY_SET_METAVAR, build_config, check_policy_set_targets, cli_progress,
                             config_option, deprecated_flag, format_table, handle_errors, parse_policy_sets,
                             policy_option, policy_set_option, quiet_option, UserPathType)
from pdsr_cli.commands.trace import list_family
from pdsr_cli.commands.simulate_notes import (COUNTER_COLUMNS, batch_words, cost_words, fastest_words, steady_words,
                                              table_notes, trainer_words, UPDATE_WORDS)
from pdsr_cli.input_warnings import warn_failed_samples, warn_if_in_progress
from pdsr_cli.out_dir import remove_other_outputs
from pdsr_cli.stream_options import step_stream_options

@click.group("simulate", invoke_without_command=True)
@click.option("--trace", "trace", type=UserPathType(dir_okay=False, path_type=Path), default=None,
              help="Length trace (JSONL), trajectories Parquet/Arrow file from `pdsr rollout`, or slime's rollout "
                   "dump (.pt).  [default: a "
                   "built-in synthetic trace (`pdsr trace synth`'s defaults, the `informative` family member: median "
                   "~420 tokens, p99 ~1.4k), written to "
                   "pdsr's cache on first use, with the groups the run needs]")
@policy_option("Policy ({runnable}, a preset, 'pkg.mod:Class'; or a reference schedule: {references}), a "
               "comma-separated list, or 'all' (every registered policy that runs on real engines, side by side).  "
               "[default: v3]")
@click.option("--references/--no-references", "references", default=None,
              help="Also run baseline (if missing) and the simulator-only reference schedules oracle (true "
                   "lengths) and oracle-probe (probe lengths known from the start), for the vs_base and share "
                   "columns.  [default: on when more than one policy is selected; one policy runs beside baseline "
                   "alone]")
@policy_set_option
@deprecated_flag("--policy-set", "--set", "old_policy_set", multiple=True, metavar=POLICY_SET_METAVAR)
@click.option("--fast", type=int, default=None, help="Engines in the fast pool.  [default: 6]")
@click.option("--heavy", type=int, default=None, help="Engines in the heavy pool.  [default: 2]")
@click.option("--batch-size", type=int, default=None, help="Prompts per batch (B).  [default: 128]")
@click.option("--n", "n", type=int, default=None,
              help="Samples per prompt (the first n of each group).  [default: all]")
@click.option("--num-batches", type=int, default=None,
              help="Simulate only the first this many batches (not with --steps, which takes steps x step-groups).")
@click.option("--family", "family", type=str, default=None, is_eager=True, callback=list_family,
              help="A member of the workload family (`--family list` lists them): its engines (its pinned profile, "
                   "under --profile's keys) and, without --trace, its trace, drawn as `pdsr trace synth --family` "
                   "draws it (cached).  [default: none: the built-in trace and profile]")
@click.option("--seed", "seed", type=int, default=None,
              help="With --family and no --trace: the draw's seed.  [default: the member's first pinned seed, 101]")
@click.option("--profile", "profile", type=UserPathType(dir_okay=False, path_type=Path), default=None,
              help="Engine profile file ({fast: {...}, heavy: {...}}, e.g. from `pdsr simulate calibrate`; one "
                   "pool's section is given to both); overrides --config's profiles.  [default: one illustrative "
                   "GPU-like profile for every engine]")
@click.option("--segment-min", type=int, default=None, help="Shortest dynamic segment (L_min).  [default: 64]")
@click.option("--segment-max", type=int, default=None, help="Longest dynamic segment (L_max).  [default: 4096]")
@click.option("--no-segments", is_flag=True, default=None, help="Run each request to its end (or cap) in one go.")
@click.option("--hold-turn-slots", is_flag=True, default=None,
              help="A trace of turns: every policy's samples keep their slot while their environment works (as a "
                   "framework that holds the request through a tool call).  [default: a parked sample frees it; "
                   "with references the report adds baseline-hold]")
@click.option("--out-dir", type=UserPathType(file_okay=False, path_type=Path), default=None,
              help="Write simulate.json and timeline.png here (with --steps: steps.json, the curve steps.png and "
                   "timeline.png); files of the same names there are replaced, and those of these four names this "
                   "run does not write (an earlier run's) are removed.  [default: print only]")
@click.option("--no-timeline", is_flag=True, default=None, help="Do not draw the PNG timeline.")
@step_stream_options("the trace's groups (compared with the on-policy baseline at the same B)",
                     "the curve F = 0, 0.25, 0.5, 1", auto_update=True)
@click.option("--trainer-s", type=float, default=None,
              help="With --steps: seconds the trainer trains on a step before it updates the weights (the engines "
                   "stop meanwhile unless --pipeline; the on-policy baseline's steps take it too).  [default: 0]")
@click.option("--weight-update-s", type=float, default=None,
              help="With --steps: seconds the engines stop to load each update.  [default: 0]")
@click.option("--pipeline", is_flag=True, default=None,
              help="With --steps: the trainer trains on step k while step k + 1 generates; its update lands in the "
                   "middle of the next step, which does not end before it (one step off-policy).")
@click.option("--restart-lengths", type=click.Choice(["replay", "redraw"]), default=None,
              help="With --steps: the length a restarted sample generates. redraw: a fresh draw, as RL sampling makes "
                   "one (the cap with the prompt's chance of reaching it, fitted over the trace, else one of its "
                   "group's other lengths); replay: its recorded length again (as a length-controlled replay on real "
                   "engines).  [default: redraw]")
@click.option("--max-partial-share", type=float, default=None,
              help="With --steps and no --over-provision: run F = 0, 0.05, ..., 0.5 (staggered runs also "
                   "0.75 to 1.5), refine between the fastest F whose partial share (tokens from responses carried "
                   "across a weight update) is at most this and the next one over it (bisecting the groups in "
                   "flight), and name the fastest within, e.g. 0.1.")
@click.option("--speculative", metavar="METHOD", default=None,
              help="Model speculative decoding in every engine with METHOD's acceptance (ngram, group, ...) from "
                   "--acceptance (bench/spec.py's file): a token costs a verify step over the tokens it yields while "
                   "at most --speculation-max-batch requests run. See docs/simulate.md.  [default: off]")
@click.option("--acceptance", type=UserPathType(dir_okay=False, path_type=Path), default=None,
              help="bench/spec.py's acceptance file (--acceptance-out), read with --speculative.")
@click.option("--speculation-max-batch", type=int, default=None,
              help="With --speculative: drafting only while at most this many requests run.  [default: 32]")
@quiet_option
@config_option
@click.pass_context
@handle_errors
def command(ctx: click.Context, trace, policy, references, policy_set, old_policy_set, fast, heavy, batch_size, n,
            num_batches, family, seed, profile, segment_min, segment_max, no_segments, hold_turn_slots, out_dir,
            no_timeline, steps, over_provision,
            step_groups, max_staleness, group_deadline, kv_on_update, filter_groups, trainer_s, weight_update_s,
            pipeline, update, restart_lengths, max_partial_share, speculative, acceptance, speculation_max_batch, quiet,
            config_path) -> None:
    """Replay recorded response lengths through dispatch policies on simulated engines, in virtual time.

    Every sample generates exactly its recorded length; batches are consecutive groups of B prompts
    run one after another. Engines batch continuously with a step-time cost model
    (c0 + c1*running + c2*context tokens, plus prefill), a block-granular KV cache with preemption,
    and prefix caching as vLLM's: segment continuations, and a prompt shared by the requests of one
    group on one engine (profile key prompt_cache). Engines are equal by default (heavy is a role);
    --profile may give a pool other numbers. Prints per policy: makespan and its ratio to baseline's,
    a lower bound and the ratio to it, the share of each reference schedule's gain over baseline it
    takes, tokens/s, busy fraction per pool, the share of time on the last 10% of samples, and the
    policy's counters; --out-dir writes the JSON report and an engines x time PNG.

    A trace of turns (multi-turn samples: `pdsr trace synth --family multi-turn`) replays each turn as a
    request: between turns the sample waits out its environment's delay holding no slot, then the engine
    that ran its last turn prefills the environment's tokens; the table adds env_slot (the share of
    slot-time held by waiting samples) and, with references, baseline-hold (baseline keeping each slot
    through the wait; --hold-turn-slots runs every policy so).

    Reference schedules (simulator only; they read the trace): oracle keeps, per batch, the better
    of true-length longest-first over all engines and the longest 2% alone on the heavy pool with
    the rest longest-first on the fast pool; oracle-probe knows each group's probe length from the
    start and nothing else, and runs longest-first by it.

    \b
    Examples:
      pdsr simulate --policy all                  # the built-in synthetic trace, every policy
      pdsr simulate --trace examples/traces/synth_256x8.jsonl --policy all --fast 6 --heavy 2
      pdsr simulate --trace lengths.jsonl --policy v2.5 --set cap_multiplier=2 --out-dir sim
      pdsr simulate --trace run.parquet --profile profile.yaml --policy all
      pdsr simulate calibrate --trajectories run.parquet --out profile.yaml
      pdsr simulate --trace lengths.jsonl --steps 10 --step-groups 128 --max-staleness 2 --out-dir steps
      pdsr simulate --steps 10 --step-groups 128 --max-staleness 2 --trainer-s 20 --pipeline
      pdsr simulate --steps 10 --step-groups 128 --max-staleness 2 --max-partial-share 0.1
      pdsr simulate --profile bench/data/profile-h100-7b.yaml --speculative group --acceptance acceptance.json
    """
    if ctx.invoked_subcommand is not None:
        return
    from pdsr_cli.quiet import output_mode
    from pdsr_sdk.errors import ConfigError
    from pdsr_sdk.sim.config import SimulateConfig, load_profile_file
    from pdsr_sdk.sim.driver import apply_policy_sets, run_names, simulate
    from pdsr_sdk.sim.steps import builtin_trace_groups
    from pdsr_sdk.traces import default_trace_path, read_trace

    overrides = {
        "trace": trace, "policy": policy, "references": references, "fast": fast, "heavy": heavy,
        "batch_size": batch_size, "n": n,
        "num_batches": num_batches, "segments.min_tokens": segment_min, "segments.max_tokens": segment_max,
        "segments.enabled": False if no_segments else None, "hold_turn_slots": hold_turn_slots, "out_dir": out_dir,
        "timeline": False if no_timeline else None, "steps": steps, "over_provision": over_provision,
        "step_groups": step_groups, "max_staleness": max_staleness, "group_deadline": group_deadline,
        "kv_on_update": kv_on_update, "filter_groups.kind": filter_groups, "trainer_s": trainer_s,
        "weight_update_s": weight_update_s,
        "pipeline": pipeline, "update": update,
        "restart_lengths": restart_lengths, "max_partial_share": max_partial_share,
    }
    profiles = _family_profiles(family, seed, trace)
    for pool, values in (load_profile_file(profile) if profile is not None else {}).items():
        profiles[pool] = {**profiles.get(pool, {}), **values}
    for pool, values in profiles.items():
        overrides.update({f"profiles.{pool}.{k}": v for k, v in values.items()})
    if no_segments and (segment_min is not None or segment_max is not None):
        raise ConfigError("--segment-min / --segment-max size the dynamic segments that --no-segments turns off: "
                          "give one or the other")
    if (speculative is None) != (acceptance is None):
        raise ConfigError("--speculative METHOD and --acceptance FILE go together (bench/spec.py writes the file)")
    if speculative is not None:
        from pdsr_sdk.sim.speculation import speculation_from_acceptance

        spec = speculation_from_acceptance(acceptance, speculative, max_batch=speculation_max_batch or 32)
        overrides.update({f"profiles.{pool}.speculation": with_profile_verify_cost(spec, profiles.get(pool, {}))
                          for pool in ("fast", "heavy")})
    elif speculation_max_batch is not None:
        raise ConfigError("--speculation-max-batch applies with --speculative")
    cfg = build_config(SimulateConfig, config_path, overrides)
    if cfg.out_dir is not None:   # before the run: a file in the way is an error now, not a traceback after it
        from pdsr_sdk.io.tables import check_writable

        check_writable(cfg.out_dir / "simulate.json", "out_dir (--out-dir)")
    if cfg.trace is None and family is not None:
        cfg = cfg.model_copy(update={"trace": default_trace_path(builtin_trace_groups(cfg), family, seed)})
        click.echo(f"pdsr: no --trace: the {family} member's trace {cfg.trace} on its engines", err=True)
    elif cfg.trace is None:
        cfg = cfg.model_copy(update={"trace": default_trace_path(builtin_trace_groups(cfg))})
        click.echo(f"pdsr: no --trace: the built-in synthetic trace {cfg.trace} (`pdsr trace synth` defaults)",
                   err=True)
    sets, old_sets = parse_policy_sets(policy_set), parse_policy_sets(old_policy_set, "--policy-set")
    check_policy_set_targets(sets, run_names(cfg))
    check_policy_set_targets(old_sets, run_names(cfg), "--policy-set")
    cfg = apply_policy_sets(cfg, sets + old_sets)
    warn_if_in_progress(cfg.trace, "trace (--trace)")
    tr = read_trace(cfg.trace, setting="trace (--trace)")
    warn_failed_samples(tr, "trace (--trace)")
    if cfg.steps is not None:
        with output_mode(quiet):
            _run_steps(tr, cfg, quiet)
        return
    cfg = _beside_baseline(cfg)
    with output_mode(quiet):
        report = simulate(tr, cfg, progress=cli_progress(quiet))
    if cfg.out_dir is not None:
        remove_other_outputs(cfg.out_dir, OUT_DIR_FILES,
                             {"simulate.json", "timeline.png"} if cfg.timeline else {"simulate.json"})
        write_outputs(report, cfg.out_dir)
    tb = report.batches
    click.echo(f"{cfg.trace}: {tb.num_groups} group{'' if tb.num_groups == 1 else 's'}, {tb.num_samples} samples in "
               f"{batch_words(tb, cfg)}; "
               f"engines: {cfg.fast} fast ({cfg.profiles.fast.max_num_seqs} seqs), "
               f"{cfg.heavy} heavy ({cfg.profiles.heavy.max_num_seqs} seqs)"
               + (f"; {tb.zero_length_samples} zero-length samples run as 1 token" if tb.zero_length_samples else "")
               + cost_words(cfg))
    rows = report.rows()
    click.echo(format_table(rows, hide_empty=COUNTER_COLUMNS))
    click.echo(table_notes(rows, sum(r.wall_s for r in report.runs)))
    if cfg.out_dir is not None:
        click.echo(f"wrote {cfg.out_dir / 'simulate.json'}" + "".join(f"\nwrote {p}" for p in report.timelines))


def _family_profiles(family: str | None, seed: int | None, trace: Path | None) -> dict[str, dict]:
    """Both pools' profile keys of the workload member ``family`` (none without one); ``seed`` only draws its
    trace, so it needs the member and no --trace."""
    from pdsr_sdk.errors import ConfigError

    if seed is not None and (family is None or trace is not None):
        raise ConfigError("--seed draws --family's trace: give --family NAME and no --trace"
                          if family is None else "--seed draws --family's trace, and --trace gives one: drop one")
    if family is None:
        return {}
    from pdsr_sdk.traces.family import workload

    profile = dict(workload(family).measure.profile)
    return {"fast": dict(profile), "heavy": dict(profile)}


def _beside_baseline(cfg):
    """One policy other than baseline, references not asked for either way: run baseline beside it, the comparison
    a run of one policy is for (``vs_base``), without the reference schedules."""
    from pdsr_sdk.policies.resolve import policy_names, reference_policies

    names = policy_names(cfg.policy)
    if cfg.references is None and len(names) == 1 and names[0] != "baseline" and names[0] not in reference_policies():
        return cfg.model_copy(update={"policy": f"baseline,{cfg.policy}", "references": False})
    return cfg


def with_profile_verify_cost(spec: dict, profile: dict) -> dict:
    """The acceptance file's speculation section, with the verify cost a profile file holds (one fitted by
    `pdsr simulate calibrate` from a run with speculation) in place of the H100 table."""
    own = profile.get("speculation") or {}
    if "verify_cost" not in own:
        return spec
    return {**spec, "verify_cost": own["verify_cost"],
            "num_speculative_tokens": own.get("num_speculative_tokens", spec.get("num_speculative_tokens", 4))}


def _run_steps(tr, cfg, quiet: bool) -> None:
    from pdsr_sdk.io.tables import write_text_atomic
    from pdsr_sdk.sim.steps import simulate_steps
    from pdsr_sdk.sim.steps_plot import write_steps_plot
    from pdsr_sdk.sim.timeline import write_steps_timeline

    report = simulate_steps(tr, cfg, progress=cli_progress(quiet))
    b = cfg.step_groups or cfg.batch_size
    click.echo(f"{cfg.trace}: {cfg.steps} steps of {b} groups, policy {cfg.policy}, max staleness "
               f"{cfg.max_staleness if cfg.max_staleness is not None else 'none'}; engines: {cfg.fast} fast, "
               f"{cfg.heavy} heavy; " + ("verl's DAPO recipe (batches of 3 x B, filtered, up to 10 a step) step"
                                         if cfg.filter_groups is not None else "on-policy baseline step")
               + f" {report.baseline_step_s:.4g} s" + trainer_words(cfg)
               + ("; restarted samples draw fresh lengths" if cfg.restart_lengths == "redraw"
                  else "; restarted samples replay their recorded lengths")
               + ("; KV kept across updates" if cfg.kv_on_update == "keep" else "")
               + UPDATE_WORDS[cfg.update] + cost_words(cfg))
    if len(report.runs) == 1:
        click.echo(format_table(report.step_rows(report.runs[0])))
        click.echo(format_table(report.engine_rows(report.runs[0])))
    click.echo(format_table(report.rows()))
    click.echo("(" + steady_words(cfg.steps) + "; ratio = step_s / on-policy step; token_ratio = tokens the steps "
               "consumed / the trace's lengths of the same groups (below 1: restarts swapped long responses for "
               "shorter fresh draws), "
               "per_token = ratio / token_ratio; vs_bound = step_s / the work "
               "bound, the consumed tokens generated at full occupancy (bound_s per step); off_policy: share of "
               "consumed tokens from an older policy version, partial: the part of it from responses carried "
               "across a weight update; restarts: samples restarted (all causes), wasted: their thrown-away tokens; "
               "held_s: time steps waited for due groups; max_lag: most steps a consumed group was in flight; "
               "left_over: groups not consumed, those in flight after the last step (the next step's carry) and "
               "any dynamic sampling dropped"
               + ("; per engine: token_share of the tokens generated, seqs_per_step = the mean batch it ran, busy = "
                  "share of the run's time with a step running, prefill = share of that spent prefilling, lane = "
                  "kept light for long samples" if len(report.runs) == 1
                  else "; per engine: steps.json with --out-dir" if cfg.out_dir is None else "; per engine: steps.json")
               + ")")
    if cfg.max_partial_share is not None:
        click.echo(fastest_words(report))
    if cfg.out_dir is not None:
        remove_other_outputs(cfg.out_dir, OUT_DIR_FILES,
                             {"steps.json", "steps.png"} | ({"timeline.png"} if cfg.timeline else set()))
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        report.plots.append(write_steps_plot(report, cfg.out_dir / "steps.png"))
        if cfg.timeline:
            report.plots.append(str(write_steps_timeline(report, cfg.out_dir / "timeline.png")))
        write_text_atomic(json.dumps(report.to_dict(), indent=2) + "\n", cfg.out_dir / "steps.json")
        click.echo(f"wrote {cfg.out_dir / 'steps.json'}" + "".join(f"\nwrote {p}" for p in report.plots))


#: every file `pdsr simulate --out-dir` writes (one batch: the first two; --steps: the last three)
OUT_DIR_FILES = ("simulate.json", "timeline.png", "steps.json", "steps.png")


def write_outputs(report, out_dir: Path) -> None:
    from pdsr_sdk.io.tables import write_text_atomic
    from pdsr_sdk.sim.timeline import write_timeline

    out_dir.mkdir(parents=True, exist_ok=True)
    if report.cfg.timeline:
        report.timelines.append(str(write_timeline(report, out_dir / "timeline.png")))
    write_text_atomic(report.to_json() + "\n", out_dir / "simulate.json")


@command.command("calibrate", short_help="Fit engine profiles (c0, c1, c2, prefill per pool) from a rollout run.")
@click.option("--trajectories", "trajectories", multiple=True, type=UserPathType(dir_okay=False, path_type=Path),
              help="Trajectories Parquet/Arrow file(s) written by `pdsr rollout` (repeatable).")
@click.option("--out", "out", type=UserPathType(dir_okay=False, path_type=Path), default=None,
              help="Where to write the profile YAML (use it with `pdsr simulate --profile`); an existing file is an "
                   "error unless --overwrite.")
@click.option("--overwrite", is_flag=True, default=None, help="Replace an existing --out file.")
@click.option("--block-size", type=int, default=None, help="KV block size of the engines that ran.  [default: 16]")
@click.option("--iterations", type=int, default=None, help="Refinement passes of the fit.  [default: 8]")
@click.option("--shared", is_flag=True, default=None,
              help="One fit over every pool's segments (same hardware and model in all pools).  [default: per pool]")
@click.option("--speculation-max-batch", type=int, default=None,
              help="A run with speculation: the batch size up to which it drafted.  [default: the run's summary "
                   "says, else every batch size]")
@config_option
@handle_errors
def calibrate_cmd(trajectories, out, overwrite, block_size, iterations, shared, speculation_max_batch,
                  config_path) -> None:
    """Fit the simulator's cost model per pool from the segment timings a `pdsr rollout` run recorded.

    Each segment's duration is modelled as the sum of its steps' times (c0 + c1*running +
    c2*context tokens, plus prefill of requests joining); the engines' batches over time are
    rebuilt from all segments; a non-negative least-squares fit alternates with re-estimating how
    many steps fell in each interval. Writes {fast: {...}, heavy: {...}} for --profile, with each
    pool's max_num_seqs and KV capacity from the run's summary (the .summary.json beside the file).

    It measures the engines the run ran on: a run on this machine's CPU gives a CPU profile. For GPUs
    not at hand, write the profile's keys yourself (seconds and tokens; docs/simulate.md, and
    bench/data/profile-h100-7b.yaml: a 7B model on one H100, each number's source beside it).

    Prints per pool: the segments fitted (spans) and the outliers left out, its engines, the fitted
    costs in seconds (c0_s a step, c1_s_per_seq per running sequence, c2_s_per_token per context
    token, prefill_s_per_token), and how well they predict the spans' durations (r2, and median_err,
    the median relative error); under R^2 0.5 or over 25% a warning says the profile predicts little.

    From a run with speculation (`pdsr rollout --speculative ...`: each segment records its drafted and
    accepted tokens) a segment took fewer steps than tokens, and a step costs more per drafted token it
    checks: that price is fitted too and written as the profile's speculation section (the verify cost
    by batch size, and the run's acceptance), which `pdsr simulate --profile` then uses.

    \b
    Example:
      pdsr simulate calibrate --trajectories runs/rollout.parquet --out profile.yaml
    """
    from pdsr_sdk.io.tables import check_new_output, write_text_atomic
    from pdsr_sdk.sim.calibrate import calibrate, fit_warnings, profile_yaml
    from pdsr_sdk.sim.config import CalibrateConfig

    cfg = build_config(CalibrateConfig, config_path, {
        "trajectories": [str(p) for p in trajectories] or None, "out": out, "overwrite": overwrite,
        "block_size": block_size,
        "iterations": iterations, "per_pool": False if shared else None,
        "speculation_max_batch": speculation_max_batch})
    if not cfg.trajectories:
        raise click.UsageError("give at least one --trajectories FILE")
    if cfg.out is None:
        raise click.UsageError("give --out FILE for the fitted profile")
    check_new_output(cfg.out, "out (--out)", overwrite=cfg.overwrite,
                     inputs=[("--trajectories", p) for p in cfg.trajectories])
    fits = calibrate(cfg.trajectories, block_size=cfg.block_size, iterations=cfg.iterations,
                     min_spans=cfg.min_spans, per_pool=cfg.per_pool, speculation_max_batch=cfg.speculation_max_batch)
    write_text_atomic(profile_yaml(fits, cfg.trajectories), cfg.out)
    rows = [{"pool": f.pool, "spans": f.spans, "outliers": f.outliers, "engines": f.engines,
             "c0_s": f.coefficients["c0_s"],
             "c1_s_per_seq": f.coefficients["c1_s_per_seq"], "c2_s_per_token": f.coefficients["c2_s_per_token"],
             "prefill_s_per_token": f.coefficients["prefill_s_per_token"], "r2": f.r2,
             "median_err": f.median_rel_error,
             **({} if f.verify_s_per_token is None else {"verify_s_per_token": f.verify_s_per_token})}
            for f in fits.values()]
    click.echo(format_table(rows))
    for line in fit_warnings(fits):
        click.echo(f"warning: {line}", err=True)
    click.echo(f"wrote {cfg.out}")
