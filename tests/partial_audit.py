"""An audit of a ``pdsr rollout --steps`` output file from its rows alone, as a verl / slime user would check it: it
rebuilds each response's token versions from its segments with its own walk (not pdsr's accounting) and returns
per step what the summary should say. Shared by tests/rollout/test_partial_output_audit.py."""

from __future__ import annotations

import math
from collections import defaultdict


def token_walk(row: dict) -> tuple[list[int], int]:
    """The policy version of each token the row's response holds, and the tokens its restarts threw away.

    Segments are spans in order; each continues the response where it stands (``start_token`` = tokens so far),
    or starts it over at 0 (a restart: what came before is thrown away). Anything else is an error naming the row.
    """
    versions: list[int] = []
    thrown = 0
    for i, seg in enumerate(row["segments"]):
        assert seg["policy_version"] is not None and seg["num_tokens"] >= 0, (row["prompt_id"], i, seg)
        if seg["start_token"] == 0 and versions:
            thrown += len(versions)
            versions = []
        assert seg["start_token"] == len(versions), (
            f"{row['prompt_id']}/{row['sample_index']}: segment {i} starts at {seg['start_token']}, "
            f"the response holds {len(versions)} tokens")
        versions += [seg["policy_version"]] * seg["num_tokens"]
    return versions, thrown


def audit_steps(rows: list[dict], *, b: int, n: int, staleness: int, steps: int,
                lengths: dict[str, list[int]] | None = None) -> dict[int, dict]:
    """Check every row of a ``--steps`` run (version at step k's end: k, each step's end a weight update) and return,
    per step, the consumed tokens (``lengths``: each sample's forced length, checked), those older than the step's
    version (off-policy), the part of them in responses whose tokens span versions (partial: carried across an update)
    and the oldest token's age."""
    by_step: dict[int, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    seen = set()
    for r in rows:
        key = (r["prompt_id"], r["sample_index"])
        assert key not in seen, f"{key} consumed twice"
        seen.add(key)
        by_step[r["batch_index"]][r["prompt_id"]].append(r)
    assert sorted(by_step) == list(range(steps)), sorted(by_step)
    out = {}
    for k, groups in sorted(by_step.items()):
        assert len(groups) == b, f"step {k} consumed {len(groups)} groups, not {b}"
        tokens = off = partial = 0
        oldest = 0
        for pid, group in groups.items():
            assert sorted(r["sample_index"] for r in group) == list(range(n)), (k, pid)   # complete
            for r in group:
                versions, thrown = token_walk(r)
                length = r["response_length"] if lengths is None else lengths[pid][r["sample_index"]]
                assert r["finish_reason"] in ("stop", "length"), (k, pid, r["finish_reason"])   # whole
                assert len(versions) == r["response_length"] == len(r["response_token_ids"]) == length, (k, pid)
                # the engine's log-prob of every response token, and only of those
                assert len(r["response_logprobs"]) == length
                assert all(math.isfinite(x) and x <= 1e-4 for x in r["response_logprobs"]), (k, pid)
                assert thrown == r["wasted_tokens"] and (thrown > 0) <= (r["restarts"] > 0), (k, pid)
                # a restarted sample keeps none of its old tokens: its versions are those of what it holds
                assert r["policy_versions"] == sorted(set(versions)), (k, pid, r["policy_versions"], set(versions))
                assert all(k - staleness <= v <= k for v in versions), (k, pid, sorted(set(versions)))
                tokens += len(versions)
                older = sum(v < k for v in versions)
                off += older
                if len(set(versions)) > 1:
                    partial += older
                oldest = max([oldest] + [k - v for v in versions])
        out[k] = {"tokens": tokens, "off_policy_tokens": off, "partial_tokens": partial, "max_token_age": oldest}
    return out


def check_summary(summary: dict, audit: dict[int, dict]) -> None:
    """The summary's per-step accounting equals the file's."""
    batches = {b["batch_index"]: b for b in summary["batches"]}
    assert sorted(batches) == sorted(audit)
    for k, want in audit.items():
        got = batches[k]
        assert got["policy_version"] == k
        assert got["tokens"] == want["tokens"] and got["partial_tokens"] == want["partial_tokens"], (k, got, want)
        assert got["max_token_age"] == want["max_token_age"], (k, got, want)
        assert abs(got["off_policy_share"] - want["off_policy_tokens"] / want["tokens"]) < 1e-9, (k, got, want)
