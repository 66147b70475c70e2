"""`pdsr simulate --family NAME`: a workload member's engines and, without --trace, its draw, as the benchmarks
measure it; so that `pdsr trace synth --family kv-bound` then `pdsr simulate` needs no profile file written by
hand."""

from __future__ import annotations

import json

import numpy as np
import yaml
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.traces import read_trace, write_trace_jsonl
from pdsr_sdk.traces.family import workload

SMALL = ["--policy", "baseline", "--no-references", "--batch-size", "16", "--num-batches", "1", "--fast", "2",
         "--heavy", "1", "--no-timeline", "--quiet"]


def _engines(out_dir) -> dict:
    return json.loads((out_dir / "simulate.json").read_text())["engines"]


def test_a_member_without_a_trace_runs_its_own_draw_on_its_engines(tmp_path, monkeypatch):
    monkeypatch.setenv("PDSR_CACHE_DIR", str(tmp_path))
    member = workload("kv-bound")
    r = CliRunner().invoke(cli, ["simulate", "--family", "kv-bound", "--seed", "7", "--out-dir", str(tmp_path / "o"),
                                 *SMALL])
    assert r.exit_code == 0, r.output
    path = tmp_path / "data" / "kv-bound_1024x8_seed7.jsonl"
    assert f"{path}: 16 groups" in r.output
    assert np.array_equal(read_trace(path).lengths, member.trace(groups=1024, seed=7).lengths)
    for pool in ("fast", "heavy"):
        engines = _engines(tmp_path / "o")[pool]
        assert {k: engines[k] for k in member.measure.profile} == dict(member.measure.profile)
    # no --seed: the member's first pinned seed
    r = CliRunner().invoke(cli, ["simulate", "--family", "kv-bound", *SMALL])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "data" / f"kv-bound_1024x8_seed{member.measure.seeds[0]}.jsonl").exists()


def test_a_members_trace_needs_its_engines_and_the_error_says_how(tmp_path):
    """kv-bound's 32,768-token cap with its prompt does not fit the default profile's max_model_len of 32,768."""
    member = workload("kv-bound")
    trace = write_trace_jsonl(member.trace(groups=256, seed=101), tmp_path / "t.jsonl")
    tr = read_trace(trace)
    group_max = np.maximum.reduceat(tr.lengths, tr.offsets[:-1])
    assert int(np.max(group_max + tr.prompt_lens)) > 32768     # a context the default engines refuse
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(trace), *SMALL])
    assert r.exit_code != 0 and "--family NAME" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(trace), "--family", "kv-bound",
                                 "--out-dir", str(tmp_path / "o"), *SMALL])
    assert r.exit_code == 0, r.output
    assert _engines(tmp_path / "o")["fast"]["max_model_len"] == member.measure.profile["max_model_len"]


def test_a_profile_file_overrides_the_members_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("PDSR_CACHE_DIR", str(tmp_path))
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"fast": {"max_num_seqs": 32}, "heavy": {"max_num_seqs": 64}}))
    r = CliRunner().invoke(cli, ["simulate", "--family", "longcot", "--profile", str(prof),
                                 "--out-dir", str(tmp_path / "o"), *SMALL])
    assert r.exit_code == 0, r.output
    engines = _engines(tmp_path / "o")
    want = workload("longcot").measure.profile
    assert engines["fast"]["max_num_seqs"] == 32 and engines["heavy"]["max_num_seqs"] == 64
    assert engines["fast"]["max_model_len"] == want["max_model_len"] == engines["heavy"]["max_model_len"]


def test_bad_family_and_seed_use_are_named(tmp_path):
    run = CliRunner().invoke
    r = run(cli, ["simulate", "--family", "nope", *SMALL])
    assert r.exit_code != 0 and "unknown workload 'nope'" in r.output and "kv-bound" in r.output
    r = run(cli, ["simulate", "--seed", "3", *SMALL])
    assert r.exit_code != 0 and "--seed draws --family's trace" in r.output
    trace = write_trace_jsonl(workload("informative").trace(groups=16, seed=1), tmp_path / "t.jsonl")
    r = run(cli, ["simulate", "--family", "informative", "--seed", "3", "--trace", str(trace), *SMALL])
    assert r.exit_code != 0 and "--trace gives one" in r.output
    r = run(cli, ["simulate", "--family", "list"])
    assert r.exit_code == 0 and "longcot:" in r.output and "max_model_len 20,480" in r.output


def test_failed_samples_are_named_where_a_trace_is_read(tmp_path):
    """A trajectories file whose engine died under one prompt: simulate and trace convert took its samples' lengths
    as responses' without a word (analyze leaves their groups out)."""
    from pdsr_sdk.traces import LengthTrace

    x = np.random.default_rng(5).integers(50, 600, size=(8, 4))
    reasons = np.full(x.shape, "stop", dtype=object)
    x[3], reasons[3] = [0, 0, 17, 0], "failed"
    path = write_trace_jsonl(LengthTrace.from_matrix(x, finish_reasons=reasons), tmp_path / "t.jsonl")
    for args in (["simulate", "--trace", str(path), *SMALL[:4], "4", *SMALL[5:]],
                 ["trace", "convert", str(path), "--out", str(tmp_path / "c.jsonl")]):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 0, r.output
        assert "4 sample(s) failed (finish_reason 'failed')" in r.stderr
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(tmp_path / "c.jsonl"), *SMALL[:4], "4", *SMALL[5:]])
    assert "failed" in r.stderr     # convert keeps the finish reasons
    clean = write_trace_jsonl(LengthTrace.from_matrix(x), tmp_path / "ok.jsonl")
    r = CliRunner().invoke(cli, ["simulate", "--trace", str(clean), *SMALL[:4], "4", *SMALL[5:]])
    assert r.exit_code == 0 and "failed" not in r.stderr
