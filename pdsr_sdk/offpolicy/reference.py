"""Float64 loop twins of :mod:`pdsr_sdk.offpolicy.correction`, token by token (for tests)."""

from __future__ import annotations

import math
from typing import Any


def token_versions_naive(spans: list[tuple[int, int, int]], length: int) -> list[int]:
    """Each token's version: the last span (start, count, version) that covers it, else -1."""
    out = []
    for t in range(length):
        version = -1
        for start, count, v in spans:
            if start <= t < start + count:
                version = v
        out.append(version)
    return out


def importance_weights_naive(trainer: Any, rollout: Any, mask: Any, *, level: str, mode: str, upper: float,
                             lower: float | None = None, normalize: bool = False,
                             veto: float | None = None) -> tuple[list[list[float]], list[list[bool]]]:
    low = 1.0 / upper if lower is None else lower
    weights, keeps = [], []
    for lt_row, lr_row, m_row in zip(trainer, rollout, mask):
        total, count = 0.0, 0
        for lt, lr, m in zip(lt_row, lr_row, m_row):
            if m:
                total += float(lt) - float(lr)
                count += 1
        w_row, k_row = [], []
        for lt, lr, m in zip(lt_row, lr_row, m_row):
            if level == "token":
                log_ratio = float(lt) - float(lr)
            elif level == "sequence":
                log_ratio = total
            else:
                log_ratio = total / max(count, 1)
            ratio = math.exp(min(max(log_ratio, -20.0), 20.0))
            if mode == "truncate":
                keep, w = bool(m), min(ratio, upper) if lower is None else min(max(ratio, lower), upper)
            else:
                keep, w = bool(m) and low <= ratio <= upper, ratio
            w_row.append(w)
            k_row.append(keep)
        weights.append(w_row)
        keeps.append(k_row)
    if normalize:
        kept = [(w, i) for i, (w_row, k_row) in enumerate(zip(weights, keeps)) for w, k in zip(w_row, k_row) if k]
        if level != "token":   # one weight per sequence with a kept token
            kept = list({i: (w, i) for w, i in kept}.values())
        mean = sum(w for w, _ in kept) / len(kept) if kept else 1.0
        mean = mean if mean > 1e-8 else 1.0
        weights = [[w / mean for w in w_row] for w_row in weights]
    if veto is not None:
        for i, (lt_row, lr_row, m_row) in enumerate(zip(trainer, rollout, mask)):
            if any(m and float(lt) - float(lr) < math.log(veto) for lt, lr, m in zip(lt_row, lr_row, m_row)):
                keeps[i] = [False] * len(keeps[i])
    return [[w if k else 0.0 for w, k in zip(w_row, k_row)] for w_row, k_row in zip(weights, keeps)], keeps
