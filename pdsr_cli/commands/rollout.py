"""``pdsr rollout``: generate GRPO groups with a P-DSR policy on vLLM engines."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click

from pdsr_cli.common import (build_config, check_policy_set_targets, check_speculative_flags, cli_progress,
                             config_option, echo_status,
                             format_summary, format_table, handle_errors, parse_policy_sets, policy_option,
                             policy_set_option, quiet_option, speculative_options, UserPathType)
from pdsr_cli.stream_options import step_stream_options
from pdsr_sdk.rollout.config import INSTRUCTIONS, DataConfig


@click.command("rollout")
@config_option
@policy_option("Dispatch policy ({runnable}), a built-in preset, a preset file, or 'package.module:Class'; "
               "a comma-separated list, or 'all' (every registered policy that runs on real engines): one run "
               "per policy, each to <out stem>.<policy>.parquet.  [default: v3]")
@policy_set_option
@click.option("--data", type=UserPathType(path_type=Path),
              help="Prompts: a Parquet, JSONL (or a .json array), Arrow IPC or CSV/TSV file, or a folder or quoted "
                   "glob pattern ('train-*.parquet') of such shards.  [default: the built-in sample prompts]")
@click.option("--model", help="Local Hugging Face model directory.  [default: the built-in tiny random model]")
@click.option("--n", type=int, help="Samples per prompt (group size).  [default: 8]")
@click.option("--batch-size", type=int, help="Prompts per batch.  [default: 128]")
@click.option("--num-batches", type=int, help="The run's batches in all: with --resume, those on disk count "
                                                 "(a finished run runs nothing).  [default: all the data]")
@click.option("--limit", type=int, help="Use only the first N prompts.")
@click.option("--max-tokens", type=int, help="Most response tokens per sample.  [default: 1024]")
@click.option("--temperature", type=float, help="Sampling temperature.  [default: 1.0]")
@click.option("--top-p", type=float, help="Nucleus sampling mass.  [default: 1.0]")
@click.option("--top-k", type=int, help="Top-k sampling; 0 disables it.  [default: 0]")
@click.option("--stop", multiple=True, metavar="TEXT",
              help="A stop string that ends a response (repeatable; e.g. --stop '</answer>').")
@click.option("--stop-token-id", "stop_token_ids", multiple=True, type=int, metavar="ID",
              help="A token id that ends a response besides the model's EOS (repeatable; e.g. a chat template's "
                   "<|im_end|>).")
@click.option("--min-p", type=float, help="Min-p sampling; 0 disables it.  [default: 0]")
@click.option("--repetition-penalty", type=float,
              help="vLLM's repetition penalty over prompt and response tokens; 1 is off.  [default: 1]")
@click.option("--presence-penalty", type=float,
              help="vLLM's presence penalty (-2 to 2); needs --no-segments.  [default: 0]")
@click.option("--frequency-penalty", type=float,
              help="vLLM's frequency penalty (-2 to 2); needs --no-segments.  [default: 0]")
@click.option("--ignore-eos", is_flag=True, default=None, help="Generate to max tokens (or forced lengths) past EOS.")
@click.option("--fast", type=int, help="Engines in the fast pool (automatic layout).")
@click.option("--heavy", type=int, help="Engines in the heavy pool (automatic layout).")
@click.option("--ray", "ray_address", metavar="ADDRESS",
              help="Run the engines as Ray actors on this cluster: 'auto' (the one this machine joined with "
                   "`ray start`), 'local' (start a one-machine cluster), 'HOST:6379', or 'ray://HOST:10001'. "
                   "See docs/ray.md.  [default: local engines, no Ray]")
@click.option("--prompt-column", help="Prompt column: text, or chat messages (verl's prompt); a dotted path reads a "
                                     "struct's field.  [default: the first of prompt, problem, question, input, "
                                     "context_messages]")
@click.option("--messages-column", help="Chat messages column (list of {role, content}).")
@click.option("--system-prompt", metavar="TEXT", help=DataConfig.model_fields["system_prompt"].description)
@click.option("--instruction", metavar="NAME",
              help=f"Append a standard instruction to each prompt ({', '.join(INSTRUCTIONS)}); e.g. math: "
                   f"'{INSTRUCTIONS['math']}'.")
@click.option("--id-column", help="Prompt id column.  [default: id/unique_id/prompt_id, else row number]")
@click.option("--ground-truth-column", help="Reference answer column (a dotted path reads a struct's field; a list or "
                                           "struct one goes to a --reward pkg.mod:fn as it is).  "
                                           "[default: the first of answer, ground_truth, reward_model.ground_truth, "
                                           "label]")
@click.option("--data-source", metavar="NAME", help=DataConfig.model_fields["data_source"].description)
@click.option("--target-lengths-column",
              help="Per-sample forced lengths (length-controlled replay; needs --ignore-eos).")
@click.option("--skip-long", is_flag=True, default=None,
              help="Skip prompts whose tokens plus --max-tokens exceed the model's context (counted in the summary); "
                   "without it such a prompt is an error naming its row.")
@click.option("--reward", help="math_verify (the response's last \\boxed{}, else its GSM8K '#### N', else its DAPO "
                              "'Answer: N', against the ground truth), math_boxed (its pure-Python fallback), none, "
                              "auto (math_verify when the data has a ground truth), 'package.module:fn' or "
                              "'path/to/file.py:fn'.  [default: auto]")
@click.option("--reward-executor", type=click.Choice(["thread", "process"]),
              help="Run reward functions on worker threads, or in worker processes (a CPU-bound Python reward then "
                   "never holds the loop that feeds the engines; give it by import path; a reward using math-verify's "
                   "own timeouts, verl's math_verify.compute_score, needs it: they use signals, which fail on a "
                   "thread, and it then scores 0).  [default: thread]")
@click.option("--reward-timeout", "reward_timeout_s", type=float, metavar="SECONDS",
              help="Seconds one math_verify check may take; longer scores 0 and counts as reward_timeouts.  "
                   "[default: 5]")
@click.option("--reward-time-limit", "reward_time_limit_s", type=float, metavar="SECONDS",
              help="Seconds one reward call may run, from its start (your own reward too); longer is that sample's "
                   "reward error and the run goes on.  [default: no limit]")
@click.option("--overlong-buffer", type=int, metavar="TOKENS",
              help="DAPO's overlong reward shaping: responses past --max-tokens minus TOKENS lose up to "
                   "--overlong-penalty of reward, linearly.  [default: off]")
@click.option("--overlong-penalty", type=float, metavar="F", help="The most DAPO's shaping takes.  [default: 1.0]")
@click.option("--seed", type=int, help="Engine seed.  [default: 0]")
@speculative_options("the finished responses of the sample's group",
                     "(an earlier pdsr rollout output) whose responses are drafted from as earlier responses to the "
                     "same prompts")
@click.option("--agent", metavar="PKG.MOD:FN",
              help="Multi-turn rollouts: `async def run(agent)` run for each sample (model turns with "
                   "agent.generate(), tool results and user turns with agent.append(); token-exact). See "
                   "docs/agents.md.  [default: single-turn]")
@click.option("--max-turns", type=int, metavar="N", help="Most model turns per sample with --agent.  [default: 8]")
@click.option("--turn-max-tokens", type=int, metavar="N",
              help="Most tokens one model turn may sample with --agent (--max-tokens counts every response token, "
                   "the model's and the environment's).  [default: what is left of the sample's budget]")
@click.option("--agent-timeout", "agent_timeout_s", type=float, metavar="SECONDS",
              help="Seconds an agent may take between turns (its environment's time); past it the sample fails "
                   "and the step goes on.  [default: 60]")
@click.option("--no-segments", is_flag=True, default=None,
              help="Run each request to its end in one go (no dynamic segments).")
@click.option("--out", type=UserPathType(dir_okay=False, path_type=Path),
              help="Trajectories Parquet.  [default: runs/rollout.parquet]")
@click.option("--summary", type=UserPathType(dir_okay=False, path_type=Path),
              help="Run summary JSON.  [default: <out>.summary.json]")
@click.option("--resume", is_flag=True, default=None,
              help="Continue the run in --out: skip its finished groups, complete a batch it cut short, and "
                   "run the batches left up to --num-batches. Where --out holds none, a new run starts (a "
                   "'pdsr:' line says so).")
@click.option("--overwrite", is_flag=True, default=None, help="Replace an existing --out.")
@step_stream_options("the data's prompts (each step's end bumps the policy version, as a trainer's update would; "
                     "the last step drains)", "0: each step waits for its own groups")
@click.option("--write-filtered", is_flag=True, default=None,
              help="With --filter-groups: also write the filtered groups, to <out stem>.filtered.parquet.")
@click.option("--filter-metric", type=click.Choice(["acc", "score", "seq_reward"]), default=None,
              help="With --filter-groups: what it compares within a group, as verl's algorithm.filter_groups.metric. "
                   "acc: a dict reward's acc field, else its score before overlong shaping; score: that score; "
                   "seq_reward: the reward after shaping (the reward column).  [default: acc]")
@quiet_option
@handle_errors
def command(config_path, policy, policy_set, data, model, n, batch_size, num_batches, limit, max_tokens,
            temperature, top_p, top_k, stop, stop_token_ids, min_p, repetition_penalty,
            presence_penalty, frequency_penalty, ignore_eos, fast, heavy, ray_address, prompt_column,
            messages_column, system_prompt, instruction, id_column, ground_truth_column, data_source,
            target_lengths_column, skip_long, reward, reward_executor, reward_timeout_s, reward_time_limit_s,
            overlong_buffer, overlong_penalty, seed, speculative,
            num_speculative_tokens, draft_history, agent, max_turns, turn_max_tokens, agent_timeout_s,
            no_segments, out, summary, resume, overwrite, steps, over_provision, step_groups, max_staleness,
            group_deadline, kv_on_update, update, filter_groups, write_filtered, filter_metric, quiet):
    """Generate B x N samples per batch with a P-DSR dispatch policy on vLLM engines.

    Sample 0 of each prompt is its probe; the policy (v3 by default) decides
    which engine runs each sample, and when. Trajectories stream to Parquet
    (finished groups are on disk even if the run is interrupted; --resume
    skips them), and a summary (makespan, tokens/s, engine busy fraction,
    probes, offloads, breaks, moves, steals, restarts) is printed and saved.

    \b
    Examples:
      pdsr rollout --n 4 --max-tokens 256 --overwrite     # tiny model, sample prompts
      pdsr rollout --policy v2.5 --data math.parquet --model DIR --n 8 --batch-size 128
      pdsr rollout --config run.yaml --resume
      pdsr rollout --policy v2 --set breaker_tokens=1024 --fast 6 --heavy 2
      pdsr rollout --policy all --data math.parquet --model DIR --out runs/ab.parquet   # one run per policy
      pdsr rollout --ray auto --model /shared/models/qwen --data math.parquet   # engines on a Ray cluster
      pdsr rollout --data math.parquet --model DIR --instruction math --system-prompt "You are a careful solver."
      pdsr rollout --steps 5 --step-groups 8 --over-provision 0.25 --max-staleness 2    # partial rollout
      pdsr rollout --steps 5 --data gsm8k.parquet --model DIR --filter-groups zero-variance   # DAPO
      pdsr rollout --speculative ngram --num-speculative-tokens 4 --data math.parquet --model DIR
      pdsr rollout --speculative group --draft-history runs/last.parquet --data math.parquet --model DIR
      pdsr rollout --agent examples.agent_tools:run --max-turns 4 --turn-max-tokens 256 --data math.parquet --model DIR
    """
    from pdsr_cli.quiet import output_mode, quiet_engine_args, stderr_is_terminal
    from pdsr_sdk.policies.resolve import policy_names, with_policy_sets
    from pdsr_sdk.errors import ConfigError
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.preflight import check_agent_settings, check_outputs
    from pdsr_sdk.rollout.run import policy_configs, run_rollout, summary_path

    overrides = {
        "policy": policy,
        "data.path": data, "model": model, "sampling.n": n, "batch_size": batch_size,
        "num_batches": num_batches, "data.limit": limit, "sampling.max_tokens": max_tokens,
        "sampling.temperature": temperature, "sampling.top_p": top_p, "sampling.top_k": top_k,
        "sampling.stop": list(stop) or None, "sampling.stop_token_ids": list(stop_token_ids) or None,
        "sampling.ignore_eos": ignore_eos, "sampling.min_p": min_p, "sampling.repetition_penalty": repetition_penalty,
        "sampling.presence_penalty": presence_penalty, "sampling.frequency_penalty": frequency_penalty,
        "fast": fast, "heavy": heavy, "ray.address": ray_address,
        "data.prompt_column": prompt_column, "data.messages_column": messages_column,
        "data.system_prompt": system_prompt, "data.instruction": instruction,
        "data.id_column": id_column, "data.ground_truth_column": ground_truth_column,
        "data.data_source": data_source,
        "data.target_lengths_column": target_lengths_column, "data.skip_long": skip_long,
        "reward": reward, "reward_executor": reward_executor, "reward_timeout_s": reward_timeout_s,
        "reward_time_limit_s": reward_time_limit_s, "overlong_buffer": overlong_buffer,
        "overlong_penalty": overlong_penalty, "seed": seed, "speculative": speculative,
        "speculative_settings.num_speculative_tokens": num_speculative_tokens,
        "speculative_settings.history_file": draft_history,
        "agent.function": agent, "agent.max_turns": max_turns, "agent.turn_max_tokens": turn_max_tokens,
        "agent.env_timeout_s": agent_timeout_s,
        "segments.enabled": False if no_segments else None,
        "output.path": out, "output.summary_path": summary, "output.resume": resume,
        "output.overwrite": overwrite, "steps": steps, "over_provision": over_provision,
        "step_groups": step_groups, "max_staleness": max_staleness, "group_deadline": group_deadline,
        "kv_on_update": kv_on_update, "update": update, "filter_groups.kind": filter_groups,
    }
    cfg = build_config(RolloutConfig, config_path, overrides)
    check_agent_settings(cfg)   # from a flag or the config file alike
    check_functions(cfg, config_path, {"reward": ("--reward", reward), "agent.function": ("--agent", agent)})
    check_speculative_flags(cfg, num_speculative_tokens)
    if write_filtered:
        if cfg.filter_groups is None:
            raise ConfigError("--write-filtered writes the groups --filter-groups filters out: pass --filter-groups "
                              "too (or set filter_groups in the config)")
        cfg = cfg.model_copy(update={"filter_groups": cfg.filter_groups.model_copy(update={"write_filtered": True})})
    if filter_metric is not None:
        if cfg.filter_groups is None:
            raise ConfigError("--filter-metric says what --filter-groups compares: pass --filter-groups too (or set "
                              "filter_groups in the config)")
        cfg = cfg.model_copy(update={"filter_groups": cfg.filter_groups.model_copy(update={"metric": filter_metric})})
    sets = parse_policy_sets(policy_set)
    check_policy_set_targets(sets, policy_names(cfg.policy))
    cfg = with_policy_sets(cfg, sets)
    runs = policy_configs(cfg)
    for run_cfg in runs:   # every run's outputs, before the first run's engines start
        check_outputs(run_cfg)
    if cfg.model is None:
        echo_status("model: the built-in tiny random model (pass --model DIR for a real one)")
    if cfg.data.path is None:
        echo_status("data: the built-in sample prompts (pass --data FILE for your own)")
    results = []
    with output_mode(quiet):
        for run_cfg in runs:
            if quiet or not stderr_is_terminal():
                run_cfg = quiet_engine_args(run_cfg, quiet)
            results.append(run_rollout(run_cfg, progress=cli_progress(quiet), status=echo_status))
            click.echo(render_summary(results[-1]))
            click.echo(f"trajectories: {results[-1].output}\nsummary: {summary_path(run_cfg)}")
    if len(results) > 1:
        click.echo("\n" + render_comparison(results))


def check_functions(cfg, config_path: Path | None, flags: dict[str, tuple[str, str | None]]) -> None:
    """A reward or agent function that cannot be loaded is an error before the data and the engines, naming where
    it was given: its key, with its flag where ``flags`` has one (key -> (flag, the flag's value or None)), and the
    --config file where the flag was not given (the run, which loads it again, cannot tell the file's value from
    the flag's). pdsr serve has neither flag: its keys come from the file alone."""
    from pdsr_sdk.agent import load_agent
    from pdsr_sdk.rollout.reward import load_reward

    def where(key: str) -> str:
        flag, given = flags.get(key, (None, None))
        named = f"{key} ({flag})" if flag else key
        return named if given is not None or config_path is None else f"{config_path}: {named}"

    if cfg.reward is not None and ":" in cfg.reward:   # a name, not an import path: the config checked it
        load_reward(cfg.reward, where=where("reward"))
    if cfg.agent.function is not None:
        load_agent(cfg.agent.function, where=where("agent.function"))


def engines_label(summary) -> str:
    """A run's engines by pool, ``1 fast + 1 heavy`` (``-``: none started, a resumed run with nothing left)."""
    pools = Counter(engine["pool"] for engine in summary.engines)
    return " + ".join(f"{n} {pool}" for pool, n in pools.items()) or "-"


def render_comparison(results: list) -> str:
    """The side-by-side table of a run per policy; a note under it when their engines differ (each policy
    gets the automatic layout it needs: one fast engine, or fast and heavy ones)."""
    rewarded = any(s.reward_mean is not None for s in results)
    table = format_table([{"policy": s.policy, "engines": engines_label(s), "makespan_s": round(s.makespan_s, 3),
                           "tokens_per_s": round(s.tokens_per_s, 1),
                           **({"reward_mean": s.reward_mean} if rewarded else {}),
                           "tokens": s.tokens} for s in results])
    ran = [s for s in results if s.engines]
    layouts = list(dict.fromkeys(engines_label(s) for s in ran))
    if len(layouts) < 2:
        return table
    what = "engine counts" if len({len(s.engines) for s in ran}) > 1 else "engine layouts"
    return (f"{table}\nnote: the policies ran on different engines ({'; '.join(layouts)}): their tokens/s "
            f"compare different {what}, not the policies alone; --fast and --heavy give every policy the "
            f"same engines")


#: per-batch columns of the printed summary (reward_mean when there is a reward); then policy facts and counters,
#: each only when some batch has it (the JSON summary has every key)
BATCH_COLUMNS = ["batch_index", "groups", "makespan_s", "tokens_per_s", "reward_mean", "tokens"]
HIDDEN_WHEN_EMPTY = ("l_cut", "fast_cap", "offloaded_prompts", "breaks", "moves", "steals", "restarts",
                     "wasted_tokens", "retries", "truncations", "reward_timeouts",
                     "reward_errors")
#: a multi-step run's columns (the step's summary keys, docs/sdk.md): shown when the run has them
STEP_COLUMNS = ("off_policy_share", "partial_tokens", "max_token_age", "stale_restarts", "carried_groups")
#: ... and those of dynamic sampling (--filter-groups)
FILTER_COLUMNS = ("filtered_groups", "pass_rate")


def render_summary(s) -> str:
    """The printed summary: what matters first, zero counters left out (the JSON summary has every key)."""
    counts = (f"{s.groups} groups, {s.samples} samples"
              + (f" ({s.skipped_groups} groups from before the resume)" if s.skipped_groups else "")
              + f", {s.tokens} tokens"
              + (f"; {s.skipped_long} prompts longer than the context skipped (--skip-long)" if s.skipped_long else "")
              + (f"; {s.filtered_groups} groups filtered out (--filter-groups"
                 + (f"; the reward failed on {s.filtered_reward_errors} of their samples, each left out of its "
                    f"group's comparison: see reward_error with --write-filtered)" if s.filtered_reward_errors else ")")
                 if s.filtered_groups else ""))
    # the means of the rewards' other numeric fields (verl's reward_extra_info: acc ...) beside the reward's
    extras = ", ".join(f"{k} {v:.3f}" for k, v in s.reward_extra_means.items())
    lead = [("makespan", f"{s.makespan_s:.2f} s"), ("", f"{s.tokens_per_s:.1f} tokens/s"),
            ("reward mean",
             None if s.reward_mean is None else f"{s.reward_mean:.3f}" + (f" ({extras})" if extras else ""))]
    busy = ", ".join(f"{k} {v:.0%}" for k, v in s.engine_busy_fraction.items())
    details = [counts, f"engines busy: {busy}" if busy else "engines busy: none"]
    spec = s.speculation
    if spec:
        rate = spec["acceptance_rate"]
        per_step = spec["accepted_per_verify_step"]
        details.append(f"speculation: {spec['drafted_tokens']} tokens drafted in {spec['drafts']} verify steps, "
                       f"{spec['accepted_tokens']} accepted" + (f" ({rate:.1%})" if rate is not None else "")
                       + (f", {per_step:.2f} accepted a verify step" if per_step is not None else ""))
    if len(s.batches) > 1:
        rows = [{**b, "reward_mean": (b["reward_sum"] / b["rewarded_samples"] if b.get("rewarded_samples") else None)}
                for b in s.batches]
        columns = [c for c in BATCH_COLUMNS if c != "reward_mean" or s.reward_mean is not None]
        columns += [c for c in STEP_COLUMNS + FILTER_COLUMNS if any(c in b for b in s.batches)]
        details += ["", format_table(rows, columns + list(HIDDEN_WHEN_EMPTY), hide_empty=HIDDEN_WHEN_EMPTY)]
    if s.engine_errors:
        details += ["", "engine errors:"] + [f"  {e.splitlines()[0]}" for e in s.engine_errors]
    return format_summary(f"policy {s.policy}", lead, s.stats, details)
