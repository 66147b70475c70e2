"""Which model a run loads: a hub id, a folder that is no model, and a model folder without tokenizer files are each
one clear error naming the model (or folder), before any engine starts; in the CLI and in the SDK alike."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from support import requires_torch, run_on
from pdsr_cli.main import cli
from pdsr_sdk.errors import DataError
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession

HUB_ID = "Qwen/Qwen2.5-0.5B-Instruct"


def rollout(*args):
    return CliRunner().invoke(cli, ["rollout", "--n", "2", "--max-tokens", "8", "--limit", "1", "--batch-size", "1",
                                    *map(str, args)], catch_exceptions=False)


def refused(result, *needles):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "starting" not in result.output   # no engine started
    for needle in needles:
        assert needle in result.output, (needle, result.output)


def test_a_hub_id_is_named_with_what_to_do(tmp_path, monkeypatch, engine_loop):
    """With HF_HUB_OFFLINE (tests/conftest.py) the SDK used to start its engines and fail 30 s later in vLLM's
    LocalEntryNotFoundError, naming no model; the session now refuses it before building its engines."""
    monkeypatch.chdir(tmp_path)
    session = RolloutSession(RolloutConfig(model=HUB_ID))
    with pytest.raises(DataError, match=rf"model \(--model\) '{HUB_ID}' does not exist.*hub id.*download {HUB_ID}"):
        run_on(engine_loop, session.start())
    assert session.engines == []
    refused(rollout("--model", HUB_ID, "--out", tmp_path / "r.parquet"), HUB_ID, "hub id")


def test_a_folder_without_config_is_named(tmp_path, engine_loop):
    (tmp_path / "weights").mkdir()
    session = RolloutSession(RolloutConfig(model=str(tmp_path / "weights")))
    with pytest.raises(DataError, match=r"weights' is not a model directory \(no config.json"):
        run_on(engine_loop, session.start())
    refused(rollout("--model", tmp_path / "weights", "--out", tmp_path / "r.parquet"), "weights", "config.json")


@requires_torch
def test_a_model_folder_without_tokenizer_files_is_named(tmp_path, tiny_model_dir, engine_loop):
    """transformers builds an empty tokenizer from config.json alone, so every prompt tokenized to nothing and the
    run failed on row 0's prompt ('tokenizes to nothing'); the folder is now named as missing its tokenizer, and a
    tokenizer folder given beside it is used."""
    from transformers import AutoTokenizer

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / name, bare / name)
    assert AutoTokenizer.from_pretrained(str(bare)).encode("a b", add_special_tokens=False) == []   # the premise
    session = RolloutSession(RolloutConfig(model=str(bare)))
    with pytest.raises(DataError, match=r"bare: no tokenizer files in it .*set tokenizer"):
        session.tokenizer
    with pytest.raises(DataError, match="no tokenizer files"):
        run_on(engine_loop, session.start())   # before its engines are built
    assert session.engines == []
    refused(rollout("--model", bare, "--out", tmp_path / "r.parquet"), str(bare), "no tokenizer files")
    with_tokenizer = RolloutSession(RolloutConfig(model=str(bare), tokenizer=str(tiny_model_dir)))
    expected = AutoTokenizer.from_pretrained(str(tiny_model_dir)).encode("a b", add_special_tokens=False)
    assert with_tokenizer.tokenizer.encode("a b", add_special_tokens=False) == expected
