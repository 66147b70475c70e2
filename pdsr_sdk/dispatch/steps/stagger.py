"""Which samples a staggered update lets finish under the weights they started with, and on which engines.

At an update, a sample held by the step's end whose kept tokens are all of the ending version would otherwise go
on under the new weights, its tokens before the update then partial. Finishing it under the old weights keeps it
one version (off-policy by one, as a whole response that waited for its group is), at the price of the engines
that hold the old weights taking no other work until it ends: so they are gathered on the fewest engines that
have room for them, those holding most of them already (the others are moved there: their KV is recomputed)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pdsr_sdk.dispatch.protocols import Engine
from pdsr_sdk.dispatch.types import Sample, kept_segments


def plan_stagger(held: Sequence[tuple[Sample, Engine]], version: int) -> dict[Sample, Engine]:
    """``held``: the samples a step's end stopped, each with its engine (``Scheduler.held_on``); ``version``: the
    ending version. Returns the samples to finish under it, each with the engine to finish on: every unfinished
    single-turn sample with tokens, all of them of ``version``, on the fewest engines whose slots
    (``max_concurrency``) hold them all; among those sets, engines holding more of them first (ties in
    ``held``'s order)."""
    kept = [(s, e) for s, e in held if _one_version(s, version)]
    if not kept:
        return {}
    engines = {e.name: e for _, e in kept}
    slots = {name: e.max_concurrency for name, e in engines.items()}
    need = len(kept)
    fewest = next((k for k in range(1, len(slots) + 1) if sum(sorted(slots.values())[-k:]) >= need), len(slots))
    room: dict[str, int] = {}
    for name, _ in Counter(e.name for _, e in kept).most_common():
        left = fewest - len(room) - 1
        rest = sorted((slots[n] for n in slots if n != name and n not in room), reverse=True)[:left]
        if len(room) < fewest and sum(room.values()) + slots[name] + sum(rest) >= need:
            room[name] = slots[name]   # holds many of them, and the fewest engines can still hold all
    plan: dict[Sample, Engine] = {}
    moved = []
    for s, e in kept:
        if room.get(e.name, 0) > 0:
            plan[s] = e
            room[e.name] -= 1
        else:
            moved.append(s)
    for s in moved:   # each to the chosen engine with the most room left
        name = max(room, key=lambda n: room[n])
        plan[s] = engines[name]
        room[name] -= 1
    return plan


def _one_version(sample: Sample, version: int) -> bool:
    if sample.finished or sample.turns is not None or not sample.num_generated:
        return False
    return all(seg.policy_version == version for seg in kept_segments(sample) if seg.num_tokens)
