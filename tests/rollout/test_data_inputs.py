"""Prompt files as users have them (verl's parquet layout, hand-made JSONL and CSV, other encodings): what
``pdsr rollout --data`` reads from them, and the errors that name the file, the line or row, and the column."""

from __future__ import annotations

import codecs
import json

import pytest

from pdsr_sdk.errors import DataError
from pdsr_sdk.rollout.config import DataConfig
from pdsr_sdk.rollout.data import load_prompts, load_tokenizer


@pytest.fixture()
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.mark.parametrize("name, text, line", [
    ("p.jsonl", b'{"prompt": "ok"}\n{"prompt": "also ok"}\n{"prompt": "caf\xe9"}\n', 3),
    ("p.json", b'[{"prompt": "ok"},\n {"prompt": "caf\xe9"}]', 2),
    ("p.csv", b'prompt,answer\nok,1\ncaf\xe9,2\n', 3),
])
def test_a_file_that_is_not_utf8_names_the_line(tmp_path, tok, name, text, line):
    """A Latin-1 file (an exported spreadsheet, an old script's output) is refused at its first such byte's line,
    not with the codec's offset into a read buffer."""
    path = tmp_path / name
    path.write_bytes(text)
    with pytest.raises(DataError, match=rf"{name}:{line}: not UTF-8 text \(byte 0xe9\)"):
        load_prompts(DataConfig(), tok, path=path)


@pytest.mark.parametrize("name, text", [
    ("p.jsonl", '{"prompt": "What is 1+1?", "answer": "2"}\n'),
    ("p.json", '[{"prompt": "What is 1+1?", "answer": "2"}]'),
    ("p.csv", 'prompt,answer\nWhat is 1+1?,2\n'),
])
def test_a_byte_order_mark_is_read_as_without(tmp_path, tok, name, text):
    """Windows tools start UTF-8 files with a byte-order mark; the file reads as it would without one."""
    plain, marked = tmp_path / f"plain-{name}", tmp_path / name
    plain.write_text(text)
    marked.write_bytes(codecs.BOM_UTF8 + text.encode())
    want = [(r.prompt_id, r.text, r.ground_truth) for r in load_prompts(DataConfig(), tok, path=plain)]
    assert want == [("row-0", "<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n", "2")]
    assert [(r.prompt_id, r.text, r.ground_truth) for r in load_prompts(DataConfig(), tok, path=marked)] == want


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def verl_row(i, **more):
    """A row as verl's data preprocessing scripts (gsm8k.py) write it."""
    return {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"What is {i}+1?"}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"split": "test", "index": i}, **more}


@pytest.mark.parametrize("column", ["images", "videos"])
def test_verl_multimodal_rows_are_refused_naming_the_row_and_column(tmp_path, tok, column):
    """verl's multimodal data (an images or videos column beside a prompt with <image>) would roll out as text
    alone; the first row that has any is named. A column with none in any row is only another column."""
    media = [{"bytes": b"\x89PNG", "path": None}] if column == "images" else ["clip.mp4"]
    path = write_parquet(tmp_path / "mm.parquet", [verl_row(0, **{column: []}), verl_row(1, **{column: media})])
    with pytest.raises(DataError, match=rf"mm\.parquet: row 1: column '{column}' holds {column} \(verl's multimodal "
                                        r"data\); pdsr rollout generates from text alone"):
        load_prompts(DataConfig(), tok, path=path)
    empty = write_parquet(tmp_path / "none.parquet", [verl_row(0, **{column: None}), verl_row(1, **{column: []})])
    assert [r.ground_truth for r in load_prompts(DataConfig(), tok, path=empty)] == ["1", "2"]


