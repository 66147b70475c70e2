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


def warn_failed_samples(trace, label: str) -> None:
    """One ``warning:`` line on stderr where ``trace`` (read from ``label``) holds failed samples: their lengths are
    where a sample broke off (an agent raised, an engine died), not a response's."""
    reasons = trace.finish_reasons
    if reasons is None:
        return
    failed = int((reasons.astype(str) == "failed").sum())
    if failed:
        click.echo(f"warning: {label} {trace.source or ''}: {failed} sample(s) failed (finish_reason 'failed'); their "
                   f"lengths are where they broke off, not responses' (pdsr simulate replays them as they are; pdsr "
                   f"analyze leaves their groups out)", err=True)
