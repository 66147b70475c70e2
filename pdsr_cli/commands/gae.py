"""``pdsr gae``: per-token advantages for a table of rollouts: critic GAE (rewards, values, masks) or GRPO, RLOO,
REINFORCE++ (one reward per sample and its group)."""

from __future__ import annotations

from pathlib import Path

import click

from pdsr_cli.common import (build_config_replacing, cli_progress, config_option, handle_errors, quiet_option,
                             UserPathType)
from pdsr_sdk.gae.config import ESTIMATOR_KEYS, GaeConfig


def _help(name: str) -> str:
    """A flag's help: the config field's description and its default (one source of truth)."""
    field = GaeConfig.model_fields[name]
    if field.is_required():
        return f"{field.description} [required unless set in --config]"
    return f"{field.description} [default: {field.default}]"


@click.command("gae")
@click.option("--data", type=UserPathType(path_type=Path), default=None, help=_help("data"))
@click.option("--out", type=UserPathType(dir_okay=False, path_type=Path), default=None, help=_help("out"))
@click.option("--overwrite", is_flag=True, default=None, help=_help("overwrite"))
@click.option("--estimator", type=click.Choice(list(ESTIMATOR_KEYS)), default=None, help=_help("estimator"))
@click.option("--rewards-column", default=None, help=_help("rewards_column"))
@click.option("--values-column", default=None, help=_help("values_column"))
@click.option("--group-column", default=None, help=_help("group_column"))
@click.option("--tokens-column", default=None, help=_help("tokens_column"))
@click.option("--mask-column", default=None,
              help=_help("mask_column").replace("null:", "null (on the command line: ''):"))
@click.option("--gamma", type=float, default=None, help=_help("gamma"))
@click.option("--lam", type=float, default=None, help=_help("lam"))
# a YAML bool only in a file
@click.option("--normalize-std", type=click.Choice(["group", "batch", "none"]), default=None,
              help=_help("normalize_std").replace("; true / false mean", "; in --config, true / false mean"))
@click.option("--eps", type=float, default=None, help=_help("eps"))
@click.option("--singleton", type=click.Choice(["zero", "score"]), default=None, help=_help("singleton"))
@click.option("--chunk", type=int, default=None, help=_help("chunk"))
@click.option("--backend", default=None, help=_help("backend"))
@click.option("--carry-dtype", type=click.Choice(["auto", "float32", "float64"]), default=None,
              help=_help("carry_dtype"))
@click.option("--device", default=None, help=_help("device"))
@click.option("--whiten/--no-whiten", default=None, help=_help("whiten"))
@click.option("--threads", type=int, default=None, help=_help("threads"))
@quiet_option
@config_option
@handle_errors
def command(config_path: Path | None, quiet: bool, **flags) -> None:
    """Add per-token 'advantages' (and 'returns') columns to a table of rollouts.

    --estimator gae (default) is verl's masked GAE over a values column:
    walking each row backwards, a valid token updates the advantage and the
    bootstrap value, a masked token carries both unchanged (its reward is
    ignored); returns = advantages + values. grpo, rloo,
    reinforce_plus_plus and reinforce_plus_plus_baseline need no critic:
    one reward per sample, its group from --group-column, the advantage on
    each valid token of the response and 0 on masked ones, as verl's.

    \b
    Example:
      pdsr gae --data rollouts.parquet --out rollouts_gae.parquet --gamma 1.0 --lam 0.95
      pdsr gae --data rollouts.parquet --out rollouts_adv.parquet --estimator grpo
    """
    from pdsr_cli.quiet import output_mode
    from pdsr_sdk.gae.table import run_gae_file

    no_mask = flags.get("mask_column") == ""
    if no_mask:
        flags["mask_column"] = None
    cfg = build_config_replacing(GaeConfig, config_path, flags, required={"data": "--data", "out": "--out"})
    if no_mask:
        cfg = cfg.model_copy(update={"mask_column": None})
    with output_mode(quiet):   # --quiet also hides third-party warnings (numba, torch)
        summary = run_gae_file(cfg, progress=cli_progress(quiet))
    how = ", ".join(([] if summary.estimator == "gae" else [f"estimator {summary.estimator}"])
                    + ([f"backend {summary.backend}"] if summary.backend else []))
    click.echo(f"wrote {summary.out}: {summary.rows} rows, {summary.tokens} tokens ({summary.valid_tokens} valid), "
               f"{how}, {summary.seconds:.3g} s")
    _warn_lone_samples(summary, cfg)
    if summary.dropped_rewards:
        rows = summary.dropped_rewards
        shown = ", ".join(map(str, rows[:5])) + (f" and {len(rows) - 5} more" if len(rows) > 5 else "")
        why = "the response is empty" + (f" or its {cfg.mask_column} is all 0" if cfg.mask_column else "")
        click.echo(f"warning: {len(rows)} row(s) have a reward but no valid token to carry it ({why}), so it is in "
                   f"no advantage: row {shown}", err=True)


def _warn_lone_samples(summary, cfg: GaeConfig) -> None:
    """A group of one sample with singleton zero gets advantage 0: a file of prompts sampled once (pdsr rollout
    --n 1, or group ids that are not the prompt's) would train on nothing without a word."""
    lone, groups = summary.singleton_groups, summary.groups
    if not lone or cfg.singleton != "zero":
        return
    which = (f"every group ({cfg.group_column}) holds" if lone == groups
             else f"{lone} of {groups} groups ({cfg.group_column}) {'holds' if lone == 1 else 'hold'}")
    click.echo(f"warning: {which} one sample: a lone sample is its own baseline, so nothing of its reward is in its "
               f"advantage; sample each prompt several times (pdsr rollout --n N), or keep a lone sample's reward "
               f"with singleton (--singleton) score, as verl does", err=True)
