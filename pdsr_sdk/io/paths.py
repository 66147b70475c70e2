"""Which files an input path names: a file, a folder of files, or a glob pattern the shell did not expand
(``'train-*.parquet'``, quoted, or a config file's value). One resolver, so that every reader of tables
(:func:`~pdsr_sdk.io.tables.read_table`, :mod:`~pdsr_sdk.io.blocks`) and verl's generation dumps
(:mod:`~pdsr_sdk.traces.verl_dump`) takes the same inputs and says the same of a bad one: a path that does not
exist, a pattern that matches nothing, a folder or pattern without files of a known format or with files of
several. A leading ``~`` is the user's home, as a shell would have it (a config file's value or ``--data=~/x``
is not expanded by the shell).
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Annotated, Literal, Mapping

from pydantic import AfterValidator

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.output_lock import unfinished_output


def user_path(path: str | Path) -> Path:
    """``path`` with a leading ``~`` (or ``~user``) expanded to the home folder."""
    return Path(path).expanduser()


#: a config's path, its leading ``~`` expanded when the config is validated
UserPath = Annotated[Path, AfterValidator(user_path)]
#: a config's path kept as text (a model folder, which may also be a hub id: none starts with ``~``)
UserPathText = Annotated[str, AfterValidator(os.path.expanduser)]


def labelled(path: str | Path, setting: str | None) -> str:
    """How an error names an input: ``--data runs/p.parquet`` (the flag or config key first), or the path alone."""
    return f"{setting} {path}" if setting else str(path)


def resolve_inputs(path: str | Path, formats: Mapping[str, str], *, what: str = "input", setting: str | None = None,
                   order: Literal["name", "step"] = "name", ignore: frozenset[str] = frozenset()) -> list[Path]:
    """The files ``path`` names: itself, if a file (of any name: its reader decides); else a folder's files, or a
    glob pattern's matches, whose suffixes ``formats`` maps (suffix -> format) and whose names are not in ``ignore``
    (hidden files and other names are skipped: a dataset card, ``save_to_disk``'s metadata). The files of a folder
    or pattern must be of one format. ``order``: ``name`` sorts by name (``train-00000-of-00004.parquet``); ``step``
    puts verl's ``{step}.jsonl`` in order of their number (``2.jsonl`` before ``10.jsonl``), other names after.

    A DataError names the path (after ``setting``, the flag or config key that gave it, when given) and ``what``
    files were wanted."""
    path = user_path(path)
    where = labelled(path, setting)
    if path.is_file():
        return [path]
    pattern = not path.exists() and glob.has_magic(str(path))
    if not path.exists() and not pattern:
        unfinished = unfinished_output(path, "give that folder to read them as they are")
        raise DataError(f"{where}: {what} file does not exist" + (f" yet: {unfinished}" if unfinished else ""))
    if pattern:
        found = [Path(m) for m in glob.glob(str(path))]
        if not found:
            raise DataError(f"{where}: {what} file does not exist, nor does the pattern match any")
    else:
        found = list(path.iterdir())
    files = [f for f in found if f.is_file() and not f.name.startswith(".") and f.name not in ignore
             and f.suffix.lower() in formats]
    by_format: dict[str, list[Path]] = {}
    for f in sorted(files, key=_step_order if order == "step" else _name_order):
        by_format.setdefault(formats[f.suffix.lower()], []).append(f)
    if len(by_format) != 1:
        listed = "; ".join(f"{len(fs)} {kind} ({fs[0].name}, ...)" for kind, fs in by_format.items()) or "none"
        holds = "the pattern must match" if pattern else "the folder must hold"
        raise DataError(f"{where}: {holds} {what} files of one format ({', '.join(formats)}); found {listed}")
    return next(iter(by_format.values()))


def _name_order(p: Path) -> tuple:
    return (str(p),)


def _step_order(p: Path) -> tuple:
    return (0, int(p.stem), str(p)) if re.fullmatch(r"\d+", p.stem) else (1, 0, str(p))
