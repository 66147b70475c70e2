"""The controlled workload shared by the scheduler, vLLM and Ray tests.

Forced response lengths per prompt (sample 0 is the probe), chosen so that
v2.5 with ``offload_fraction=0.4`` has a hand-computable dispatch: probes
100, 40, 10, 60, 20 -> p0 and p3 go heavy; L_cut = 60; fast cap = 90;
p1/2 (130) and p2/3 (91) break; p4/1 (90) fits exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

LENGTHS = {
    "p0": [100, 90, 120, 80],
    "p1": [40, 30, 130, 45],
    "p2": [10, 12, 8, 91],
    "p3": [60, 50, 95, 55],
    "p4": [20, 90, 15, 22],
}


def write_replay_prompts(path: Path) -> Path:
    """A JSONL prompts file with a ``lengths`` column forcing :data:`LENGTHS`."""
    with path.open("w") as fh:
        for i, (pid, lengths) in enumerate(LENGTHS.items()):
            fh.write(json.dumps({"id": pid, "prompt": f"Question {i}: what is {i} + {i * 3}?",
                                 "answer": str(4 * i), "lengths": lengths}) + "\n")
    return path
