"""Length-controlled replay: turn a length trace into a prompts file that forces its lengths.

Each prompt group becomes one prompt row with a ``target_lengths`` column;
run it with ``data.target_lengths_column="target_lengths"`` and
``sampling.ignore_eos=True`` so every sample generates exactly its recorded
length. Prompt texts are filler cut to the trace's prompt length in tokens
(the chat template adds a few).
"""

from __future__ import annotations

import json
from pathlib import Path

from pdsr_sdk.io.tables import write_text_atomic

FILLER = ("Consider the following problem carefully and reason about every step before answering. "
          "The quick brown fox jumps over the lazy dog while seven numbers add up to a prime. ")


def write_replay_prompts(trace, path: str | Path, tokenizer=None) -> Path:
    """Write ``trace`` (a LengthTrace) as JSONL prompts with ``target_lengths`` (and finish reasons)."""
    filler_ids = tokenizer(FILLER * 64, add_special_tokens=False)["input_ids"] if tokenizer is not None else None
    lines = []
    for i in range(trace.num_groups):
        g = trace.group(i)
        plen = max(1, int(g.get("prompt_len") or 16))
        if filler_ids is not None:
            text = tokenizer.decode(filler_ids[: min(plen, len(filler_ids))])
        else:
            text = " ".join(FILLER.split()[:plen])
        row = {"id": g["prompt_id"], "prompt": f"[{g['prompt_id']}] {text}",
               "target_lengths": [int(x) for x in g["lengths"]]}
        if g.get("finish_reasons"):
            row["finish_reasons"] = list(g["finish_reasons"])
        lines.append(json.dumps(row))
    return write_text_atomic("\n".join(lines) + "\n", path)
