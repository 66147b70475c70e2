"""Your own log's text columns counted with `pdsr trace convert --tokenizer DIR` (each length the tokenizer's own
count of the text; without a tokenizer, an error naming the row and the flag), and a folder or pattern of a log's
shards read as one log."""

from __future__ import annotations

import json

import pytest

from cli_checks import failed, invoke

PROMPTS = ["user\nWhat is 7 + 5?\nassistant\n", "user\nSolve $x^2 = 49$ for the positive root.\nassistant\n"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _read(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_text_columns_of_any_log_are_counted_with_the_tokenizer(tokenizer, tiny_model_dir, tmp_path):
    import csv

    rows = [(prompt, answer) for prompt in PROMPTS for answer in ("12", "The answer is 12.", "x = 7, so 7.")]
    src = tmp_path / "chats.csv"
    with src.open("w", newline="") as fh:
        csv.writer(fh).writerows([("question", "answer"), *rows])
    out = tmp_path / "trace.jsonl"
    result = invoke("trace", "convert", src, "--id-column", "question", "--length-column", "answer",
                    "--prompt-length-column", "question", "--tokenizer", tiny_model_dir, "--out", out)
    assert result.exit_code == 0, result.output
    count = lambda text: len(tokenizer.encode(text, add_special_tokens=False))   # noqa: E731
    assert [(g["prompt_len"], g["lengths"]) for g in _read(out)] == [
        (count(p), [count(a) for q, a in rows if q == p]) for p in PROMPTS]

    result = invoke("trace", "convert", src, "--id-column", "question", "--length-column", "answer", "--out",
                    tmp_path / "no.jsonl")
    failed(result, str(src), "'answer' row 1", "--tokenizer DIR", "--length-column")
    assert not (tmp_path / "no.jsonl").exists()


def test_a_folder_or_pattern_of_log_shards_is_one_log(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "shards"
    folder.mkdir()
    pq.write_table(pa.table({"uid": ["a", "b", "a"], "response_length": [3, 9, 4]}), folder / "part-0.parquet")
    pq.write_table(pa.table({"uid": ["b", "a", "b"], "response_length": [8, 5, 7]}), folder / "part-1.parquet")
    for source in (folder, f"{folder}/part-*.parquet"):
        out = tmp_path / "trace.jsonl"
        result = invoke("trace", "convert", source, "--out", out, "--overwrite")
        assert result.exit_code == 0, result.output
        assert [(g["prompt_id"], g["lengths"]) for g in _read(out)] == [("a", [3, 4, 5]), ("b", [9, 8, 7])]
