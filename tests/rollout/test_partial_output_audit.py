"""``pdsr rollout --steps`` on real vLLM engines, audited from its output file alone (tests/partial_audit.py walks
each row's segments itself): every step B complete groups of n, each response's tokens at most max_staleness
versions older than the step that consumed it, a restarted sample holding only its new tokens, an engine log-prob
per token, the summary's off-policy and partial tokens those of the file."""

from __future__ import annotations

import json

import pytest

from partial_audit import audit_steps, check_summary
from real_rollout import rollout
from support import requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s

#: forced lengths of 4 samples per group: a long sample in most groups, so unfinished samples cross step ends and
#: some are too stale for max_staleness 1
LENGTHS = {f"g{i}": lengths for i, lengths in enumerate(
    [[8, 8, 8, 200], [16, 8, 8, 8], [8, 200, 8, 8], [8, 8, 16, 8], [8, 8, 200, 8], [200, 8, 8, 8],
     [8, 16, 8, 8], [8, 8, 8, 200], [8, 8, 16, 8], [200, 8, 8, 8]])}
STEPS = dict(steps=4, step_groups=2, over_provision=1.0, max_staleness=1)   # 4 groups in flight, 2 consumed a step


@pytest.fixture()
def stream_data(tmp_path):
    path = tmp_path / "stream.jsonl"
    path.write_text("".join(json.dumps({"id": pid, "prompt": f"Question {pid}: count to {len(pid) * 9}.",
                                        "lengths": lengths}) + "\n" for pid, lengths in LENGTHS.items()))
    return path


def audited(summary, rows):
    audit = audit_steps(rows, b=2, n=4, staleness=1, lengths=LENGTHS, steps=4)
    check_summary({"batches": summary.batches}, audit)
    return audit


@pytest.mark.parametrize("kv", ["recompute", "keep"])
def test_a_steps_runs_file_passes_the_audit(engine_loop, engines, tiny_model_dir, tmp_path, stream_data, kv):
    """Sampled (temperature 1), the KV recomputed or kept at each update: the file passes the audit, some tokens are
    carried across an update (partial) and some samples restarted for staleness."""
    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, stream_data, "v3", kv_on_update=kv, **STEPS)
    audit = audited(summary, rows)
    assert sum(a["partial_tokens"] for a in audit.values()) > 0
    assert any(r["restarts"] for r in rows)
