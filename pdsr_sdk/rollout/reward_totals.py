"""What rewards add to a run's and a step's summaries: sums and counts per group, added up per batch and
across a resume (the means of a dict reward's numeric fields among them, verl's ``reward_extra_info``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GroupRewards:
    """What a written group's rewards add to the summary: their sum and count, the checks timed out, the reward
    functions that failed, the seconds they took, and each numeric key of their dicts' sum and count."""

    reward_sum: float = 0.0
    rewarded_samples: int = 0
    reward_timeouts: int = 0
    reward_errors: int = 0
    reward_s: float = 0.0
    reward_extra_sums: dict[str, list[float]] = field(default_factory=dict)   # key -> [sum, samples]

    @classmethod
    def of_rows(cls, rows: list[dict[str, Any]], scored: list) -> "GroupRewards":
        """A group's rewards from its written ``rows`` (``sample_row``'s) and their ``scored`` results."""
        given = [r["reward"] for r in rows if r["reward"] is not None]
        out = cls(sum(given), len(given), sum(sc.timeouts for sc in scored),
                  sum(r["reward_error"] is not None for r in rows), sum(sc.seconds for sc in scored))
        for r in rows:
            extra = r.get("reward_extra")   # the dict's other fields as JSON text (score_sample)
            for key, value in (json.loads(extra) if isinstance(extra, str) else extra or {}).items():
                if isinstance(value, (bool, int, float)) and math.isfinite(value):
                    acc = out.reward_extra_sums.setdefault(key, [0.0, 0])
                    acc[0] += float(value)
                    acc[1] += 1
        return out

    def add(self, other: "GroupRewards") -> None:
        for name in ("reward_sum", "rewarded_samples", "reward_timeouts", "reward_errors", "reward_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.reward_extra_sums = add_extra_sums(self.reward_extra_sums, other.reward_extra_sums)


def add_extra_sums(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, list[float]]:
    """Two batches' ``reward_extra_sums`` (a reward dict's numeric key -> [sum, samples]) added up."""
    zero = [0.0, 0]
    return {k: [a.get(k, zero)[0] + b.get(k, zero)[0], a.get(k, zero)[1] + b.get(k, zero)[1]] for k in {**a, **b}}


def extra_means(sums: dict[str, list[float]]) -> dict[str, float]:
    """Each key's mean over the samples that have it, from ``reward_extra_sums`` (key -> [sum, samples])."""
    return {k: total / n for k, (total, n) in sorted(sums.items()) if n}
