"""A model whose context (max_position_embeddings) is shorter than the engines' max_model_len: vLLM refuses such an
engine at start-up, so a max_model_len the config sets is an error naming its key before any engine is built, and the
SDK session's default (sampling.max_tokens + 1024) is lowered to the model's context, as pdsr rollout's is."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from support import requires_vllm, run_on
from pdsr_cli.main import cli
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession

CONTEXT = 512


@pytest.fixture()
def short_model(tmp_path, tiny_model_dir):
    """The tiny model with a context of CONTEXT tokens."""
    model = tmp_path / "short"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = CONTEXT
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize("where, key", [
    ({"engine_defaults": {"max_model_len": 1024}}, "engine_defaults.max_model_len"),
    ({"engines": [{"name": "f0", "pool": "fast", "max_model_len": 256},
                  {"name": "f1", "pool": "fast", "max_model_len": 1024}]}, r"engines\[1\].max_model_len"),
])
def test_a_max_model_len_past_the_models_context_names_its_key(short_model, engine_loop, monkeypatch, where, key):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    session = RolloutSession(RolloutConfig(model=str(short_model), sampling={"max_tokens": 64}, **where))
    with pytest.raises(ConfigError, match=rf"{key}: 1024 is above the model's context of {CONTEXT} tokens "
                                          r"\(max_position_embeddings in .*config.json\)"):
        run_on(engine_loop, session.start())
    assert session.engines == []


def test_the_cli_names_the_key_before_any_engine(short_model, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model: {short_model}\nengine_defaults: {{max_model_len: 1024}}\n")
    result = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--n", "2", "--max-tokens", "8", "--limit", "1",
                                      "--batch-size", "1", "--out", str(tmp_path / "r.parquet")],
                                catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "engine_defaults.max_model_len: 1024" in result.output and "starting" not in result.output


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_the_sessions_default_fits_the_models_context(short_model, engine_loop):
    """Before: max_tokens 64 + 1024 = 1088 went to vLLM, which refused to start ('User-specified max_model_len (1088)
    is greater than the derived max_model_len'). Now the engine starts at the model's context, read back from
    vLLM's own config."""
    session = RolloutSession(RolloutConfig(model=str(short_model), sampling={"max_tokens": 64}, fast=1, heavy=0,
                                           engine_defaults={"warmup_tokens": 0}))
    try:
        run_on(engine_loop, session.start())
        assert [e._llm.vllm_config.model_config.max_model_len for e in session.engines] == [CONTEXT]
    finally:
        run_on(engine_loop, session.close())
