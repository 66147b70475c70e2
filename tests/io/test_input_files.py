"""Every input flag given a bad file (not UTF-8, empty, a file where a folder is wanted, the wrong format): one clean
error naming the flag or what the file is for, and the path, never a traceback."""

from __future__ import annotations

import codecs

import pytest

from cli_checks import failed, invoke

LATIN1 = b"policy: baseline\nsystem_prompt: caf\xe9\n"


@pytest.mark.parametrize("flag, what", [("--config", "config file"), ("--profile", "profile file")])
def test_a_config_or_profile_file_not_utf8_names_its_line(tmp_path, flag, what):
    """A Latin-1 YAML (or a binary given by mistake) was a UnicodeDecodeError traceback, exit 1."""
    path = tmp_path / "run.yaml"
    path.write_bytes(LATIN1)
    failed(invoke("simulate", flag, path), f"{path}:2: not UTF-8 text (byte 0xe9)", f"({what})")


def test_a_json_config_with_a_byte_order_mark_reads_as_without(tmp_path):
    """A YAML file read past its byte-order mark; a JSON one was 'not valid JSON: Unexpected UTF-8 BOM'."""
    from pdsr_sdk.config import read_config_file

    for name in ("run.json", "run.yaml"):
        path = tmp_path / name
        path.write_bytes(codecs.BOM_UTF8 + b'{"policy": "baseline", "batch_size": 8}')
        assert read_config_file(path) == {"policy": "baseline", "batch_size": 8}


def test_a_file_or_an_empty_folder_given_as_a_model_or_tokenizer(tmp_path, tiny_model_dir):
    """A file given as --tokenizer or pdsr score's --model was 'directory does not exist' (it exists); an empty
    folder as --tokenizer was transformers' paragraph about sentencepiece and slow tokenizers."""
    log = tmp_path / "l.csv"
    log.write_text("uid,len\na,3\n")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 16)
    empty = tmp_path / "empty"
    empty.mkdir()
    convert = ("trace", "convert", log, "--id-column", "uid", "--length-column", "len", "--out", tmp_path / "t.jsonl")
    failed(invoke(*convert, "--tokenizer", weights), f"--tokenizer {weights}: is a file; expected a model or "
                                                     f"tokenizer folder")
    out = failed(invoke(*convert, "--tokenizer", empty), f"--tokenizer {empty}: not a model or tokenizer folder "
                                                         f"(no config.json")
    assert "sentencepiece" not in out
    failed(invoke("score", "--model", weights, "--data", log, "--out", tmp_path / "s.parquet",
                  "--max-tokens-per-mb", 64), f"{weights}: is a file; expected a Hugging Face model directory")
    failed(invoke("rollout", "--quiet", "--model", weights, "--out", tmp_path / "o.parquet"),
           f"model (--model) '{weights}' is a file, not a model directory")


def test_an_empty_trajectories_file_is_not_called_a_length_trace(tmp_path):
    """pdsr simulate calibrate said an empty run.parquet 'is a length trace (JSONL)'."""
    empty = tmp_path / "run.parquet"
    empty.write_bytes(b"")
    out = failed(invoke("simulate", "calibrate", "--trajectories", empty, "--out", tmp_path / "p.yaml"),
                 f"{empty}: the trajectories file is empty")
    assert "length trace" not in out
