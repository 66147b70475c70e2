"""``pdsr score`` on a ``pdsr rollout`` file scores at the temperature the rollout recorded, unless given.

A rollout's engine log-probs are of logits / its temperature; scored at 1.0 instead, a 0.7 rollout's log-probs were
0.5 off on average (tiny model) without a word. The reference here is one full forward per sample
(tests/tiny_scoring.py), at the temperature each case expects."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from pdsr_cli.main import cli  # noqa: E402
from tiny_scoring import max_diff, naive_logps, random_samples  # noqa: E402


def _rollout_file(path, prompts, responses, temperature):
    """Rows as ``pdsr rollout`` writes them, its settings (``pdsr_run``) in the metadata; None: no settings."""
    table = pa.table({"prompt_token_ids": prompts, "response_token_ids": responses})
    if temperature is not None:
        settings = {"sampling.n": 1, "sampling.temperature": temperature, "sampling.top_p": 1.0}
        table = table.replace_schema_metadata({"pdsr_run": json.dumps(settings)})
    pq.write_table(table, path)
    return path


@pytest.fixture(scope="module")
def case(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    prompts, responses = random_samples(11, 4, max_prompt=12, max_completion=20)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    return prompts, responses, {t: naive_logps(model, prompts, responses, temperature=t) for t in (0.7, 1.0)}


def _score(tmp_path, tiny_model_dir, data, *extra):
    out = tmp_path / "scored.parquet"
    result = CliRunner().invoke(cli, ["score", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(out),
                                      "--dtype", "float32", "--device", "cpu", "--overwrite", *map(str, extra)])
    assert result.exit_code == 0, result.output
    return pq.read_table(out).column("ref_logps").to_pylist(), result


def test_the_rollouts_temperature_is_the_default(tmp_path, tiny_model_dir, case):
    prompts, responses, want = case
    got, result = _score(tmp_path, tiny_model_dir, _rollout_file(tmp_path / "r.parquet", prompts, responses, 0.7))
    assert max_diff(got, want[0.7]) < 1e-5 and max_diff(got, want[1.0]) > 1e-2
    assert "column 'ref_logps' at temperature 0.7 (the rollout's, recorded in --data)" in result.stdout
    assert "warning" not in result.stderr


def test_a_temperature_given_wins_and_one_other_than_the_rollouts_is_named(tmp_path, tiny_model_dir, case):
    prompts, responses, want = case
    data = _rollout_file(tmp_path / "r.parquet", prompts, responses, 0.7)
    got, result = _score(tmp_path, tiny_model_dir, data, "--temperature", 1.0)
    assert max_diff(got, want[1.0]) < 1e-5
    assert "at temperature" not in result.stdout
    assert ("warning: temperature (--temperature) is 1, but the rollout in --data sampled at 0.7: its "
            "response_logprobs are of logits / 0.7") in result.stderr
    config = tmp_path / "score.yaml"
    config.write_text("temperature: 0.7\n")   # given in a config file: the same as the rollout's, no warning
    got, result = _score(tmp_path, tiny_model_dir, data, "--config", config)
    assert max_diff(got, want[0.7]) < 1e-5 and "warning" not in result.stderr


@pytest.mark.parametrize("recorded", [None, 0.0])   # not a rollout's file; a greedy rollout (vLLM: temperature 1)
def test_without_a_recorded_temperature_it_is_1(tmp_path, tiny_model_dir, case, recorded):
    prompts, responses, want = case
    got, result = _score(tmp_path, tiny_model_dir, _rollout_file(tmp_path / "r.parquet", prompts, responses, recorded))
    assert max_diff(got, want[1.0]) < 1e-5
    assert "at temperature" not in result.stdout and "warning" not in result.stderr


def test_recorded_temperature_reads_only_a_rollouts_number():
    from pdsr_sdk.rollout.resume import METADATA_KEY, RESUME_KEYS
    from pdsr_sdk.scoring.rollout_input import ROLLOUT_METADATA, TEMPERATURE_KEY, recorded_temperature

    assert ROLLOUT_METADATA == METADATA_KEY and TEMPERATURE_KEY in RESUME_KEYS   # the names rollout writes

    def schema(raw):
        return pa.schema([("x", pa.int32())], metadata=None if raw is None else {"pdsr_run": raw})

    assert recorded_temperature(schema(json.dumps({"sampling.temperature": 0.6}))) == 0.6
    for raw in (None, "not json", "[0.6]", json.dumps({"sampling.temperature": True}),
                json.dumps({"sampling.temperature": "0.6"}), json.dumps({"sampling.n": 4})):
        assert recorded_temperature(schema(raw)) is None, raw
    assert recorded_temperature(None) is None


def test_the_keys_read_are_the_ones_pdsr_rollout_writes():
    """The scoring layer names the rollout's metadata key and settings key itself (it sits below rollout); they must
    stay the ones a rollout writes, or every rollout file would be scored at 1.0 again without a word."""
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.resume import METADATA_KEY, run_settings
    from pdsr_sdk.scoring.rollout_input import ROLLOUT_METADATA, TEMPERATURE_KEY

    assert ROLLOUT_METADATA == METADATA_KEY
    cfg = RolloutConfig.model_validate({"sampling": {"temperature": 0.7}})
    assert run_settings(cfg, "models/tiny")[TEMPERATURE_KEY] == 0.7


def test_the_vllm_backend_on_a_rollout_not_at_1_names_the_recorded_temperature(tmp_path, tiny_model_dir, case):
    """vLLM's prompt log-probs are of the raw logits, so the vllm backend scores at 1 only. On a rollout file at 0.7
    it was refused with the backend's words about 'temperature=0.7', a value the user never gave, and its advice
    'temperature=1' in the SDK's spelling; the error now says the 0.7 is the rollout's, recorded in --data, and
    what each way out gives. (Refused before any engine starts; vLLM is not needed.)"""
    prompts, responses, _ = case
    data = _rollout_file(tmp_path / "r.parquet", prompts, responses, 0.7)
    out = tmp_path / "scored.parquet"
    result = CliRunner().invoke(cli, ["score", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(out),
                                      "--backend", "vllm"])
    assert result.exit_code == 2, result.output
    assert f"{data}: the rollout in this file sampled at temperature 0.7 (recorded in its metadata)" in result.output
    assert "--backend torch" in result.output and "--temperature 1" in result.output
    assert not out.exists()
