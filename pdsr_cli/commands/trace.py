"""``pdsr trace``: make length traces (``synth``) or extract them from trajectories (``convert``)."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from pdsr_cli.common import build_config, config_option, handle_errors, UserPathType
from pdsr_cli.input_warnings import warn_failed_samples, warn_if_in_progress
from pdsr_cli.key_value import key_value_argument
from pdsr_sdk.traces.config import TraceSynthConfig


def _help(name: str) -> str:
    """A flag's help: the config field's description and its default (one source of truth)."""
    field = TraceSynthConfig.model_fields[name]
    return field.description if field.default is None else f"{field.description} [default: {field.default}]"


def list_family(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--family list``: print the members and their descriptions, then exit (before --out is required)."""
    if value != "list" or ctx.resilient_parsing:
        return value
    from pdsr_sdk.traces.family import WORKLOADS, workload

    for name in WORKLOADS:
        member = workload(name)
        click.echo(f"{name}: {member.description}\n    {member.measure.describe()}")
    ctx.exit(0)


def _overwrite_option(f):
    return click.option("--overwrite", is_flag=True, default=False, help="Replace an existing --out.")(f)


@click.group("trace")
def command() -> None:
    """Length traces: one JSONL line per prompt group,
    {"prompt_id", "prompt_len", "lengths": [...], optional "durations_s", "finish_reasons", "rewards",
    "turns"}; lengths[0] is the probe (sample 0). pdsr simulate and pdsr analyze read these traces and
    pdsr rollout's trajectories files; `trace convert` makes a trace from your own rollout log (one row
    per response: Parquet, Arrow, JSONL or CSV, its columns named by --id-column, --length-column, ...)."""


@command.command("synth", short_help="Draw a synthetic long-tailed length trace (JSONL).")
@click.option("--out", "out", type=UserPathType(dir_okay=False, path_type=Path), required=True,
              help="Where to write the JSONL trace.")
@click.option("--family", type=str, default=None, is_eager=True, callback=list_family,
              help=_help("family"))
@click.option("--groups", type=int, default=None, help=_help("groups"))
@click.option("--n", "n", type=int, default=None, help=_help("n"))
@click.option("--seed", type=int, default=None, help=_help("seed"))
@click.option("--median-length", type=float, default=None, help=_help("median_length"))
@click.option("--prompt-sigma", type=float, default=None, help=_help("prompt_sigma"))
@click.option("--noise-sigma", type=float, default=None, help=_help("noise_sigma"))
@click.option("--runaway-frac", type=float, default=None, help=_help("runaway_frac"))
@click.option("--runaway-concentration", type=float, default=None, help=_help("runaway_concentration"))
@click.option("--max-length", type=int, default=None, help=_help("max_length"))
@click.option("--min-length", type=int, default=None, help=_help("min_length"))
@click.option("--prompt-len-min", type=int, default=None, help=_help("prompt_len_min"))
@click.option("--prompt-len-max", type=int, default=None, help=_help("prompt_len_max"))
@click.option("--tokens-per-s", type=float, default=None, help=_help("tokens_per_s"))
@click.option("--id-prefix", type=str, default=None, help=_help("id_prefix"))
@click.option("--turns-min", type=int, default=None, help=_help("turns_min"))
@click.option("--turns-max", type=int, default=None, help=_help("turns_max"))
@click.option("--turns-noise", type=float, default=None, help=_help("turns_noise"))
@click.option("--env-tokens-min", type=int, default=None, help=_help("env_tokens_min"))
@click.option("--env-tokens-max", type=int, default=None, help=_help("env_tokens_max"))
@click.option("--env-delay-min-s", type=float, default=None, help=_help("env_delay_min_s"))
@click.option("--env-delay-max-s", type=float, default=None, help=_help("env_delay_max_s"))
@_overwrite_option
@config_option
@handle_errors
def synth(out: Path, overwrite: bool, config_path: Path | None, **flags) -> None:
    """Draw a synthetic long-tailed length trace (reproducible for a given --seed).

    Per-prompt difficulty is log-normal, samples vary around it with
    log-normal noise, a few samples run away to --max-length. The defaults
    resemble a 0.5B model on MATH: mean CV ~0.3, Spearman(probe, sample j)
    ~0.6. --family NAME draws a named workload (light and heavy tails,
    seed-002-like, long reasoning, an uninformative probe, a recorded
    trace resampled): its parameters are the defaults, flags override them.

    \b
    Examples:
      pdsr trace synth --groups 512 --n 8 --seed 0 --out trace.jsonl
      pdsr trace synth --family longcot --seed 101 --out longcot.jsonl
      pdsr trace synth --family multi-turn --seed 101 --out turns.jsonl   # 1-8 turns, 0.1-5 s tools
    """
    from pdsr_sdk.io.tables import check_new_output
    from pdsr_sdk.traces import synth_trace, write_trace_jsonl

    cfg = build_config(TraceSynthConfig, config_path, flags)
    check_new_output(out, "--out", overwrite=overwrite, config_key=None)
    trace = synth_trace(cfg)
    write_trace_jsonl(trace, out)
    lengths = trace.lengths
    at_cap = int((lengths >= cfg.max_length).sum())
    family = f" ({cfg.family})" if cfg.family else ""
    turns = ""
    if trace.turns is not None:
        t = trace.turns
        turns = (f"; {len(t.sampled) / trace.num_samples:.2f} turns per sample, environment delay "
                 f"{t.env_s[t.env_tokens > 0].mean() if (t.env_tokens > 0).any() else 0.0:.2f} s mean")
        at_cap = int(sum(1 for r in trace.finish_reasons if r == "length"))
    groups = f"{trace.num_groups} group" + ("" if trace.num_groups == 1 else "s")
    click.echo(f"wrote {out}{family}: {groups} x {cfg.n} sample{'' if cfg.n == 1 else 's'}, length median "
               f"{np.median(lengths):.0f}, p99 {np.percentile(lengths, 99):.0f}, {at_cap} at max_length "
               f"{cfg.max_length}{turns}")


