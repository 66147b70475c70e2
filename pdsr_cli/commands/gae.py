"""``pdsr gae``: GAE advantages and returns for a table of per-token rewards, values and masks."""

from __future__ import annotations

from pathlib import Path

import click

from pdsr_cli.common import build_config_replacing, cli_progress, config_option, handle_errors, quiet_option, UserPathType
from pdsr_sdk.gae.config import GaeConfig


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
@click.option("--rewards-column", default=None, help=_help("rewards_column"))
@click.option("--values-column", default=None, help=_help("values_column"))
@click.option("--mask-column", default=None,
              help=_help("mask_column").replace("null:", "null (on the command line: ''):"))
@click.option("--gamma", type=float, default=None, help=_help("gamma"))
@click.option("--lam", type=float, default=None, help=_help("lam"))
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
    """Add per-token 'advantages' and 'returns' columns to a table of rollouts.

    Semantics are verl's masked GAE: walking each row backwards, a valid
    token updates the advantage and the bootstrap value, a masked token
    carries both unchanged (its reward is ignored); returns = advantages +
    values.

    \b
    Example:
      pdsr gae --data rollouts.parquet --out rollouts_gae.parquet --gamma 1.0 --lam 0.95
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
    click.echo(f"wrote {summary.out}: {summary.rows} rows, {summary.tokens} tokens ({summary.valid_tokens} valid), "
               f"backend {summary.backend}, {summary.seconds:.3g} s")
    if summary.dropped_rewards:
        rows = summary.dropped_rewards
        shown = ", ".join(map(str, rows[:5])) + (f" and {len(rows) - 5} more" if len(rows) > 5 else "")
        click.echo(f"warning: {len(rows)} row(s) have a reward but no valid token to carry it (their "
                   f"{cfg.mask_column or 'mask'} is all 0), so it is in no advantage: row {shown}", err=True)
