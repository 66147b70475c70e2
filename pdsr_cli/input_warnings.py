"""A warning where an input of ``pdsr trace convert``, ``analyze`` or ``simulate`` is the output of a run still
writing it (``pdsr_sdk.io.output_lock.output_in_progress``)."""

from __future__ import annotations

from pathlib import Path

import click


def warn_if_in_progress(path: Path | None, label: str) -> None:
    """One ``warning:`` line on stderr, naming ``label`` and ``path``, where ``path`` is a file a run is writing."""
    from pdsr_sdk.io.output_lock import output_in_progress

    if path is None or not Path(path).is_file():
        return
    words = output_in_progress(path)
    if words:
        click.echo(f"warning: {label} {path}: {words}", err=True)
