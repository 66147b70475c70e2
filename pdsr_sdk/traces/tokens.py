"""Token counts of text, for logs that hold a response's text and not its length: what ``pdsr trace convert
--tokenizer DIR`` counts with."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: texts per tokenizer call: a fast tokenizer encodes a batch in parallel, and a step's dump is never held twice
_BATCH = 1024


def count_tokens(tokenizer, texts: Sequence[str]) -> np.ndarray:
    """int64 number of tokens of each text as ``tokenizer`` (a Hugging Face tokenizer) encodes it without special
    tokens: what verl's dumps decoded (``skip_special_tokens=True``), so a finished response's end-of-sequence token
    is not counted, and re-encoding may split text differently from the sampled ids (docs/simulate.md measures by
    how much)."""
    out = np.empty(len(texts), dtype=np.int64)
    for start in range(0, len(texts), _BATCH):
        chunk = list(texts[start:start + _BATCH])
        ids = tokenizer(chunk, add_special_tokens=False)["input_ids"]
        out[start:start + len(chunk)] = [len(x) for x in ids]
    return out
