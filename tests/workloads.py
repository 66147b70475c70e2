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


def trajectory_rows(pid, n=2):
    """One group's rows of the trajectories table, ``n`` samples of one token each (for the writer's tests)."""
    from pdsr_sdk.dispatch.trajectory import trajectory_schema

    names = trajectory_schema().names
    base = {k: None for k in names}
    out = []
    for i in range(n):
        r = dict(base, prompt_id=pid, sample_index=i, group_size=n, batch_index=0, is_probe=i == 0,
                 prompt_token_ids=[1], response_token_ids=[2], prompt_text="p", response_text="r",
                 response_logprobs=[-0.1], finish_reason="stop", prompt_length=1, response_length=1,
                 segments=[], num_segments=0, moves=0, restarts=0, retries=0, steals=0, wasted_tokens=0,
                 submit_time_s=0.0, finish_time_s=1.0, policy_versions=[0])
        out.append(r)
    return out
