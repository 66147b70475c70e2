"""argparse types shared by the bench scripts, so a bad flag is refused by name (argparse's usage line and
``error: argument --seeds: ...``) instead of ending in a traceback from deep in a run."""

from __future__ import annotations

import argparse
from pathlib import Path


def int_list(text: str) -> list[int]:
    """Comma-separated whole numbers (``101,102,103``)."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated whole numbers (e.g. 101,102)") from None


def count_list(text: str) -> list[int]:
    """Comma-separated whole numbers of at least 1 (``128,512``: batch sizes, engines)."""
    values = int_list(text)
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"{min(values)} is below 1 (in {text!r})")
    return values


def float_list(text: str) -> list[float]:
    """Comma-separated numbers (``0.05,0.1``)."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated numbers (e.g. 0.05,0.1)") from None


def check_members(ap: argparse.ArgumentParser, names: list[str], flag: str = "--family") -> None:
    """Refuse a workload-family member that does not exist, naming the flag and the valid names."""
    from pdsr_sdk.errors import PdsrError
    from pdsr_sdk.traces import workload

    for name in names:
        try:
            workload(name)
        except PdsrError as exc:
            ap.error(f"{flag}: {exc}")


def family_members(ap: argparse.ArgumentParser, text: str, flag: str = "--family") -> list[str]:
    """A --family value ("all" or comma-separated member names) -> the member names, each checked to exist."""
    from pdsr_sdk.traces import WORKLOADS

    names = WORKLOADS.names() if text == "all" else text.split(",")
    check_members(ap, names, flag)
    return names


def existing_file(text: str) -> Path:
    """A path that must name a file that is there (a run's trajectories, a trace)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return path


def writable_dir(text: str) -> Path:
    """A folder the script writes into: one that is there, or one it can make (its nearest existing parent a
    folder it may write in), so that a file or an unwritable place is refused before any run, not by mkdir's
    traceback after it."""
    import os

    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a file, not a folder")
    folder = path
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: cannot make this folder: {folder} is a file")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot write in {folder}")
    return path


def read_columns(path: Path, columns: list[str], flag: str) -> list[dict]:
    """The rows of a trajectories Parquet file, ``columns`` only; a file that is no Parquet file or lacks one of them
    ends the script with one line naming the flag and the file, not pyarrow's traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except (pa.ArrowException, OSError) as exc:
        raise SystemExit(f"error: {flag} {path}: not a trajectories Parquet file ({exc})") from None
    missing = [c for c in columns if c not in names]
    if missing:
        raise SystemExit(f"error: {flag} {path}: no column {', '.join(missing)} (a `pdsr rollout` run's trajectories "
                         f"have them)")
    return pq.read_table(path, columns=columns).to_pylist()


def at_least(low: int):
    """A whole number of at least ``low`` (``at_least(1)``: a count such as --repeats or --groups)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    parse.__name__ = f"whole number >= {low}"   # argparse names the type in its own messages
    return parse


def number_at_least(low: float):
    """A number of at least ``low`` (seconds, a share, GiB)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value >= low:   # also refuses nan
            raise argparse.ArgumentTypeError(f"{value:g} is below {low:g}")
        return value

    parse.__name__ = f"number >= {low:g}"
    return parse


def share(text: str) -> float:
    """A share strictly between 0 and 1 (a budget such as --max-partial-share)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:   # also refuses nan
        raise argparse.ArgumentTypeError(f"{value:g} is not between 0 and 1")
    return value


def check_policies(ap: argparse.ArgumentParser, names: list[str], flag: str = "--policies", *,
                   simulation: bool = False) -> None:
    """Refuse a policy that does not exist (or, on real engines, one only the simulator runs), naming the flag,
    before any engine starts."""
    from pdsr_sdk.errors import PdsrError
    from pdsr_sdk.policies.resolve import check_policies as resolve

    if not names:
        ap.error(f"{flag}: expected at least one policy name")
    try:
        resolve(",".join(names), simulation=simulation)
    except PdsrError as exc:
        ap.error(f"{flag}: {exc}")


def check_model_dir(ap: argparse.ArgumentParser, model: str | None, flag: str = "--model") -> None:
    """Refuse a --model that is not a model folder (no config.json) before any engine starts loading it."""
    if model is not None and not (Path(model) / "config.json").is_file():
        ap.error(f"{flag}: {model}: not a model directory (no config.json); pass a local Hugging Face model folder")


def run_engines(main):
    """``asyncio.run(main)`` for a script that starts engines: Ctrl-C ends it with one line and status 130 (the
    script's ``finally`` has closed its engines by then) instead of asyncio's traceback."""
    import asyncio
    import sys

    try:
        return asyncio.run(main)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C); the engines were closed", file=sys.stderr)
        raise SystemExit(130) from None