def _column_option(role: str, what: str):
    """A column-naming flag of ``trace convert``: its help says what the column holds and the names looked for."""
    from pdsr_sdk.traces.responses import RESPONSE_COLUMNS

    flag, defaults = RESPONSE_COLUMNS[role]
    return click.option(flag, f"{role}_column", type=str, default=None,
                        help=f"{what}  [default: the first of {', '.join(defaults)} present]")


@command.command("convert", short_help="Rollout log (one row per response: Parquet/Arrow/JSONL/CSV), verl's "
                                       "or slime's dumps, or trajectories -> JSONL length trace.")
@click.argument("source", type=UserPathType(path_type=Path), callback=key_value_argument)
@click.option("--out", "out", type=UserPathType(dir_okay=False, path_type=Path), required=True,
              help="Where to write the JSONL trace.")
@_column_option("id", "Prompt id column: the rows of one id are one group.")
@_column_option("length", "Response length column: whole token counts (float columns of whole numbers too), a "
                          "list of token ids, counted, or the response's text, counted with --tokenizer.")
@_column_option("prompt_length", "Prompt length column (the same on every row of a prompt): token counts, or the "
                                 "prompt's text, counted with --tokenizer; none: 0.")
@_column_option("sample_index", "Column ordering the samples of a prompt (the smallest is sample 0, the probe); "
                                "none: the rows' order.")
@_column_option("reward", "Reward column (empty for a response without one).")
@_column_option("finish_reason", "Finish reason column ('stop', 'length', ...).")
@click.option("--tokenizer", "tokenizer_dir", type=UserPathType(path_type=Path), default=None, metavar="DIR",
              help="Local Hugging Face model or tokenizer folder (the policy's) that counts text: verl's dumps, a "
                   "--length-column or --prompt-length-column of text. Tokens of the text encoded without special "
                   "tokens.")
