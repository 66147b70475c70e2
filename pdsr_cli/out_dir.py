"""An ``--out-dir`` folder that describes one run: the files of a command's known names that this run does not
write are removed (shared by ``pdsr simulate`` and ``pdsr analyze``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import click


def remove_other_outputs(out_dir: Path, names: Iterable[str], writes: set[str], keep: Iterable[Path] = ()) -> None:
    """Remove the files of ``names`` in ``out_dir`` that this run does not write (``writes``), once the run has
    finished and before it writes its own, so that the folder describes this run alone: an earlier run's files
    left beside this run's read as this run's. Nothing else there is touched; a folder of one of these names, or a
    path in ``keep`` (the run's inputs), is left as it is. Each removal is one ``pdsr: removed ...`` line on
    stderr."""
    kept = {p.resolve() for p in keep}
    for name in names:
        path = out_dir / name
        if name in writes or not (path.is_file() or path.is_symlink()) or path.resolve() in kept:
            continue
        path.unlink()
        click.echo(f"pdsr: removed {path}: an earlier run's (this run writes no {name})", err=True)
