"""A flag's bad value: ``--set`` for a policy not selected, a value a config key refuses (named by flag and key,
or by the file it came from), an output named as another format, and ``pdsr serve``'s port and keys; each fails
before any work starts and writes nothing."""

from __future__ import annotations

import socket

import pytest

from cli_checks import failed, invoke
from support import ROOT


# --------------------------------------------------------------------------- --set POLICY:KEY=VALUE

TRACE = "examples/traces/synth_256x8.jsonl"


@pytest.mark.parametrize("flag", ["--set", "--policy-set"])
@pytest.mark.parametrize("item, what", [("v2:steal=false", "policy 'v2' is not selected"),
                                        ("v9:steal=false", "policy 'v9' is not a known policy")])
def test_simulate_setting_for_a_policy_not_selected(flag, item, what):

    trace = ROOT / TRACE
    out = failed(invoke("simulate", "--trace", trace, "--policy", "v3,v2.5", "--no-references", flag, item,
                        "--num-batches", 1, "--quiet"), f"{flag} {item.split('=')[0]}", what)
    assert "the selected policies are v3, v2.5" in out


def test_rollout_setting_for_a_policy_not_selected(tmp_path):
    out = tmp_path / "o.parquet"
    failed(invoke("rollout", "--policy", "v3", "--set", "v2.5:cap_multiplier=2", "--out", out),
           "--set v2.5:cap_multiplier: policy 'v2.5' is not selected; the selected policy is v3")
    assert not out.exists()


# --------------------------------------------------------------------------- a flag's bad value

@pytest.mark.parametrize("args, line", [
    (["rollout", "--n", 0], "--n: sampling.n: Input should be greater than or equal to 1 (got 0)"),
    (["rollout", "--max-tokens", -5], "--max-tokens: sampling.max_tokens: Input should be greater than or equal"),
    (["rollout", "--reward", "nope"], "--reward: reward: unknown reward 'nope'; valid names: auto, none, math_boxed, "
                                      "math_verify (or an import path"),
    (["simulate", "--n", 0], "--n: n: Input should be greater than or equal to 1 (got 0)"),
    # no option named like the key: the one given whose value is the key's
    (["simulate", "--segment-min", 0], "--segment-min: segments.min_tokens: Input should be greater than or equal"),
    (["simulate", "--n", 0, "--segment-max", 0], "--segment-max: segments.max_tokens: Input should be greater"),
    # two given with the value: neither is named
    (["simulate", "--segment-min", 0, "--segment-max", 0], "command line: segments.min_tokens: Input should be"),
    (["gae", "--chunk", 0, "--data", "in.parquet", "--out", "o.parquet"], "--chunk: chunk: Input should be"),
    (["trace", "synth", "--groups", 0, "--out", "t.jsonl"], "--groups: groups: Input should be"),
    # an infinite over-provision passed ge=0 and died at the first step in math.ceil (OverflowError)
    (["rollout", "--steps", 2, "--over-provision", "inf"], "--over-provision: over_provision: Input should be a "
                                                           "finite number (got inf)"),
    (["simulate", "--steps", 2, "--over-provision", "inf"], "--over-provision: over_provision: Input should be a "
                                                            "finite number (got inf)"),
])
def test_a_bad_flag_value_names_the_flag_and_its_key(args, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    failed(invoke(*args), line)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, out", [
    (["gae", "--data", "in.parquet"], "adv.csv"),
    (["score", "--data", "in.parquet"], "scored.jsonl"),
    (["rollout"], "traj.arrow"),
])
def test_an_output_named_as_another_format_is_refused(args, out, tmp_path, monkeypatch):
    """pdsr writes Parquet and reads a file by its suffix: an output named .csv could not be read back."""
    monkeypatch.chdir(tmp_path)
    stem = out.split(".")[0]
    failed(invoke(*args, "--out", out), f"{out}: this output is written as Parquet, not .{out.split('.')[1]}; "
                                        f"name it {stem}.parquet")
    assert not list(tmp_path.iterdir())


def test_a_bad_value_equal_to_another_flags_names_its_own_flag(tmp_path, monkeypatch):
    """--data d.jsonl --out d.jsonl: two flags of one value, so the error named neither ("command line:
    output.path: ..."); it names --out, whose value it is."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text('{"prompt": "hi"}\n')
    out = failed(invoke("rollout", "--data", "d.jsonl", "--out", "d.jsonl"),
                 "--out: output.path: d.jsonl: this output is written as Parquet, not .jsonl")
    assert "command line" not in out


def test_a_bad_value_from_the_file_names_the_file_not_a_flag(tmp_path):
    cfg = tmp_path / "synth.yaml"
    cfg.write_text("groups: 0\n")
    out = failed(invoke("trace", "synth", "--config", cfg, "--n", 4, "--out", tmp_path / "t.jsonl"),
                 f"{cfg}: groups: Input should be")
    assert "--groups" not in out


def test_serve_port_taken_or_out_of_range_fails_before_engines_start(no_engines):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        failed(invoke("serve", "--port", port), f"--port: cannot listen on 127.0.0.1:{port}", "in use")
    for port in (-1, 65536):
        failed(invoke("serve", "--port", port), f"--port: {port} is not a port; expected 0-65535")


@pytest.mark.parametrize("key", ["over_provision: 0.25", "steps: 3", "filter_groups: {kind: zero-variance}"])
def test_serve_with_a_stream_of_steps_fails_before_engines_start(tmp_path, no_engines, key):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(key + "\n")
    failed(invoke("serve", "--config", cfg, "--port", 0), "serve: a serving session runs requests as they come")
