"""Speculative decoding for the simulator from what ``bench/spec.py`` measured: its acceptance file.

The simulator takes two means per engine (:class:`~pdsr_sdk.sim.config.SpeculationProfile`): the tokens a step
yields while drafting is on, tokens / (tokens - accepted drafted tokens), and the drafted tokens per step as a share
of the full draft, drafted / ((tokens - accepted) x k). Both count every step, the steps where the drafter found
nothing too: a drafter that abstains accepts more per verify step without making the step any faster. Drafting runs
while few requests run, which is the tail of a step, so the tail's counts are used (``token_tail``, after 90% of
the step's tokens, else ``tail``, else the whole step), averaged over the file's data sets unless one is named. The
verify step's cost is the H100 row for the file's number of drafted tokens.

Acceptance also changes along a response (SmolLM2 at temperature 1: ``group`` yields 1.13 tokens a step in a
response's first 64 tokens and 1.06 past 448). The file's ``by_position`` rows give the same two means per bin of
response positions; the simulator then reads each running request's bin (``SpeculationProfile.by_position``).
The file's marginal acceptance by finished siblings is not used: a segment launched after more siblings finished is
also later in its response, so the two cannot be told apart from it. Its joint table (``by_position_and_siblings``,
written by bench/spec.py since 2026-11-29) is: each cell of at least ``MIN_CELL_STEPS`` verify steps in a data set
gives that bin's means for requests launched with that many siblings finished.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pdsr_sdk.errors import DataError

#: a verify step's cost relative to a decode step, by running requests, per number of drafted tokens a request:
#: one H100, one 7B-shaped layer at context 2048, CUDA graphs (bench/verify_cost.py, 2026-11-27)
H100_VERIFY_COST: dict[int, list[tuple[int, float]]] = {
    2: [(1, 1.10), (8, 1.15), (32, 1.19), (128, 1.25), (256, 1.29)],
    4: [(1, 1.08), (8, 1.15), (32, 1.22), (128, 1.36), (256, 1.41)],
    8: [(1, 1.11), (8, 1.19), (32, 1.34), (128, 1.61), (256, 1.83)],
}


#: verify steps a (position, siblings) cell needs in a data set to be read (fewer: the position's row stands)
MIN_CELL_STEPS = 100


def verify_cost_for(k: int) -> list[tuple[int, float]]:
    """The measured H100 row for ``k`` drafted tokens (the nearest measured k at or above it, else 8's)."""
    at_least = [m for m in sorted(H100_VERIFY_COST) if m >= k]
    return list(H100_VERIFY_COST[at_least[0] if at_least else 8])


def speculation_from_acceptance(path: str | Path, method: str, *, dataset: str | None = None,
                                max_batch: int = 32, by_position: bool = True) -> dict[str, Any]:
    """A profile's ``speculation`` section from ``bench/spec.py``'s acceptance file for ``method`` (``ngram``,
    ``group``, ...): tokens_per_step and draft_load from the tail's counts, the verify cost for the file's number
    of drafted tokens, ``max_batch``, and with ``by_position`` (where the file has the rows) the two means by
    response position, and by position and finished siblings. A DataError names the file and what is missing."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise DataError(f"{path}: cannot read the acceptance file: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise DataError(f"{path}: the acceptance file is not JSON ({exc})") from None
    sets = doc.get("datasets") if isinstance(doc, dict) else None
    if not isinstance(sets, dict) or not sets:
        raise DataError(f"{path}: not an acceptance file of bench/spec.py (no 'datasets')")
    if dataset is not None:
        if dataset not in sets:
            raise DataError(f"{path}: no data set {dataset!r}; it has {', '.join(sorted(sets))}")
        sets = {dataset: sets[dataset]}
    k = int(doc.get("k", 4))
    per_set = []
    bins: dict[int, list[tuple[float, float]]] = {}
    cells: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for name, entry in sets.items():
        methods = entry.get("methods", {})
        if method not in methods:
            raise DataError(f"{path}: data set {name!r} has no method {method!r}; it has {', '.join(sorted(methods))}")
        m = methods[method]
        counts = next((m[key] for key in ("token_tail", "tail", "whole")
                       if isinstance(m.get(key), dict) and m[key].get("verify_steps")), None)
        if counts is None:
            raise DataError(f"{path}: method {method!r} on {name!r} has no verify steps (speculation off?)")
        steps = counts["tokens"] - counts["accepted"]
        if steps <= 0:
            raise DataError(f"{path}: method {method!r} on {name!r}: accepted {counts['accepted']} of "
                            f"{counts['tokens']} tokens")
        per_set.append(_means(counts, k))
        for row in m.get("by_position") or () if by_position else ():
            if row["tokens"] > row["accepted"]:
                bins.setdefault(int(row["start"]), []).append(_means(row, k))
        for row in m.get("by_position_and_siblings") or () if by_position else ():
            if row["verify_steps"] >= MIN_CELL_STEPS and row["tokens"] > row["accepted"]:
                cells.setdefault((int(row["start"]), int(row["finished"])), []).append(_means(row, k))
    out = {"tokens_per_step": _average(per_set)[0], "draft_load": _average(per_set)[1],
           "verify_cost": verify_cost_for(k), "max_batch": max_batch, "num_speculative_tokens": k}
    if 0 in bins:   # each bin's means over the data sets that reached it
        out["by_position"] = [(start, *_average(v)) for start, v in sorted(bins.items())]
        joint = [(p, f, *_average(v)) for (p, f), v in sorted(cells.items()) if p in bins]
        if joint:
            out["by_position_and_siblings"] = joint
    return out


def _means(counts: dict[str, Any], k: int) -> tuple[float, float]:
    """(tokens_per_step, draft_load) of one set of counts: every step counted, those that drafted nothing too."""
    steps = counts["tokens"] - counts["accepted"]
    return counts["tokens"] / steps, min(1.0, counts["drafted"] / (steps * k))


def _average(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """Both means averaged over data sets."""
    return sum(t for t, _ in pairs) / len(pairs), sum(d for _, d in pairs) / len(pairs)
