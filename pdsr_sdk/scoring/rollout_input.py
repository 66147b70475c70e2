"""What ``pdsr score`` takes from a ``pdsr rollout`` file beyond its rows: the sampling temperature it recorded.

A rollout's engine log-probs are of the distribution it sampled from, logits / temperature, and verl computes a
step's old and reference log-probs at the rollout's temperature too. A file scored at another one gets log-probs
that differ from the engine's by far more than float noise (0.5 on average at 0.7 against 1.0, tiny model), so
where ``temperature`` is not given, the one the rollout recorded in the file's metadata is used.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from pdsr_sdk.scoring.config import ScoreConfig

#: the Parquet metadata key of a rollout's settings: pdsr_sdk.rollout.resume.METADATA_KEY (a layer above scoring)
ROLLOUT_METADATA = "pdsr_run"
#: the settings key of the rollout's sampling temperature there
TEMPERATURE_KEY = "sampling.temperature"


def recorded_temperature(schema: pa.Schema | None) -> float | None:
    """The sampling temperature a ``pdsr rollout`` file's metadata records, or None: no such record, or greedy
    sampling (temperature 0, whose engine log-probs are the model's at temperature 1, vLLM's rule)."""
    meta = (schema.metadata or {}) if schema is not None else {}
    raw = meta.get(ROLLOUT_METADATA.encode())
    if raw is None:
        return None
    try:
        settings: Any = json.loads(raw)
    except ValueError:
        return None
    value = settings.get(TEMPERATURE_KEY) if isinstance(settings, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return None
    return float(value)


def with_rollout_temperature(config: ScoreConfig, schema: pa.Schema | None) -> tuple[ScoreConfig, float | None]:
    """``config`` with the rollout's recorded temperature where ``temperature`` was not given (by a flag, a config
    file or a keyword), and that temperature (None: none recorded). A temperature given is kept as it is."""
    recorded = recorded_temperature(schema)
    if recorded is None or "temperature" in config.model_fields_set:
        return config, recorded
    return config.model_copy(update={"temperature": recorded}), recorded
