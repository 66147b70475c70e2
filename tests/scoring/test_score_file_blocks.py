"""``score_file`` reads, scores and writes blocks of rows: the blocks cover every row once within their token
budget, a Parquet input is never read whole, and the file's log-probs match an independent per-sample forward
(tests/tiny_scoring.py) whatever the blocks."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tiny_scoring import max_diff, naive_logps, random_samples

from pdsr_sdk.scoring.config import ScoreConfig
from pdsr_sdk.scoring.file_run import plan_blocks, score_file


@pytest.mark.parametrize("seed,budget,mbs", [(0, 100, None), (1, 1, None), (2, 500, 4), (3, 10**9, None), (4, 50, 3)])
def test_blocks_cover_the_rows_in_order_within_the_budget(seed, budget, mbs):
    lengths = np.random.default_rng(seed).integers(1, 120, 57)
    blocks = plan_blocks(lengths, budget, mbs)
    assert blocks[0][0] == 0 and blocks[-1][1] == 57
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    step = mbs or 1
    for first, end in blocks[:-1]:
        tokens = int(lengths[first:end].sum())
        assert tokens >= budget and (end - first) % step == 0
        # closed as soon as it reached the budget: without its last micro-batch (or row) it is below
        assert int(lengths[first:end - step].sum()) < budget
    assert int(lengths[blocks[-1][0]:blocks[-1][1] - step].sum()) < budget if len(blocks) > 1 else True
    assert plan_blocks(np.zeros(0, np.int64), budget, mbs) == []


@pytest.fixture()
def trajectories(tmp_path):
    prompts, responses = random_samples(11, 30, max_prompt=25, max_completion=60)
    responses[3] = []
    path = tmp_path / "traj.parquet"
    pq.write_table(pa.table({"prompt_token_ids": prompts, "response_token_ids": responses,
                             "reward": np.arange(30, dtype=np.float64)}), path, row_group_size=7)
    return path, prompts, responses


@pytest.mark.parametrize("flags", [dict(max_tokens_per_micro_batch=256), dict(mbs=4), dict(pack=True, mbs=3)])
def test_file_in_blocks_matches_a_forward_per_sample(tmp_path, tiny_model_dir, model, trajectories, monkeypatch,
                                                     flags):
    from pdsr_sdk.io import blocks

    path, prompts, responses = trajectories
    monkeypatch.setattr(blocks, "BATCH_ROWS", 5)
    monkeypatch.setattr(blocks, "read_table", lambda *a, **k: pytest.fail("the Parquet input was read whole"))
    sizes = []
    from pdsr_sdk.scoring import file_run

    score = file_run.score_checked
    monkeypatch.setattr(file_run, "score_checked",
                        lambda b, m, p, *a, **k: sizes.append(len(p)) or score(b, m, p, *a, **k))
    cfg = ScoreConfig(model=tiny_model_dir, data=path, out=tmp_path / "o.parquet", device="cpu", dtype="float32",
                      block_tokens=300, entropy=True, **flags)
    out, stats = score_file(cfg)
    table = pq.read_table(out)
    assert table.column("reward").to_pylist() == list(range(30))
    lengths = np.array([len(p) + len(r) for p, r in zip(prompts, responses)])
    assert sizes == [end - first for first, end in plan_blocks(lengths, 300, cfg.mbs)] and len(sizes) >= 3
    assert stats.samples == 30 and stats.real_tokens == int(lengths.sum())
    want, want_entropy = naive_logps(model, prompts, responses, entropy=True)
    got, got_entropy = table.column("ref_logps").to_pylist(), table.column("ref_logps_entropy").to_pylist()
    assert got[3] == got_entropy[3] == []   # the empty response
    rest = [i for i in range(30) if i != 3]
    assert max_diff([got[i] for i in rest], [want[i] for i in rest]) < 2e-5
    assert max_diff([got_entropy[i] for i in rest], [want_entropy[i] for i in rest]) < 2e-5
    meta = json.loads(pq.read_schema(out).metadata[b"pdsr_score"])
    assert meta["rows"] == 30 and meta["settings"]["block_tokens"] == 300
    assert not (tmp_path / "o.parquet.parts").exists()


def test_a_jsonl_input_and_an_empty_one(tmp_path, tiny_model_dir, model):
    prompts, responses = random_samples(12, 6, max_prompt=10, max_completion=20)
    path = tmp_path / "traj.jsonl"
    path.write_text("".join(json.dumps({"prompt_token_ids": p, "response_token_ids": r}) + "\n"
                            for p, r in zip(prompts, responses)))
    out, _ = score_file(ScoreConfig(model=tiny_model_dir, data=path, out=tmp_path / "o.parquet", device="cpu",
                                    dtype="float32", block_tokens=40))
    assert max_diff(pq.read_table(out).column("ref_logps").to_pylist(), naive_logps(model, prompts, responses)) < 2e-5

    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt_token_ids": pa.array([], pa.list_(pa.int64())),
                             "response_token_ids": pa.array([], pa.list_(pa.int64()))}), empty)
    out, stats = score_file(ScoreConfig(model=tiny_model_dir, data=empty, out=tmp_path / "e.parquet", device="cpu"))
    assert pq.read_table(out).num_rows == 0 and stats.samples == 0
    assert pq.read_schema(out).field("ref_logps").type == pa.list_(pa.float32())
