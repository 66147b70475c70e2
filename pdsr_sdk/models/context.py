"""The longest context a Hugging Face model directory allows, read from its config.json as vLLM reads it (shared
by ``pdsr rollout``'s prompt-length checks and ``pdsr score``'s row checks)."""

from __future__ import annotations

import json
from pathlib import Path

#: config.json keys vLLM reads the model's context from (the smallest present wins)
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
                 "model_max_length")


def model_context(model_dir: str | Path) -> tuple[int | None, str]:
    """The longest context ``model_dir``'s config.json allows (rope scaling applied as vLLM does: ``rope_scaling``,
    or ``rope_parameters`` as transformers 5 writes it), and where that number comes from; (None, "") when the
    config names none."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, ""
    return config_context(cfg, str(path))


def config_context(cfg: dict, where: str) -> tuple[int | None, str]:
    """:func:`model_context` of a config already read (a config.json's dict, ``model.config.to_dict()``);
    ``where`` names it in the source."""
    if not isinstance(cfg, dict):
        return None, ""
    cfg = {**cfg.get("text_config", {}), **cfg} if isinstance(cfg.get("text_config"), dict) else cfg
    found = [(int(cfg[k]), k) for k in POSITION_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 0]
    if not found:
        return None, ""
    limit, key = min(found)
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rope = rope if isinstance(rope, dict) else {}
    kind = rope.get("rope_type", rope.get("type"))
    if isinstance(rope.get("factor"), (int, float)) and kind not in ("su", "longrope", "llama3", "default", "mrope"):
        if kind == "yarn" and "original_max_position_embeddings" in rope:
            limit = int(rope["original_max_position_embeddings"])
        limit, key = int(limit * rope["factor"]), f"{key} x rope_scaling.factor"
    return limit, f"{key} in {where}"
