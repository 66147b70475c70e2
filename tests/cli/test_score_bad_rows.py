"""``pdsr score`` on bad rows: each is one clean error naming the file, the column and the file's row (not the row
within a block), found by the first pass over the token columns, before the model loads; and the progress bar
counts the file's tokens."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from pdsr_cli.main import cli  # noqa: E402


def rows(n=12):
    rng = np.random.default_rng(3)
    return ([rng.integers(0, 1024, 4).tolist() for _ in range(n)],
            [rng.integers(0, 1024, 6).tolist() for _ in range(n)])


@pytest.mark.parametrize("case,says", [
    ("null_row", "column 'response_token_ids' row 7 is null; expected a list of token ids"),
    ("null_id", "column 'response_token_ids' row 6 has a null token id"),
    ("outside_vocab", "row 8: token id 4096 in response_token_ids (position 2) is outside the model's vocabulary"),
    ("empty_prompt", "row 9: empty prompt"),
    ("over_context", "row 11: prompt + completion = 8193 tokens, over the model's context of 8192 tokens "
                     "(max_position_embeddings in "),
    ("text", "column 'response_token_ids' must be a list of integer token ids, got string"),
    ("float_ids", "column 'prompt_token_ids' must be a list of integer token ids, got list<"),
    # list<null>: the type Arrow gives a column with no id in it (was "must be a list of integer token ids")
    ("no_ids_null_rows", "column 'response_token_ids' row 0 is null; expected a list of token ids"),
    ("no_ids_null_id", "column 'response_token_ids' row 6 has a null token id"),
    ("no_ids_prompts", "row 0: empty prompt"),
])
def test_a_bad_row_is_named_by_its_row_of_the_file(tmp_path, tiny_model_dir, monkeypatch, case, says):
    from pdsr_sdk.io import blocks
    from pdsr_sdk.scoring import file_run

    monkeypatch.setattr(blocks, "BATCH_ROWS", 5)   # the row is in the second or third batch read
    monkeypatch.setattr(file_run, "_load", lambda *a, **k: pytest.fail("loaded the model for a bad file"))
    prompts, responses = rows()
    prompt_type, response_type = pa.list_(pa.int64()), None
    if case == "null_row":
        responses[7] = None
    if case == "null_id":
        responses[6] = [1, None, 3]
    if case == "outside_vocab":
        responses[8] = [1, 2, 4096]
    if case == "empty_prompt":
        prompts[9] = []
    if case == "over_context":
        prompts[11] = [5] * 8000
        responses[11] = [6] * 193
    if case == "text":
        responses = [" ".join(map(str, r)) for r in responses]
    if case == "float_ids":
        prompts = [[float(t) for t in p] for p in prompts]
        prompt_type = pa.list_(pa.float64())
    if case.startswith("no_ids"):
        response_type = pa.list_(pa.null())
        responses = [None] * 12 if case == "no_ids_null_rows" else [[]] * 6 + [[None]] + [[]] * 5
    if case == "no_ids_prompts":
        prompts, prompt_type, responses = [[]] * 12, pa.large_list(pa.null()), [[]] * 12
    data = tmp_path / "traj.parquet"
    pq.write_table(pa.table({"prompt_token_ids": pa.array(prompts, prompt_type),
                             "response_token_ids": pa.array(responses, response_type)}), data)
    if response_type is not None:   # as Arrow types a column with no id in it
        assert pq.read_schema(data).field("response_token_ids").type == response_type
    res = CliRunner().invoke(cli, ["score", "--model", str(tiny_model_dir), "--data", str(data),
                                   "--out", str(tmp_path / "o.parquet"), "--quiet"])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"error: {data}: ") and says in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "o.parquet").exists()


def test_a_column_of_no_ids_is_empty_completions(tmp_path, tiny_model_dir):
    # list<null> (every completion empty, as failed samples are): scored as the same file typed list<int64> is
    from pdsr_sdk.scoring.config import ScoreConfig
    from pdsr_sdk.scoring.table import score_table

    prompts, _ = rows(4)
    outs = {}
    for kind in (pa.null(), pa.int64()):
        data, out = tmp_path / f"{kind}.parquet", tmp_path / f"{kind}.out.parquet"
        pq.write_table(pa.table({"prompt_token_ids": prompts,
                                 "response_token_ids": pa.array([[]] * 4, pa.list_(kind))}), data)
        res = CliRunner().invoke(cli, ["score", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(out),
                                       "--quiet"])
        assert res.exit_code == 0, res.output
        outs[kind] = pq.read_table(out)
    assert outs[pa.null()].column("ref_logps").to_pylist() == outs[pa.int64()].column("ref_logps").to_pylist() == \
        [[]] * 4
    table = pa.table({"prompt_token_ids": prompts, "response_token_ids": pa.array([[]] * 4, pa.list_(pa.null()))})
    scored, _ = score_table(table, ScoreConfig(data="d.parquet", out="o.parquet", device="cpu"), tiny_model_dir)
    assert scored.column("ref_logps").to_pylist() == [[]] * 4


def test_the_bar_counts_the_files_tokens(tmp_path, tiny_model_dir):
    from pdsr_sdk.scoring.config import ScoreConfig
    from pdsr_sdk.scoring.file_run import score_file

    prompts, responses = rows(20)
    data = tmp_path / "traj.parquet"
    pq.write_table(pa.table({"prompt_token_ids": prompts, "response_token_ids": responses}), data)
    bars = []

    class Bar:
        def __init__(self, desc="", total=None, unit="it"):
            self.desc, self.total, self.unit, self.updates, self.closed = desc, total, unit, [], False
            bars.append(self)

        def update(self, n=1):
            self.updates.append(n)

        def set_postfix_str(self, s="", refresh=True):
            pass

        def close(self):
            self.closed = True

    score_file(ScoreConfig(model=tiny_model_dir, data=data, out=tmp_path / "o.parquet", device="cpu", mbs=3,
                           block_tokens=50), progress=Bar)
    assert len(bars) == 1 and bars[0].unit == "token" and bars[0].closed
    assert bars[0].total == sum(bars[0].updates) == 20 * 10
    assert bars[0].updates == [30] * 6 + [20]   # one update per micro-batch of 3 rows of 10 tokens


@pytest.mark.parametrize("config,backend,vllm_len,limit", [
    ({"max_position_embeddings": 4096}, "torch", None, 4096),
    ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                        "original_max_position_embeddings": 2048}}, "torch", None,
     8192),
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2}}, "torch", None, 8192),
    ({"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "torch", None, 8192),
    ({"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "torch", None,
     4096),
    ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "torch", None, 4096),
    ({"text_config": {"max_position_embeddings": 1024}}, "torch", None, 1024),
    ({"max_position_embeddings": 4096}, "vllm", 2049, 2048),
    ({}, "torch", None, None),
])
def test_context_limit_is_the_models_as_vllm_reads_it(tmp_path, config, backend, vllm_len, limit):
    import json

    from pdsr_sdk.scoring.config import ScoreConfig
    from pdsr_sdk.scoring.file_run import context_limit

    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = ScoreConfig(data="d.parquet", out="o.parquet", backend=backend, vllm_max_model_len=vllm_len)
    assert context_limit(tmp_path, cfg)[0] == limit
