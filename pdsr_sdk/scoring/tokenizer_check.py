"""Were a file's token ids made by the scoring model's tokenizer? Ids of another tokenizer are in the vocabulary
all the same (its size is all that :func:`~pdsr_sdk.scoring.api.validate_rows` can check), and score as
nonsense. ``pdsr rollout`` writes each response's text beside its ids (``response_text``, decoded with
``skip_special_tokens``): where the file has it and the model directory has a tokenizer, a few rows are decoded
with that tokenizer, and if none gives its text back the file is refused, naming a row.
"""

from __future__ import annotations

from pathlib import Path

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.blocks import TableBatches

#: the text column of ``pdsr rollout``'s trajectories
TEXT_COLUMN = "response_text"
#: rows looked at (those with both ids and text); one of them decoding to its text is enough
ROWS_CHECKED = 16


def check_tokenizer(source: TableBatches, model_dir: Path, ids_column: str, where: str) -> None:
    """A DataError naming ``where``, a row and both texts where ``model_dir``'s tokenizer decodes none of the first
    :data:`ROWS_CHECKED` rows' ``ids_column`` to their ``response_text``; nothing where either is missing."""
    if TEXT_COLUMN not in source.schema.names or ids_column == TEXT_COLUMN:
        return
    rows = _first_rows(source, ids_column)
    if not rows:
        return
    tokenizer = _tokenizer(model_dir)
    if tokenizer is None:
        return
    decoded = []
    for row, ids, text in rows:
        got = tokenizer.decode(ids, skip_special_tokens=True)
        if got == text:
            return
        decoded.append((row, got, text))
    row, got, text = decoded[0]
    raise DataError(f"{where}: row {row}: {ids_column} decode with the tokenizer of {model_dir} to {got[:60]!r}, "
                    f"but its {TEXT_COLUMN} is {text[:60]!r} (and so for the {len(decoded)} row(s) looked at): the "
                    f"ids were made by another tokenizer, and their log-probs under this model would mean nothing. "
                    f"Score with a model of the rollout's tokenizer")


def _first_rows(source: TableBatches, ids_column: str) -> list[tuple[int, list[int], str]]:
    out: list[tuple[int, list[int], str]] = []
    first = 0
    for batch in source.batches([ids_column, TEXT_COLUMN], rows=ROWS_CHECKED * 4):
        ids, texts = batch.column(ids_column).to_pylist(), batch.column(TEXT_COLUMN).to_pylist()
        for i, (row_ids, text) in enumerate(zip(ids, texts)):
            if row_ids and isinstance(text, str) and text.strip():
                out.append((first + i, row_ids, text))
                if len(out) == ROWS_CHECKED:
                    return out
        first += batch.num_rows
        if first >= ROWS_CHECKED * 16:   # a file of failed samples: stop looking
            break
    return out


def _tokenizer(model_dir: Path):
    """The model directory's tokenizer, or None where it has none (or it cannot be loaded: nothing to check)."""
    if not any((model_dir / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(model_dir))
    except Exception:  # noqa: BLE001 - a tokenizer that does not load is no evidence either way
        return None