def test_chat_messages_without_text_or_with_content_parts_name_the_row(tmp_path, tok):
    blank = [{"role": "system", "content": " "}, {"role": "user", "content": ""}]
    path = write_parquet(tmp_path / "m.parquet", [verl_row(0), {**verl_row(1), "prompt": blank}])
    with pytest.raises(DataError, match=r"m\.parquet: row 1: column 'prompt' has no text: every message's content "
                                        r"is empty"):
        load_prompts(DataConfig(), tok, path=path)
    parts = tmp_path / "parts.jsonl"   # text parts are text (as vLLM's server reads them), an image part is not
    parts.write_text(json.dumps({"prompt": [{"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                                          {"type": "text", "text": "there"}]}]}) + "\n")
    assert load_prompts(DataConfig(), tok, path=parts)[0].messages == [{"role": "user", "content": "Hi\nthere"}]
    parts.write_text(json.dumps({"prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})
                     + "\n")
    with pytest.raises(DataError, match=r"parts\.jsonl: row 0: prompt\[0\]'s content\[0\] is a 'image_url' part"):
        load_prompts(DataConfig(), tok, path=parts)


def test_when_every_prompt_is_too_long_the_run_is_refused_before_it_writes(tmp_path, tiny_model_dir):
    """--skip-long leaving no prompt ran nothing and exited 0 with an empty output; it is an error naming the
    shortest prompt, with or without --skip-long, before any engine starts or anything is written."""
    from click.testing import CliRunner

    from pdsr_cli.main import cli

    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({"model": str(tiny_model_dir), "policy": "baseline",
                               "sampling": {"n": 2, "max_tokens": 8},
                               "engines": [{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine",
                                            "max_model_len": 64}]}))
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "word " * 80}, {"prompt": "word " * 60}])
    tok = load_tokenizer(tiny_model_dir)
    shortest = len(load_prompts(DataConfig(), tok, path=data)[1].token_ids)
    out = tmp_path / "o.parquet"
    for skip in ([], ["--skip-long"]):
        r = CliRunner().invoke(cli, ["rollout", "--quiet", "--config", str(cfg), "--data", str(data), "--out", str(out),
                                     *skip], catch_exceptions=False)
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
        assert ("p.jsonl: every prompt (2) with its response exceeds the context of 64 tokens "
                "(engines[0].max_model_len), so data.skip_long (--skip-long) would leave nothing to run") in r.output
        assert f"row 1 (prompt id 'row-1'), has {shortest} prompt tokens + 8" in r.output
        assert not out.exists() and not (tmp_path / "o.summary.json").exists()


def test_a_tokenizer_without_a_chat_template_is_said_and_joins_the_messages(tmp_path, tiny_model_dir):
    """A base model's tokenizer has no chat template (verl would fail on it): the run says so in a status line,
    and each prompt is its messages' contents joined by blank lines, as docs/data-rewards.md says."""
    import shutil

    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from pdsr_cli.main import cli

    model = tmp_path / "base-model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").unlink()
    assert not getattr(load_tokenizer(model), "chat_template", None)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({"model": str(model), "policy": "baseline", "sampling": {"n": 2, "max_tokens": 8},
                               "engines": [{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine",
                                            "max_model_len": 256}]}))
    rows = [verl_row(0), {**verl_row(1), "prompt": [{"role": "system", "content": "Be brief."},
                                                    {"role": "user", "content": "What is 2+2?"}]}]
    data = write_parquet(tmp_path / "verl.parquet", rows)
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(cli, ["rollout", "--quiet", "--config", str(cfg), "--data", str(data), "--out", str(out)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "pdsr: the tokenizer has no chat template: each prompt is its messages' contents joined" in r.output
    texts = dict(zip(*pq.read_table(out, columns=["prompt_id", "prompt_text"]).to_pydict().values()))
    assert texts == {"row-0": "What is 0+1?", "row-1": "Be brief.\n\nWhat is 2+2?"}


def test_a_glob_pattern_reads_its_shards_in_name_order(tmp_path, tok):
    """verl users list their parquet shards (data.train_files); a quoted pattern reads the files it matches, in
    name order, as one table, as a folder of them is; row numbers (the default ids) run on across the shards."""
    for k in (1, 0):
        write_parquet(tmp_path / f"train-0000{k}-of-00002.parquet", [verl_row(2 * k), verl_row(2 * k + 1)])
    write_parquet(tmp_path / "test-00000-of-00001.parquet", [verl_row(9)])
    recs = load_prompts(DataConfig(), tok, path=tmp_path / "train-*.parquet")
    assert [(r.prompt_id, r.ground_truth) for r in recs] == [("row-0", "1"), ("row-1", "2"), ("row-2", "3"),
                                                             ("row-3", "4")]
    with pytest.raises(DataError, match=r"val-\*\.parquet: prompt file does not exist, nor does the pattern match"):
        load_prompts(DataConfig(), tok, path=tmp_path / "val-*.parquet")
    write_jsonl(tmp_path / "train-extra.jsonl", [{"prompt": "x"}])
    with pytest.raises(DataError, match=r"train-\*: the pattern must match prompt files of one format .*found 2 "
                                        r"parquet \(train-00000-of-00002\.parquet, \.\.\.\); 1 jsonl"):
        load_prompts(DataConfig(), tok, path=tmp_path / "train-*")
