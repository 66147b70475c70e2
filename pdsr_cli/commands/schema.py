"""``pdsr schema``: export the JSON Schemas of the configs and the Arrow schemas of the outputs."""

from __future__ import annotations

from pathlib import Path

import click

from pdsr_cli.common import handle_errors, UserPathType


@click.command("schema")
@click.option("--out", "out_dir", type=UserPathType(file_okay=False, path_type=Path), default=Path("schemas"),
              show_default=True, help="Directory to write the schema files into.")
@handle_errors
def command(out_dir: Path) -> None:
    """Write schemas/<config>.schema.json and schemas/<table>.arrow.json."""
    from pdsr_sdk.config.catalog import write_schemas
    from pdsr_sdk.io.tables import check_writable

    check_writable(out_dir / "rollout.schema.json", "--out")
    for path in write_schemas(out_dir):
        click.echo(f"wrote {path}")
