"""A stop token id outside the model's vocabulary: vLLM takes it and never meets it, so a response meant to end there
ran to max_tokens; it is now an error naming the key before any engine starts, in the SDK and the CLI."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from support import requires_torch, run_on
from pdsr_cli.main import cli
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.config import EngineSpec
from pdsr_sdk.rollout.preflight import check_engine_model, model_vocab_size
from pdsr_sdk.rollout.session import RolloutSession

pytestmark = requires_torch


def test_a_stop_token_id_past_the_vocabulary_is_refused_before_engines_start(tmp_path, tiny_model_dir, engine_loop):
    session = RolloutSession(RolloutConfig(model=str(tiny_model_dir)))
    vocab = max(len(session.tokenizer), model_vocab_size(tiny_model_dir) or 0)
    spec = EngineSpec(name="f0", pool="fast", backend="vllm")
    for ids in ([], [0], [vocab - 1], [vocab]):   # the last id of the vocabulary is a token; the next is not
        cfg = RolloutConfig(model=str(tiny_model_dir), sampling={"stop_token_ids": ids})
        if ids == [vocab]:
            with pytest.raises(ConfigError, match="sampling.stop_token_ids"):
                check_engine_model(cfg, [spec], str(tiny_model_dir), lambda: session.tokenizer)
        else:
            assert len(check_engine_model(cfg, [spec], str(tiny_model_dir), lambda: session.tokenizer)) == 1
    bad = RolloutSession(RolloutConfig(model=str(tiny_model_dir), sampling={"stop_token_ids": [5, vocab]}))
    message = rf"sampling.stop_token_ids: {vocab} is not a token of the model \(its ids are 0 to {vocab - 1}\)"
    with pytest.raises(ConfigError, match=message):
        run_on(engine_loop, bad.start())
    assert bad.engines == []
    r = CliRunner().invoke(cli, ["rollout", "--model", str(tiny_model_dir), "--n", "2", "--max-tokens", "8", "--limit",
                                 "1", "--stop-token-id", str(vocab + 7), "--out", str(tmp_path / "r.parquet")],
                           catch_exceptions=False)
    assert r.exit_code == 2 and f"{vocab + 7} is not a token of the model" in r.output, r.output
    assert "Traceback" not in r.output and "starting" not in r.output
