"""Budget-aware dynamic segment length (pure arithmetic)."""

from __future__ import annotations


def next_segment_len(capacity_tokens: int, n_active: int, min_tokens: int, max_tokens: int) -> int:
    """``L_next = clamp(capacity_tokens / n_active, min_tokens, max_tokens)``.

    Many active requests -> short segments (short requests leave early and
    decisions come often); few -> long ones (the tail runs with little
    scheduling overhead).
    """
    if n_active <= 0:
        return max_tokens
    return max(min_tokens, min(max_tokens, capacity_tokens // n_active))
