"""A leading ``~`` is the home folder in every path pdsr takes: a flag the shell left unexpanded (``--out=~/x``, a
quoted ``'~/x'``) and a config file's value. It was taken literally: inputs were 'does not exist', and an output
made a folder named ``~`` in the working one."""

from __future__ import annotations

import json

import pytest

from cli_checks import invoke


@pytest.fixture()
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    yield home
    assert not (work / "~").exists(), "a folder named ~ was made in the working folder"


def test_flags_expand_a_leading_tilde(home):
    result = invoke("trace", "synth", "--groups", 8, "--n", 2, "--seed", 0, "--out=~/traces/t.jsonl")
    assert result.exit_code == 0, result.output
    lines = (home / "traces" / "t.jsonl").read_text().splitlines()
    assert len(lines) == 8
    result = invoke("analyze", "~/traces/t.jsonl", "--json=~/a/analysis.json")
    assert result.exit_code == 0, result.output
    assert json.loads((home / "a" / "analysis.json").read_text())["trace"]["groups"] == 8
    result = invoke("trace", "convert", "~/traces/t.jsonl", "--out", "~/traces/copy.jsonl")
    assert result.exit_code == 0, result.output
    assert (home / "traces" / "copy.jsonl").read_text().splitlines() == lines


def test_config_values_expand_a_leading_tilde(home):
    assert invoke("trace", "synth", "--groups", 8, "--n", 2, "--out", home / "t.jsonl").exit_code == 0
    (home / "sim.yaml").write_text("trace: ~/t.jsonl\nout_dir: ~/sim\npolicy: baseline\nfast: 1\nheavy: 1\n")
    result = invoke("simulate", "--config=~/sim.yaml", "--quiet")
    assert result.exit_code == 0, result.output
    assert json.loads((home / "sim" / "simulate.json").read_text())["trace"]["groups"] == 8


def test_config_models_expand_a_leading_tilde(home):
    from pdsr_sdk.gae.config import GaeConfig
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.scoring.config import ScoreConfig

    cfg = RolloutConfig.model_validate({"model": "~/m", "tokenizer": "~/tok", "data": {"path": "~/p.parquet"},
                                        "output": {"path": "~/o.parquet", "summary_path": "~/o.json"}})
    assert (cfg.model, cfg.tokenizer) == (str(home / "m"), str(home / "tok"))
    assert (cfg.data.path, cfg.output.path, cfg.output.summary_path) == (home / "p.parquet", home / "o.parquet",
                                                                         home / "o.json")
    assert RolloutConfig.model_validate({"model": "Org/name"}).model == "Org/name"   # a hub id is left alone
    score = ScoreConfig.model_validate({"data": "~/d.parquet", "out": "~/s.parquet", "model": "~/m"})
    assert (score.data, score.out, score.model) == (home / "d.parquet", home / "s.parquet", home / "m")
    assert GaeConfig.model_validate({"data": "~/d.parquet", "out": "~/g.parquet"}).out == home / "g.parquet"
