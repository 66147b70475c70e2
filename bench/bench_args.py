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


def existing_file(text: str) -> Path:
    """A path that must name a file that is there (a run's trajectories, a trace)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return path


def positive_int(text: str) -> int:
    """A whole number >= 1 (engines, groups, a batch size)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value
