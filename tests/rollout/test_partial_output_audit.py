"""``pdsr rollout --steps`` on real vLLM engines, audited from its output file alone (tests/partial_audit.py walks
each row's segments itself): every step B complete groups of n, each response's tokens at most max_staleness
versions older than the step that consumed it, a restarted sample holding only its new tokens, an engine log-prob
per token, the summary's off-policy and partial tokens those of the file; the same for a run stopped after its
second step and resumed, whose TIS weights on a recomputation (``pdsr score``) are what the formula gives."""

from __future__ import annotations

import json
import math

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


def audited(summary, rows, staleness=1):
    audit = audit_steps(rows, b=2, n=4, staleness=staleness, lengths=LENGTHS, steps=4)
    check_summary({"batches": summary.batches}, audit)
    return audit


@pytest.mark.parametrize("kv,staleness", [("recompute", 1), ("keep", 1), ("recompute", 0)])
def test_a_steps_runs_file_passes_the_audit(engine_loop, engines, tiny_model_dir, tmp_path, stream_data, kv,
                                           staleness):
    """Sampled (temperature 1), the KV recomputed or kept at each update: the file passes the audit. A step ends
    when 2 groups are complete, which the groups of short samples are long before a 200-token sample is, so
    unfinished samples are carried: with max_staleness 1 their older tokens are partial ones, with 0 each is
    restarted and holds only its new tokens. (Which samples cross a step end otherwise depends on timing.)"""
    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, stream_data, "v3", kv_on_update=kv,
                            **{**STEPS, "max_staleness": staleness})
    audit = audited(summary, rows, staleness)
    if staleness:
        assert sum(a["partial_tokens"] for a in audit.values()) > 0
    else:
        assert any(r["restarts"] and r["wasted_tokens"] for r in rows)


def test_a_steps_run_stopped_after_its_second_step_resumes_to_a_file_that_passes_the_audit(
        engine_loop, engines, tiny_model_dir, tmp_path, stream_data, monkeypatch):
    """Stopped in the weight update after step 1 (its rows, the groups it carries and the summary on disk: what a
    SIGINT or SIGTERM there leaves) and ``--resume``d: the file passes the audit with steps 0-3 numbered on, every
    carried group consumed once after the resume, each carried sample's tokens and log-probs kept as its prefix
    unless it was restarted for staleness, and the summary's steps those of the file, before and after."""
    import pyarrow.parquet as pq

    from pdsr_sdk.rollout.session import RolloutSession
    from pdsr_sdk.rollout.writer import carry_file

    update = RolloutSession.anext_version
    calls = []

    async def stopped_at_the_second(self):
        calls.append(self.policy_version)
        if len(calls) == 2:
            raise RuntimeError("stopped after step 1")
        return await update(self)

    opts = {**STEPS, "sampling.temperature": 0.7}
    monkeypatch.setattr(RolloutSession, "anext_version", stopped_at_the_second)
    with pytest.raises(RuntimeError, match="stopped after step 1"):
        rollout(engine_loop, engines, tiny_model_dir, tmp_path, stream_data, "v3", **opts)
    monkeypatch.setattr(RolloutSession, "anext_version", update)
    out = tmp_path / "v3.parquet"
    before = pq.read_table(out.with_name(out.name + ".parts")).to_pylist()
    carry = pq.read_table(carry_file(out)).to_pylist()
    assert {r["batch_index"] for r in before} == {0, 1} and len({r["prompt_id"] for r in before}) == 4
    carried = {r["prompt_id"] for r in carry}
    assert carried and not carried & {r["prompt_id"] for r in before}

    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, stream_data, "v3", **opts,
                            **{"output.resume": True})
    audited(summary, rows)
    assert summary.skipped_groups == 4 and summary.groups == 8
    got = {(r["prompt_id"], r["sample_index"]): r for r in rows}
    assert all(got[(r["prompt_id"], r["sample_index"])]["batch_index"] in (0, 1) for r in before)
    assert carried <= {r["prompt_id"] for r in rows if r["batch_index"] >= 2}   # nothing carried is lost
    for c in carry:
        r = got[(c["prompt_id"], c["sample_index"])]
        if r["restarts"] == c["restarts"]:   # not restarted since: continued from its tokens
            n = c["response_length"]
            assert r["response_token_ids"][:n] == c["response_token_ids"]
            assert r["response_logprobs"][:n] == c["response_logprobs"]
    # whether a carried sample was part-made, and not restarted since, is the engines' timing: where one was, the
    # loop above held its prefix (a loaded machine may leave none; asserting one would fail it, not the code)
    tis_on_a_recomputation(out, tiny_model_dir, tmp_path, temperature=0.7)


def tis_on_a_recomputation(path, model, tmp_path, *, temperature):
    """``pdsr score`` of the file (at the run's temperature, read from it) is the trainer's recomputation: it
    matches the engines' fp32 log-probs, and importance_weights' TIS weights and keep are what the formula gives,
    token by token: min(exp(recomputed - rollout), upper), clipped below at lower when given, every token kept."""
    import numpy as np
    import pyarrow.parquet as pq

    from cli_checks import invoke
    from pdsr_sdk import importance_weights

    scored = tmp_path / "scored.parquet"
    res = invoke("score", "--model", model, "--data", path, "--column", "old_logps", "--out", scored)
    assert res.exit_code == 0 and f"at temperature {temperature}" in res.output, res.output
    rows = pq.read_table(scored).to_pylist()
    width = max(r["response_length"] for r in rows)
    old, eng, mask = (np.zeros((len(rows), width)) for _ in range(3))
    for i, r in enumerate(rows):
        m = r["response_length"]
        old[i, :m], eng[i, :m], mask[i, :m] = r["old_logps"], r["response_logprobs"], 1
    assert np.abs(old - eng)[mask > 0].max() < 1e-3   # fp32 engines and scorer
    for upper, lower in ((2.0, None), (1.0, None), (1.0, 0.99999)):   # 1.0: about half the tokens truncated
        weights, keep = importance_weights(old, eng, mask, level="token", mode="truncate", upper=upper, lower=lower)
        for i, r in enumerate(rows):
            for t in range(width):
                if t >= r["response_length"]:
                    assert weights[i, t] == 0 and not keep[i, t]
                    continue
                want = min(math.exp(r["old_logps"][t] - r["response_logprobs"][t]), upper)
                want = want if lower is None else max(want, lower)
                assert keep[i, t] and abs(weights[i, t] - want) < 1e-12, (i, t, weights[i, t], want)
        truncated = int((weights[keep] == upper).sum())
        assert upper != 1.0 or 0 < truncated < keep.sum()
