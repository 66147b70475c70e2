"""``pdsr rollout`` on real vLLM engines (CPU build, tiny model): every policy, dispatch, moves, resume.

Two engines (fast-0 on core 0, heavy-0 on core 1) are started once for the
session and shared by every test through one background event loop (tests/conftest.py).
"""

from __future__ import annotations


import pyarrow.parquet as pq
import pytest

from real_rollout import by_key, rollout
from support import requires_vllm
from workloads import LENGTHS

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s


@pytest.mark.parametrize("policy", ["baseline", "v1", "v2", "v2.5", "lpt"])
def test_every_policy_writes_b_x_n_consistent_samples(policy, engine_loop, engines, tiny_model_dir, tmp_path,
                                                     replay_data):
    from transformers import AutoTokenizer

    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, policy)
    assert summary.samples == len(rows) == 20
    assert set(by_key(rows)) == {(p, i) for p in LENGTHS for i in range(4)}
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for r in rows:
        want = LENGTHS[r["prompt_id"]][r["sample_index"]]
        assert r["response_length"] == len(r["response_token_ids"]) == len(r["response_logprobs"]) == want
        assert all(lp <= 0.0 for lp in r["response_logprobs"])
        assert r["response_text"] == tok.decode(r["response_token_ids"], skip_special_tokens=True)
        assert r["prompt_length"] == len(r["prompt_token_ids"]) and r["prompt_token_ids"]
        assert sum(s["num_tokens"] for s in r["segments"]) - r["wasted_tokens"] == want
        assert r["finish_time_s"] >= r["submit_time_s"] >= 0
        for seg in r["segments"]:   # a span with tokens saw its first one after submit, at or before its end
            if seg["num_tokens"]:
                assert seg["submit_time_s"] <= seg["first_token_time_s"] <= seg["end_time_s"]
        assert r["reward"] in (0.0, 1.0)
        assert r["policy_versions"] == [0] and r["batch_index"] == 0
    if policy != "baseline":
        assert sum(r["is_probe"] for r in rows) == 5
        assert summary.stats["probes"] == 5


def test_v25_dispatch_matches_the_hand_computed_one(engine_loop, engines, tiny_model_dir, tmp_path, replay_data):
    # probes 100, 40, 10, 60, 20: top 40% = p0, p3; L_cut = 60; fast cap = 90;
    # fast samples longer than 90 break: p1/2 (130) and p2/3 (91); p4/1 (90) fits exactly.
    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v2.5",
                            {"offload_fraction": 0.4})
    s = by_key(rows)
    assert summary.batches[0]["l_cut"] == 60 and summary.batches[0]["fast_cap"] == 90
    assert {p for p in LENGTHS if s[(p, 1)]["routed_to"] == "heavy"} == {"p0", "p3"}
    assert {k for k, r in s.items() if r["moves"]} == {("p1", 2), ("p2", 3)}
    assert summary.stats["breaks"] == 2 and summary.stats["offloaded_prompts"] == 2
    for k, r in s.items():
        on_fast = sum(seg["num_tokens"] for seg in r["segments"] if seg["engine"] == "fast-0")
        if r["routed_to"] == "fast":
            assert on_fast <= 90          # the fast cap is never exceeded on the fast engine
        if k in {("p1", 2), ("p2", 3)}:
            assert on_fast == 90 and r["segments"][-1]["engine"] == "heavy-0"


def test_a_moved_sample_equals_an_unmoved_greedy_run(engine_loop, engines, tiny_model_dir, tmp_path, replay_data):
    # Greedy: every sample of a prompt is the same sequence. Under v2.5 some samples break at the cap and
    # continue on the other engine from prompt + generated ids; under baseline without segments nothing
    # moves. Token for token, the results must agree.
    greedy = {"sampling.temperature": 0.0}
    _, moved = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v2.5",
                       {"offload_fraction": 0.4}, **greedy)
    _, plain = rollout(engine_loop, engines, tiny_model_dir, tmp_path / "plain", replay_data, "baseline",
                       **greedy, **{"segments.enabled": False})
    m, p = by_key(moved), by_key(plain)
    broken = [k for k, r in m.items() if r["moves"]]
    assert broken
    for k in broken:
        assert m[k]["response_token_ids"] == p[k]["response_token_ids"], k
    for k in m:
        assert m[k]["response_token_ids"] == p[k]["response_token_ids"], k


def test_resume_after_an_interrupted_run_has_every_sample_once(engine_loop, engines, tiny_model_dir, tmp_path,
                                                               replay_data):
    from pdsr_sdk.rollout import run as run_mod

    # interrupt the first run after its first batch (of 2 prompts) is on disk
    calls = {"n": 0}
    real_generate = run_mod.RolloutSession.generate

    class SimulatedCrash(Exception):
        pass

    # (not KeyboardInterrupt: raised inside a task it would stop the shared test loop itself)
    async def generate_then_crash(self, records, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise SimulatedCrash()
        return await real_generate(self, records, **kw)

    run_mod.RolloutSession.generate = generate_then_crash
    try:
        with pytest.raises(SimulatedCrash):
            rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v2.5", batch_size=2)
    finally:
        run_mod.RolloutSession.generate = real_generate
    parts = list((tmp_path / "v2.5.parquet.parts").glob("part-*.parquet"))
    assert parts and not (tmp_path / "v2.5.parquet").exists()
    first = (pq.read_table(parts).to_pylist() if len(parts) == 1
             else [r for f in parts for r in pq.read_table(f).to_pylist()])
    assert {r["prompt_id"] for r in first} == {"p0", "p1"}

    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v2.5", batch_size=2,
                            **{"output.resume": True})
    # the summary covers the whole run; batch numbering goes on after the batch on disk
    assert summary.skipped_groups == 2 and summary.groups == 5 and summary.samples == 20
    assert [(b["batch_index"], b["groups"]) for b in summary.batches] == [(0, 2), (1, 2), (2, 1)]
    assert summary.tokens == sum(r["response_length"] for r in rows)
    assert {r["prompt_id"]: r["batch_index"] for r in rows} == {"p0": 0, "p1": 0, "p2": 1, "p3": 1, "p4": 2}
    keys = [(r["prompt_id"], r["sample_index"]) for r in rows]
    assert len(keys) == len(set(keys)) == 20
    assert not (tmp_path / "v2.5.parquet.parts").exists()
