"""Mistakes a newcomer following README.md and docs/ makes, and what pdsr answers: each error names the file, the
dotted key or the flag (docs/configuration.md: "errors name the file and the dotted key") in pdsr's words."""

from __future__ import annotations

import pytest

from cli_checks import failed, invoke
from pdsr_sdk import RolloutConfig
from pdsr_sdk.config import load_config
from pdsr_sdk.errors import ConfigError


def test_a_misspelt_engine_defaults_key_is_named_with_its_file_when_the_config_is_read(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("engine_defaults: {max_num_seq: 64, max_model_len: 4096}\n")
    out = tmp_path / "r.parquet"
    out.write_bytes(b"an earlier run")   # the output check comes after the config's: the key is what is reported
    text = failed(invoke("rollout", "--config", cfg, "--out", out),
                  f"{cfg}: engine_defaults.max_num_seq: unknown config key; valid keys here: ", "max_num_seqs")
    assert "already exists" not in text and out.read_bytes() == b"an earlier run"
    with pytest.raises(ConfigError, match=r"run\.yaml: engine_defaults\.max_num_seq: unknown config key"):
        load_config(RolloutConfig, cfg)


def test_an_engine_defaults_value_is_checked_as_an_engines_in_code_too():
    with pytest.raises(ConfigError, match=r"engine_defaults\.max_num_seqs: Input should be greater than or equal to 1"):
        RolloutConfig(engine_defaults={"max_num_seqs": 0})
    given = {"max_num_seqs": 8, "max_model_len": 512, "engine_args": {"enforce_eager": True}}
    assert RolloutConfig(engine_defaults=given).engine_defaults == given   # kept as given, a dict


def test_a_validators_plain_value_error_reads_as_pdsrs_own():
    """pydantic's "Value error, " is not pdsr's wording, and the value is not given twice."""
    text = failed(invoke("rollout", "--instruction", "maths"),
                  "--instruction: data.instruction: unknown instruction 'maths'; valid names: math")
    assert "Value error" not in text and "(got 'maths')" not in text
    text = failed(invoke("rollout", "--temperature", "0.005"),
                  "--temperature: sampling.temperature: 0.005 is under 0.01")
    assert "Value error" not in text and "(got 0.005)" not in text


def test_a_value_error_that_does_not_show_the_value_gets_it_appended():
    from pydantic import Field, field_validator

    from pdsr_sdk.config import ConfigModel

    class Settings(ConfigModel):   # as a policy's own config_model might raise
        window: int = Field(8, description="A window.")

        @field_validator("window")
        @classmethod
        def _even(cls, window: int) -> int:
            if window % 2:
                raise ValueError("must be even")
            return window

    with pytest.raises(ConfigError) as caught:
        Settings(window=7)
    assert str(caught.value).endswith("Settings: window: must be even (got 7)")


@pytest.mark.parametrize(("flags", "named"), [
    (["--stop", ""], "--stop: sampling.stop: an empty stop string ends nothing"),
    (["--stop-token-id", "3", "--stop-token-id", "-1"],
     "--stop-token-id: sampling.stop_token_ids: a token id is 0 or more"),
])
def test_a_bad_value_of_a_repeatable_flag_names_the_flag(flags, named):
    assert "command line:" not in failed(invoke("rollout", *flags), named)


def test_a_missing_model_folder_under_a_local_folder_is_not_called_a_hub_id(tmp_path, monkeypatch):
    """README's models/smollm2-135m-instruct mistyped was answered 'it looks like a Hugging Face hub id' with a
    huggingface-cli command to download it; where its first part is a folder here, it is a path."""
    from pdsr_sdk.errors import DataError
    from pdsr_sdk.rollout.preflight import check_model_folder

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    with pytest.raises(DataError) as caught:
        check_model_folder("models/smollm2-135m-instruc")
    assert str(caught.value) == ("model (--model) 'models/smollm2-135m-instruc' does not exist; pass a local Hugging "
                                 "Face model folder")
    text = failed(invoke("rollout", "--model", "models/smollm2-135m-instruc", "--out", tmp_path / "r.parquet"),
                  "model (--model) 'models/smollm2-135m-instruc' does not exist")
    assert "hub id" not in text
    with pytest.raises(DataError, match=r"does not exist; .*; if it is a Hugging Face hub id: .*download Org/model"):
        check_model_folder("Org/model")   # no folder Org here: it may be one


def test_calibrates_warning_gives_the_median_error_as_the_profile_does():
    """A 0.66% median error read '1%' in the warning beside '0.7%' in the profile it was printed with."""
    from pdsr_sdk.sim.calibrate import PoolFit, fit_warnings

    poor = PoolFit(pool="fast", coefficients={}, spans=16, engines=1, r2=0.2199, median_rel_error=0.006603)
    assert "(R^2 0.22, median |error| 0.7%; 16 spans)" in fit_warnings({"fast": poor})[0]


def test_a_policy_import_path_that_fails_is_not_answered_with_the_presets():
    """docs/rollout.md's `--policy my_pkg.policies:LongestFirst` before my_pkg exists: the import's error alone."""
    text = failed(invoke("rollout", "--policy", "my_pkg.policies:LongestFirst"),
                  "--policy: policy: cannot import module 'my_pkg.policies' (from 'my_pkg.policies:LongestFirst')")
    assert "presets:" not in text
    failed(invoke("rollout", "--policy", "v4"), "unknown policy 'v4'; valid names: ", "; presets: v2.5-restart")


def test_coming_from_mds_dynamic_filtering_range_filter_takes_a_failed_reward():
    """docs/coming-from.md's group_filter for OpenRLHF's --algo.dynamic_filtering_range, as written with LO, HI = 0, 1:
    a failed sample's reward is None (the cell says so); the lambda leaves it out, as --filter-groups does, where
    sum(r) raised a TypeError. Against the range test on the rewards that did not fail."""
    import re
    from pathlib import Path

    import numpy as np

    text = (Path(__file__).resolve().parents[1] / "docs" / "coming-from.md").read_text()
    found = re.findall(r"group_filter=(lambda group, r: [^`]*)\)`", text)
    assert len(found) == 1, found
    keep = eval(found[0], {"np": np, "LO": 0.0, "HI": 1.0})   # noqa: S307 - the doc's own expression
    for rewards in ([1.0, None, 0.0], [1.0, None, 1.0], [0.5], [None, None], [0.0, 0.0, 1.0, 1.0]):
        ok = [x for x in rewards if x is not None]
        assert bool(keep(None, rewards)) == (bool(ok) and 0.0 < sum(ok) / len(ok) < 1.0), rewards
