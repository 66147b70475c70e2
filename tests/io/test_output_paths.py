"""One rule for outputs, stated in `pdsr --help`: an output's missing folders are made; an output file where a
folder is, or a folder where a file is, is a clean error naming the flag; an existing --out or --json file is
replaced only with --overwrite."""

from __future__ import annotations

import pytest

from cli_checks import failed, invoke


@pytest.fixture()
def trace(tmp_path):
    path = tmp_path / "t.jsonl"
    assert invoke("trace", "synth", "--groups", 4, "--n", 2, "--out", path).exit_code == 0
    return path


@pytest.mark.parametrize("command, flag", [
    (("trace", "synth", "--groups", 4, "--n", 2), "--out"),
    (("trace", "convert", "{trace}"), "--out"),
    (("analyze", "{trace}"), "--json"),
])
def test_an_output_file_follows_the_rule(tmp_path, trace, command, flag):
    args = [str(a).format(trace=trace) for a in command]
    new = tmp_path / "made" / "here" / "o.jsonl"
    assert invoke(*args, flag, new).exit_code == 0 and new.is_file()   # its folders made
    failed(invoke(*args, flag, new), f"{flag} {new}: already exists; pass --overwrite")
    assert invoke(*args, flag, new, "--overwrite").exit_code == 0
    assert invoke(*args, flag, tmp_path / "made").exit_code == 2   # a folder: click names the flag
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    failed(invoke(*args, flag, blocker / "o.jsonl"), f"{flag} {blocker / 'o.jsonl'}: cannot create its folder: "
                                                     f"{blocker} is a file, not a folder")


def test_an_output_folder_behind_a_file_is_a_clean_error(tmp_path, trace):
    """pdsr simulate --out-dir and pdsr schema --out ended in a NotADirectoryError traceback (simulate's after the
    whole run), pdsr model tiny --out in a FileExistsError one."""
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    out = blocker / "sub"
    failed(invoke("simulate", "--trace", trace, "--policy", "baseline", "--fast", 1, "--heavy", 1, "--quiet",
                  "--out-dir", out), f"out_dir (--out-dir) {out / 'simulate.json'}: cannot create its folder: "
                                     f"{blocker} is a file")
    failed(invoke("schema", "--out", out), f"--out {out / 'rollout.schema.json'}: cannot create its folder")
    failed(invoke("model", "tiny", "--out", out), f"--out {out / 'config.json'}: cannot create its folder")
    assert blocker.read_text() == "x"


def test_the_rule_is_in_the_help():
    result = invoke("--help")
    text = " ".join(result.output.split())
    assert "a leading ~ is the home folder. An output's missing folders are made; an output file where a folder " \
           "is, or a folder where a file is, is an error; an existing --out or --json file is replaced only with " \
           "--overwrite" in text
