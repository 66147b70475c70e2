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
