"""Bad input to ``pdsr rollout``: an output it cannot write, data columns of the wrong type or layout, and what
exceeds the model's context; each gives a clear error naming the flag, file, row or key before engines start."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_checks import failed, invoke, write_jsonl


# --------------------------------------------------------------------------- pdsr rollout

def test_unwritable_out_fails_before_engines_start(prompts, tmp_path, no_engines):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file")
    failed(invoke("rollout", "--data", prompts, "--out", blocker / "o.parquet"),
           "output.path (--out)", "blocker", "is a file, not a folder")
    failed(invoke("rollout", "--data", prompts, "--out", tmp_path / "o.parquet", "--summary", blocker / "s.json"),
           "output.summary_path (--summary)", "is a file, not a folder")
    as_parquet = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist([json.loads(line) for line in prompts.read_text().splitlines()]), as_parquet)
    failed(invoke("rollout", "--data", as_parquet, "--out", as_parquet), "--out and --data are the same file")
    assert blocker.read_text() == "a file" and not (tmp_path / "o.parquet").exists()


def test_an_output_that_is_the_data_is_refused_before_it_is_replaced(prompts, tmp_path, no_engines):
    """The summary, or the filtered groups' file, at the data's path: before, the run wrote it over the data."""
    data = prompts.read_text()
    failed(invoke("rollout", "--data", prompts, "--out", tmp_path / "o.parquet", "--summary", prompts),
           f"--summary and --data are the same file {prompts}")
    as_parquet = tmp_path / "o.filtered.parquet"
    pq.write_table(pa.Table.from_pylist([json.loads(line) for line in data.splitlines()]), as_parquet)
    failed(invoke("rollout", "--data", as_parquet, "--out", tmp_path / "o.parquet", "--filter-groups",
                  "zero-variance", "--write-filtered"), "--write-filtered's output and --data are the same file")
    assert prompts.read_text() == data and pq.read_table(as_parquet).num_rows == len(data.splitlines())
    assert not (tmp_path / "o.parquet").exists()


def test_every_policys_output_is_checked_before_the_first_run(prompts, tmp_path, no_engines):
    (tmp_path / "o.v2.5.parquet").mkdir()
    failed(invoke("rollout", "--data", prompts, "--policy", "v3,v2.5", "--out", tmp_path / "o.parquet"),
           "o.v2.5.parquet: is a folder")


# --------------------------------------------------------------------------- columns

def load(tmp_path, tiny_model_dir, rows, **cfg):
    from pdsr_sdk.rollout.config import DataConfig
    from pdsr_sdk.rollout.data import load_prompts, load_tokenizer

    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return load_prompts(DataConfig(**cfg), load_tokenizer(tiny_model_dir), path=path)


VERL = [{"data_source": "math", "prompt": [{"role": "user", "content": f"What is {i}+1?"}],
         "reward_model": {"ground_truth": str(i + 1), "style": "rule"}, "extra_info": {"index": 10 + i}}
        for i in range(2)]


def test_verl_layout_is_found_without_flags(tmp_path, tiny_model_dir):
    recs = load(tmp_path, tiny_model_dir, VERL)
    assert [r.ground_truth for r in recs] == ["1", "2"] and "What is 1+1?" in recs[1].text
    recs = load(tmp_path, tiny_model_dir, VERL, id_column="extra_info.index")
    assert [r.prompt_id for r in recs] == ["10", "11"]


@pytest.mark.parametrize("prompt", ["input", "context_messages"])
def test_openrlhf_columns_are_found_without_flags(tmp_path, tiny_model_dir, prompt):
    rows = [{prompt: "What is 2+2?" if prompt == "input" else [{"role": "user", "content": "What is 2+2?"}],
             "label": "4"}]
    recs = load(tmp_path, tiny_model_dir, rows)
    assert recs[0].ground_truth == "4" and "What is 2+2?" in recs[0].text


def test_a_struct_ground_truth_column_asks_for_a_dotted_path(tmp_path, tiny_model_dir):
    from pdsr_sdk.errors import DataError

    with pytest.raises(DataError, match=r"column 'reward_model' \(data.ground_truth_column, --ground-truth-column\) "
                                        r"is struct.*e.g. --ground-truth-column reward_model.ground_truth"):
        load(tmp_path, tiny_model_dir, VERL, ground_truth_column="reward_model")
    with pytest.raises(DataError, match=r"column 'reward_model' has no field 'answer' \(fields: ground_truth, style\)"):
        load(tmp_path, tiny_model_dir, VERL, ground_truth_column="reward_model.answer")


def test_non_finite_ground_truth_names_the_row(tmp_path, tiny_model_dir):
    from pdsr_sdk.errors import DataError

    with pytest.raises(DataError, match=r"data.parquet: row 1: column 'answer' is nan; expected a finite number"):
        load(tmp_path, tiny_model_dir, [{"prompt": "a", "answer": 1.5}, {"prompt": "b", "answer": float("nan")}])


def test_a_list_id_column_is_the_wrong_type(tmp_path, tiny_model_dir):
    from pdsr_sdk.errors import DataError

    with pytest.raises(DataError, match=r"column 'id' \(data.id_column, --id-column\) is list<.*int64>; "
                                        r"expected a string or integer id"):
        load(tmp_path, tiny_model_dir, [{"prompt": "a", "id": [1]}])


# --------------------------------------------------------------------------- the model's context

def test_max_tokens_beyond_the_context_names_the_flag(prompts, tmp_path, tiny_model_dir, no_engines):
    failed(invoke("rollout", "--data", prompts, "--model", tiny_model_dir, "--max-tokens", 9000,
                  "--out", tmp_path / "o.parquet"),
           "sampling.max_tokens (--max-tokens) is 9000 but the context is 8192 tokens",
           "max_position_embeddings in", "config.json")


def test_a_long_prompt_names_its_row_or_is_skipped_and_counted(tmp_path, fake_run):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "What is 1+1?"}, {"prompt": "word " * 400},
                                              {"prompt": "What is 2+2?"}])
    out = tmp_path / "o.parquet"
    failed(invoke(*fake_run, "--data", data, "--out", out), "p.jsonl: row 1 (prompt id 'row-1')",
           "exceed the context of 256 tokens (engines[0].max_model_len)", "1 row(s) in all", "--skip-long")
    assert not out.exists()
    r = invoke(*fake_run, "--data", data, "--out", out, "--skip-long")
    assert r.exit_code == 0, r.output
    assert "2 groups" in r.output and "1 prompts longer than the context skipped" in r.output
    assert json.loads((tmp_path / "o.summary.json").read_text())["skipped_long"] == 1
    assert set(pq.read_table(out).column("prompt_id").to_pylist()) == {"row-0", "row-2"}
