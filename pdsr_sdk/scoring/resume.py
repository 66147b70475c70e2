"""What ``pdsr score --resume`` continues: the finished blocks of an interrupted run, in ``<out>.parts/``.

Each block of rows is written, scored, to ``<out>.parts/block-NNNNN.parquet`` (atomically) with the run's
settings in its metadata; the finished run merges them into ``out`` (which keeps the settings) and removes the
folder. A resumed run must have every setting that changes a number (:data:`RESUMED_KEYS`, those its scoring
reads: :func:`unused_keys`), the same model (by name and a fingerprint of its weight files) and the same input
rows block for block; otherwise it is refused, naming each difference.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.output_lock import parts_dir
from pdsr_sdk.io.resume_check import check_resume_settings
from pdsr_sdk.scoring.config import ScoreConfig, score_flag

METADATA_KEY = b"pdsr_score"
#: config keys a resumed run must share with the run it continues: each can change a log-prob (or a column)
RESUMED_KEYS = ("prompt_column", "response_column", "column", "entropy", "temperature", "backend", "device", "dtype",
                "mbs", "max_tokens_per_micro_batch", "token_grouping", "max_padding_fraction", "length_bucket",
                "row_chunk", "attention_mask", "pack", "packed_attention", "pad_id", "block_tokens")
#: bytes read from the start and the end of each weight file for the model's fingerprint
FINGERPRINT_BYTES = 1 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def part_path(out: str | Path, index: int) -> Path:
    return parts_dir(out) / f"block-{index:05d}.parquet"


def model_fingerprint(model_dir: str | Path) -> str:
    """A short hash of a model directory's config.json and, per weight file, its name, size and first and last
    MiB: two checkpoints of one model (``global_step_10/actor`` and ``global_step_20/actor``) differ, and a
    many-GB checkpoint costs a few MiB of reading."""
    path = Path(model_dir)
    digest = hashlib.blake2b(digest_size=8)
    digest.update((path / "config.json").read_bytes())
    for file in sorted(p for p in path.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES):
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with file.open("rb") as fh:
            digest.update(fh.read(FINGERPRINT_BYTES))
            if size > FINGERPRINT_BYTES:
                fh.seek(max(FINGERPRINT_BYTES, size - FINGERPRINT_BYTES))
                digest.update(fh.read())
    return digest.hexdigest()


def run_settings(config: ScoreConfig, model_dir: str | Path) -> dict[str, Any]:
    """The settings a resumed run must match. Model and data by folder/file name (plus the model's fingerprint),
    so a run directory moved to another mount still resumes."""
    settings: dict[str, Any] = {"model": f"{Path(model_dir).name} (weights {model_fingerprint(model_dir)})",
                                "data": Path(config.data).name}
    device = config.device
    if config.device == "auto" and config.backend == "torch":   # the device it means here: cpu and cuda differ
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    unused = unused_keys(config, device)
    settings.update({key: getattr(config, key) for key in RESUMED_KEYS if key not in unused})
    if "device" not in unused:
        settings["device"] = device
    if "pack" not in unused:   # as the forward runs: unset is the measured rule's choice for this device
        settings["pack"] = packs(config, device)
    return settings


def packs(config: ScoreConfig, device: str) -> bool:
    """Whether the torch backend runs packed forwards for ``config`` on ``device``."""
    from pdsr_sdk.scoring.packed import resolve_pack

    return resolve_pack(config.pack, device.split(":")[0])


def unused_keys(config: ScoreConfig, device: str) -> frozenset[str]:
    """The keys of :data:`RESUMED_KEYS` that ``config``'s scoring does not read on ``device``, so that a resume
    need not match them: the torch backend's forward options under ``vllm`` (its engine batches unpadded tokens
    itself); under a packed forward its padding's; with ``mbs`` the token quota's grouping; unpacked,
    ``packed_attention``. A backend given by import path may read any of them."""
    if config.backend == "vllm":
        return frozenset(("device", "token_grouping", "max_padding_fraction", "length_bucket", "row_chunk",
                          "attention_mask", "pack", "packed_attention", "pad_id"))
    if config.backend != "torch":
        return frozenset()
    if packs(config, device):
        return frozenset(("token_grouping", "max_padding_fraction", "length_bucket", "attention_mask", "pad_id"))
    grouping = ("token_grouping", "max_padding_fraction") if config.mbs is not None else ()
    return frozenset(("packed_attention",) + grouping)


def check_settings(where: Path, then: dict[str, Any], now: dict[str, Any]) -> None:
    """A ConfigError naming every setting of ``now`` that differs from ``then`` (the run in ``where``); ``then``
    holds every key of its run's :func:`run_settings`, so one it lacks (a run of an older pdsr) differs too."""
    flags = {key: {"model": "--model", "data": "--data"}.get(key) or score_flag(key) for key in now}
    check_resume_settings(where, then, now, flags, complete=True)


@dataclass(frozen=True)
class Part:
    """A finished block on disk."""

    path: Path
    index: int
    first_row: int
    rows: int
    run_id: str
    settings: dict[str, Any]


def read_meta(path: Path) -> dict[str, Any] | None:
    """The ``pdsr_score`` metadata of a Parquet file (a part or a finished output), or None."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types
        raise DataError(f"{path}: cannot read it to resume: {exc}; remove it to score its rows again") from None
    return json.loads(meta[METADATA_KEY]) if METADATA_KEY in meta else None


def finished_parts(out: Path) -> list[Part]:
    """The blocks in ``<out>.parts/``, numbered 0, 1, ... without a gap (a later one is scored again)."""
    folder = parts_dir(out)
    if not folder.is_dir():
        return []
    parts = []
    for index, path in enumerate(sorted(folder.glob("block-*.parquet"))):
        meta = read_meta(path)
        if meta is None or path != part_path(out, index):
            break
        parts.append(Part(path, index, int(meta["first_row"]), int(meta["rows"]), meta["run_id"], meta["settings"]))
    return parts


def remove_temps(out: Path) -> None:
    """Half-written parts of a killed run (atomic writes' temp files in the parts folder: only ours are there)."""
    folder = parts_dir(out)
    if folder.is_dir():
        for tmp in folder.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