@_overwrite_option
@handle_errors
def convert(source: Path, out: Path, overwrite: bool, tokenizer_dir: Path | None, **columns: str | None) -> None:
    """Write the length trace of SOURCE as JSONL (one line per prompt group).

    SOURCE is your own rollout log, one row per response, in Parquet, Arrow
    IPC, JSONL or CSV/TSV (verl, OpenRLHF, vLLM dumps, an OpenAI-style
    completions log), or a folder or quoted glob pattern of its shards; or
    verl's generation dumps; or a trajectories file from `pdsr rollout` (or,
    while one runs or after it stopped before its end, its OUT.parts folder
    of the groups it finished); or a JSONL trace. Name the log's columns with the flags below (a dotted path
    reads a field of a struct column: usage.completion_tokens; a number, a
    list's item: choices.0.finish_reason); a column not named is looked for
    under its usual names. Rows count from 0 in errors.

    Groups are the rows of one prompt id, in order of first appearance, and
    may differ in size. A trajectories file's durations are finish_time_s -
    submit_time_s; its turns column (multi-turn samples) gives a trace of
    turns: per turn the sampled tokens, then the environment's tokens and its
    time (the environment spans' end_s - start_s).

    verl's dumps (trainer.rollout_data_dir or validation_data_dir: a folder of
    {step}.jsonl files, one of them, or a pattern; lines with input, output,
    score, step) are recognised by their keys and need --tokenizer: the
    response's and the prompt's text are counted with it. verl writes no
    prompt id, so a group is the lines of one prompt text within one step
    (two prompts of the same text in a step become one group); score is the
    reward (--reward-column acc reads another key); errors name file:line.

    slime's rollout dumps (--save-debug-rollout-data: a {rollout_id}.pt
    file, a folder of them or a pattern) need no tokenizer: a response's
    length is its response_length, the prompt's its tokens less that; a
    group is a group_index, status gives the finish reason (truncated:
    length), reward the reward (a dict's score, or --reward-column KEY);
    errors name the file, samples[i] and the key.

    \b
    Examples:
      pdsr trace convert verl_dump.parquet --id-column uid --reward-column score --out trace.jsonl
      pdsr trace convert rollout_data/ --tokenizer models/policy --out trace.jsonl   # verl's {step}.jsonl
      pdsr trace convert dump/rollout_data/ --out trace.jsonl   # slime's {rollout_id}.pt
      pdsr trace convert log.jsonl --id-column metadata.prompt_id \\
          --length-column usage.completion_tokens --out trace.jsonl
      pdsr trace convert lengths.csv --id-column question --length-column n_tokens --out trace.jsonl
      pdsr trace convert chats.csv --id-column question --length-column answer --tokenizer DIR --out trace.jsonl
    """
    from pdsr_sdk.io.tables import check_new_output
    from pdsr_sdk.traces import read_any_trace, write_trace_jsonl

    check_new_output(out, "--out", overwrite=overwrite, config_key=None, inputs=[("SOURCE", source)])
    tokenizer = None
    if tokenizer_dir is not None:
        from pdsr_sdk.rollout.data import load_tokenizer

        tokenizer = load_tokenizer(tokenizer_dir, setting="--tokenizer")
    warn_if_in_progress(source, "SOURCE")
    trace = read_any_trace(source, **columns, tokenizer=tokenizer, setting="SOURCE")
    warn_failed_samples(trace, "SOURCE")
    write_trace_jsonl(trace, out)
    sizes = trace.group_sizes
    shape = f"{sizes[0]} samples each" if trace.is_rectangular else f"{sizes.min()}..{sizes.max()} samples"
    extras = [k for k, v in (("durations", trace.durations_s), ("finish reasons", trace.finish_reasons),
                             ("rewards", trace.rewards), ("turns", trace.turns)) if v is not None]
    groups = f"{trace.num_groups} group" + ("" if trace.num_groups == 1 else "s")
    click.echo(f"wrote {out}: {groups}, {shape}, {trace.num_samples} samples"
               + (f" (with {', '.join(extras)})" if extras else ""))
    if trace.num_groups > 1 and sizes.max() == 1:
        # a per-response id taken for the prompt's, or one row per prompt whose list of lengths was counted as
        # one response's token ids: a trace the probe says nothing about, written without an error
        click.echo("warning: every prompt has one sample, so there is no probe to rank its siblings by (pdsr "
                   "analyze needs 2 or more). Is --id-column a prompt's id (the same on each of its responses)? A "
                   "log of one row per prompt, its responses in lists, is one row per response once exploded: "
                   "docs/simulate.md#your-own-logs", err=True)
    elif trace.num_groups == 1 and sizes[0] > 1:
        # an id column that is the same on every row (a model or run name taken for the prompt's): one group
        click.echo(f"warning: every response has the prompt id {trace.prompt_ids[0]!r}, so the trace is one group "
                   "(pdsr simulate runs it as one short batch; pdsr analyze ranks groups against each other). Is "
                   "--id-column a prompt's id (a different one for each prompt)?", err=True)
