"""pdsr_sdk.scoring on the tiny model: empty completions, bad rows and options (each error names its row or key),
and the table API (``score_table``) and the padded trainer layout."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

torch = pytest.importorskip("torch")

from tiny_scoring import max_diff, naive_logps  # noqa: E402

from pdsr_sdk.config import load_config  # noqa: E402
from pdsr_sdk.errors import ConfigError, DataError  # noqa: E402
from pdsr_sdk.scoring import ScoreConfig, per_token_logps  # noqa: E402


# ----------------------------------------------------------------- errors

@pytest.mark.parametrize("options", [{}, {"mbs": 2}, {"max_tokens_per_micro_batch": 64},
                                     {"pack": True, "max_tokens_per_micro_batch": 8}])
def test_empty_completions_get_empty_arrays(model, options):
    # a failed sample of pdsr rollout has no response tokens; micro-batches of only such samples included
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [11]]
    completions = [[20, 21], [], [22, 23, 24], [], []]
    res = per_token_logps(model, prompts, completions, entropy=True, **options)
    assert [len(x) for x in res.logps] == [2, 0, 3, 0, 0] == [len(x) for x in res.entropy]
    assert all(x.dtype == np.float32 for x in res.logps)
    want, want_entropy = naive_logps(model, [prompts[0], prompts[2]], [completions[0], completions[2]], entropy=True)
    assert max_diff([res.logps[0], res.logps[2]], want) < 1e-5
    assert max_diff([res.entropy[0], res.entropy[2]], want_entropy) < 1e-5
    assert res.stats.scored_tokens == 5


def test_error_empty_prompt_names_row(model):
    with pytest.raises(DataError, match=r"row 0: empty prompt"):
        per_token_logps(model, [[], [3]], [[4], [5]])


@pytest.mark.parametrize("bad", [1024, 5000, -1])
def test_error_token_outside_vocabulary(model, bad):
    with pytest.raises(DataError, match=rf"row 2: token id {bad} in completion_ids .*vocab size 1024"):
        per_token_logps(model, [[1], [2], [3]], [[4], [5], [6, bad]])


def test_error_row_count_mismatch(model):
    with pytest.raises(DataError, match="prompt_ids has 2 rows but completion_ids has 1"):
        per_token_logps(model, [[1], [2]], [[3]])


def test_error_non_integer_ids(model):
    with pytest.raises(DataError, match=r"completion_ids\[0\]: expected integer token ids"):
        per_token_logps(model, [[1]], [[0.5]])


def test_error_both_micro_batch_modes(model):
    with pytest.raises(ConfigError, match="exclusive"):
        per_token_logps(model, [[1]], [[2]], mbs=2, max_tokens_per_micro_batch=100)
    with pytest.raises(ConfigError, match="mbs .* and max_tokens_per_micro_batch .* are exclusive"):
        load_config(ScoreConfig, None, {"data": "a.parquet", "out": "b.parquet", "mbs": 2,
                                        "max_tokens_per_micro_batch": 100})


def test_error_bad_options(model):
    with pytest.raises(ConfigError, match="temperature"):
        per_token_logps(model, [[1]], [[2]], temperature=0.0)
    with pytest.raises(ConfigError, match="backend"):
        per_token_logps(model, [[1]], [[2]], backend="jax")
    with pytest.raises(ConfigError, match="mbs"):
        per_token_logps(model, [[1]], [[2]], mbs=0)
    with pytest.raises(ConfigError, match=r"pad_id: 1024 is not a token id of the model \(vocab size 1024\)"):
        per_token_logps(model, [[1]], [[2]], pad_id=1024)


def test_error_model_dir_without_config(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(DataError, match=rf"{tmp_path}: not a Hugging Face model directory \(no config.json"):
        per_token_logps(tmp_path, [[1]], [[2]])
    with pytest.raises(DataError, match="does not exist"):
        per_token_logps(tmp_path / "missing", [[1]], [[2]])


def test_error_sample_longer_than_quota(model):
    with pytest.raises(DataError, match="sample 1: .*max_tokens_per_micro_batch=64"):
        per_token_logps(model, [[1], [2] * 50], [[3], [4] * 30], max_tokens_per_micro_batch=64)


def test_empty_input(model):
    res = per_token_logps(model, [], [])
    assert res.logps == [] and res.stats.micro_batches == 0


# ------------------------------------------------------------------ table

def test_score_table_adds_described_column(model, samples, unbatched):
    from pdsr_sdk.scoring import score_output_schema, score_table

    table = pa.table({"prompt_token_ids": samples[0], "response_token_ids": samples[1],
                      "ref_logps": [[0.0]] * len(samples[0]), "keep": list(range(len(samples[0])))})
    config = ScoreConfig(data="in.parquet", out="out.parquet", mbs=8, entropy=True)
    out, stats = score_table(table, config, model)
    assert out.column_names == ["prompt_token_ids", "response_token_ids", "ref_logps", "keep", "ref_logps_entropy"]
    assert out.schema.field("ref_logps").type == pa.list_(pa.float32())
    got = [np.asarray(x, np.float32) for x in out.column("ref_logps").to_pylist()]
    assert max_diff(got, unbatched.logps) <= 1e-6
    expected = score_output_schema("ref_logps", entropy=True)
    for name in ("ref_logps", "ref_logps_entropy"):
        assert out.schema.field(name).metadata[b"description"] == expected.field(name).metadata[b"description"]
    assert stats.micro_batches == math.ceil(len(samples[0]) / 8)


def test_score_table_rejects_non_list_column(model):
    from pdsr_sdk.scoring import score_table

    table = pa.table({"prompt_token_ids": [[1]], "response_token_ids": ["abc"]})
    config = ScoreConfig(data="in.parquet", out="out.parquet")
    with pytest.raises(DataError, match="column 'response_token_ids' must be a list of integer token ids"):
        score_table(table, config, model, source="in.parquet")


def test_score_result_padded_is_trainer_batch_layout():
    """Ragged log-probs -> [B, width] float32, each row from column 0 and -1 after it, as trainer_batch's
    rollout_log_probs; a row over the width is named."""
    from pdsr_sdk.errors import DataValueError
    from pdsr_sdk.scoring import ScoreResult

    rows = [np.array([-0.5, -1.5], np.float32), np.array([-2.0], np.float32), np.array([-0.1, -0.2, -0.3])]
    result = ScoreResult(logps=rows, entropy=[np.ones(len(r), np.float32) for r in rows], stats=None)
    got = result.padded()
    assert got.dtype == np.float32 and got.shape == (3, 3)
    np.testing.assert_allclose(got, [[-0.5, -1.5, -1.0], [-2.0, -1.0, -1.0], [-0.1, -0.2, -0.3]], rtol=1e-6)
    assert result.padded(5, fill=0.0)[1].tolist() == [-2.0, 0.0, 0.0, 0.0, 0.0]
    assert result.padded(4, entropy=True).tolist() == [[1, 1, -1, -1], [1, -1, -1, -1], [1, 1, 1, -1]]
    with pytest.raises(DataValueError, match="sample 2 has 3 tokens, over width=2"):
        result.padded(2)
    with pytest.raises(DataValueError, match="no entropy was computed"):
        ScoreResult(logps=rows, entropy=None, stats=None).padded(entropy=True)
    assert ScoreResult(logps=[], entropy=None, stats=None).padded().shape == (0, 0)
