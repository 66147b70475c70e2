"""Scoring a trajectories table: read token-id columns, score, add list<float32> column(s). A file, in blocks of
rows: :mod:`pdsr_sdk.scoring.file_run`."""

from __future__ import annotations


import numpy as np
import pyarrow as pa

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.columns import integer_token_ids, is_token_ids
from pdsr_sdk.io.tables import check_columns, list_column_to_numpy, numpy_to_list_array
from pdsr_sdk.progress import ProgressFactory
from pdsr_sdk.scoring.api import Ragged, ScoreStats, per_token_logps
from pdsr_sdk.scoring.config import ScoreConfig

LOGPS_DESCRIPTION = ("Log-probability of each response token given the prompt and the earlier response tokens, "
                     "under the scoring model (logits / temperature, fp32 log-softmax); one entry per "
                     "response token.")
ENTROPY_DESCRIPTION = ("Written with --entropy (torch backend). Entropy (nats) of the scoring model's next-token "
                       "distribution at each response position (logits / temperature); one entry per response token.")


def score_output_schema(column: str = "ref_logps", entropy: bool = True) -> pa.Schema:
    """Arrow schema of the column(s) ``pdsr score`` adds to the input table."""
    fields = [pa.field(column, pa.list_(pa.float32()), nullable=False,
                       metadata={"description": LOGPS_DESCRIPTION})]
    if entropy:
        fields.append(pa.field(f"{column}_entropy", pa.list_(pa.float32()), nullable=False,
                               metadata={"description": ENTROPY_DESCRIPTION}))
    return pa.schema(fields)


def _ragged_column(table: pa.Table, name: str, source: str) -> Ragged:
    column = table.column(name)
    if not is_token_ids(column.type):
        raise DataError(f"{source}: column {name!r} must be a list of integer token ids, got {column.type}")
    values, offsets = list_column_to_numpy(integer_token_ids(column), np.int64, name=name, path=source)
    return Ragged(values, offsets)


def _attach(table: pa.Table, name: str, arrays: list[np.ndarray], description: str) -> pa.Table:
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    values = np.concatenate(arrays).astype(np.float32) if arrays else np.zeros(0, np.float32)
    column = numpy_to_list_array(values, offsets, pa.float32())
    fld = pa.field(name, pa.list_(pa.float32()), nullable=False, metadata={"description": description})
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), fld, column)
    return table.append_column(fld, column)


def score_table(table: pa.Table, config: ScoreConfig, model, *, progress: ProgressFactory | None = None,
                source: str = "input") -> tuple[pa.Table, ScoreStats]:
    """Score ``table``'s completions with ``model`` (a loaded model, LLM, or directory) per ``config``."""
    check_columns(source, {config.prompt_column: "prompt_column", config.response_column: "response_column"},
                  table.column_names)
    prompts = _ragged_column(table, config.prompt_column, source)
    completions = _ragged_column(table, config.response_column, source)
    result = per_token_logps(model, prompts, completions, config.options(), progress=progress,
                             names=(config.prompt_column, config.response_column), source=source)
    out = _attach(table, config.column, result.logps, LOGPS_DESCRIPTION)
    if result.entropy is not None:
        out = _attach(out, f"{config.column}_entropy", result.entropy, ENTROPY_DESCRIPTION)
    return out, result.stats
