"""``pdsr trace``: make length traces (``synth``) or extract them from trajectories (``convert``)."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from pdsr_cli.common import build_config, config_option, handle_errors
from pdsr_sdk.traces.config import TraceSynthConfig


def _help(name: str) -> str:
    """A flag's help: the config field's description and its default (one source of truth)."""
    field = TraceSynthConfig.model_fields[name]
    return field.description if field.default is None else f"{field.description} [default: {field.default}]"


def _list_family(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
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
    "turns"}; lengths[0] is the probe (sample 0)."""


@command.command("synth", short_help="Draw a synthetic long-tailed length trace (JSONL).")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the JSONL trace.")
@click.option("--family", type=str, default=None, is_eager=True, callback=_list_family,
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

    Example: pdsr trace synth --groups 512 --n 8 --seed 0 --out trace.jsonl

    Example: pdsr trace synth --family longcot --seed 101 --out longcot.jsonl

    Example: pdsr trace synth --family multi-turn --seed 101 --out turns.jsonl   # 1-8 turns, 0.1-5 s tools
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
    click.echo(f"wrote {out}{family}: {trace.num_groups} groups x {cfg.n} samples, length median "
               f"{np.median(lengths):.0f}, p99 {np.percentile(lengths, 99):.0f}, {at_cap} at max_length "
               f"{cfg.max_length}{turns}")


@command.command("convert", short_help="Trajectories Parquet/Arrow (or JSONL) -> JSONL length trace.")
@click.argument("source", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the JSONL trace.")
@_overwrite_option
@handle_errors
def convert(source: Path, out: Path, overwrite: bool) -> None:
    """Write the length trace of SOURCE, a trajectories file from `pdsr rollout`
    (Parquet or Arrow IPC) or a JSONL trace, as JSONL.

    Rows are grouped by prompt_id (in order of first appearance) and ordered by
    sample_index; durations are finish_time_s - submit_time_s. A trajectories file of multi-turn samples
    (its turns column) gives a trace of turns: per turn the sampled tokens, then the environment's
    tokens and its time (the environment spans' end_s - start_s).
    """
    from pdsr_sdk.io.tables import check_new_output
    from pdsr_sdk.traces import read_trace, write_trace_jsonl

    check_new_output(out, "--out", overwrite=overwrite, config_key=None, inputs=[("SOURCE", source)])
    trace = read_trace(source)
    write_trace_jsonl(trace, out)
    sizes = trace.group_sizes
    shape = f"{sizes[0]} samples each" if trace.is_rectangular else f"{sizes.min()}..{sizes.max()} samples"
    extras = [k for k, v in (("durations", trace.durations_s), ("finish reasons", trace.finish_reasons),
                             ("turns", trace.turns)) if v is not None]
    click.echo(f"wrote {out}: {trace.num_groups} groups, {shape}, {trace.num_samples} samples"
               + (f" (with {', '.join(extras)})" if extras else ""))
