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
