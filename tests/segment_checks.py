"""Shared by the real-engine tests that compare a segmented run with one request per sample (tests/rollout/
test_stop_split.py, test_sampling_options_vllm.py): the segment settings of each, the prompts, and a stop string
that a segment boundary splits."""

from __future__ import annotations

SEGMENT = 8
WHOLE = {"min_tokens": 64, "max_tokens": 64}   # one request per sample
SPLIT = {"min_tokens": SEGMENT, "max_tokens": SEGMENT}


def records(tok, texts: list[str]) -> list:
    """Prompt records ``q0``, ``q1`` ... of ``texts``, tokenized by ``tok``."""
    from pdsr_sdk.rollout.data import PromptRecord

    return [PromptRecord(prompt_id=f"q{i}", text=t, token_ids=tok.encode(t)) for i, t in enumerate(texts)]


def split_stop(tok, token_ids) -> str | None:
    """A stop string whose first occurrence in the response's text begins before a segment boundary and ends after
    it (so pdsr's own check, not vLLM's, finds it in the segmented run), or None."""
    def text(n):
        return tok.decode(token_ids[:n], skip_special_tokens=True)
    whole = text(len(token_ids))
    for boundary in range(SEGMENT, len(token_ids) - 2, SEGMENT):
        at = len(text(boundary))
        stop = text(boundary + 2)[len(text(boundary - 1)):]
        first = whole.find(stop)
        if len(stop.strip()) >= 2 and 0 <= first < at < first + len(stop):
            return stop
    return None
