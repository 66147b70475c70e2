"""A model directory for scoring: checked before anything is read, and the dtype its ``config.json`` names."""

from __future__ import annotations

import json
from pathlib import Path

from pdsr_sdk.errors import DataError

#: the weight dtypes scoring loads a model in (``ScoreOptions.dtype``)
DTYPES = ("auto", "float32", "bfloat16", "float16")


def check_model_dir(model_dir: str | Path) -> Path:
    """``model_dir`` as a Path, or a DataError naming it: it must be a folder with a ``config.json``."""
    path = Path(model_dir)
    if path.is_file():
        raise DataError(f"{path}: is a file; expected a Hugging Face model directory (with config.json)")
    if not path.is_dir():
        raise DataError(f"{path}: model directory does not exist")
    if not (path / "config.json").is_file():
        raise DataError(f"{path}: not a Hugging Face model directory (no config.json in it)")
    return path


def checkpoint_dtype(model_dir: str | Path) -> str:
    """The dtype a model directory's ``config.json`` names (``torch_dtype``, or ``dtype`` as newer transformers
    write it), as scoring's ``dtype`` spells it; ``"auto"`` where it names none we know. Scoring's ``auto`` means
    this on every backend: vLLM's own ``auto`` runs a float32 checkpoint in bf16, which would give reference
    log-probs of another precision than the torch backend's (and the trainer's)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return "auto"
    named = config.get("torch_dtype") or config.get("dtype") if isinstance(config, dict) else None
    named = {"float": "float32", "half": "float16"}.get(named, named) if isinstance(named, str) else None
    return named if named in DTYPES and named != "auto" else "auto"
