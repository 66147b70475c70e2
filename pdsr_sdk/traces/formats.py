"""Which format a trace file is in (:func:`detect_format`, from its first bytes), and how the readers quote a bad
value in their errors."""

from __future__ import annotations

from pathlib import Path

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.output_lock import unfinished_output


def detect_format(path: Path) -> str:
    """``"jsonl"``, ``"parquet"``, ``"arrow_file"``, ``"arrow_stream"`` or ``"torch"`` (a zip archive, as
    ``torch.save`` writes: slime's rollout dumps) from the first bytes of ``path``."""
    if not path.exists():
        unfinished = unfinished_output(path, "`pdsr trace convert {parts} --out trace.jsonl` makes a trace of them")
        raise DataError(f"{path}: trace file does not exist" + (f" yet: {unfinished}" if unfinished else ""))
    if path.is_dir():
        raise DataError(f"{path}: is a directory; expected a length trace (JSONL) or a trajectories file")
    with path.open("rb") as fh:
        head = fh.read(512)
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"ARROW1"):
        return "arrow_file"
    if head.startswith(b"\xff\xff\xff\xff"):
        return "arrow_stream"
    if head.startswith(b"PK\x03\x04"):
        return "torch"
    stripped = head.removeprefix(b"\xef\xbb\xbf").lstrip()  # tolerate a UTF-8 byte-order mark
    if not stripped or stripped.startswith(b"{"):
        return "jsonl"
    raise DataError(f"{path}: not a length trace (JSONL objects, one per line), a trajectories file "
                    f"(Parquet or Arrow IPC) nor slime's rollout dump (torch.save); a rollout log of one row per "
                    f"response (CSV, ...): `pdsr trace convert {path} --out trace.jsonl` makes a trace of it")


def short_repr(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
