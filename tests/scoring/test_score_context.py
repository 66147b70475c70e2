"""``per_token_logps`` refuses a prompt + completion over the model's context (it scored one before: positions
the model never saw, log-probs that mean nothing), given a model directory (before loading it) or a loaded
model (its ``config``)."""

from __future__ import annotations

import pytest

from pdsr_sdk.errors import DataValueError
from pdsr_sdk.scoring import per_token_logps


def test_over_the_context_of_a_model_directory_is_named_before_loading(tiny_model_dir, monkeypatch):
    from pdsr_sdk.scoring import torch_backend

    monkeypatch.setattr(torch_backend.TorchScoring, "load", lambda *a: pytest.fail("loaded the model"))
    with pytest.raises(DataValueError, match=r"^traj: row 1: prompt \+ completion = 8193 tokens, over the model's "
                                             r"context of 8192 tokens \(max_position_embeddings in .*config.json\) "
                                             r"\(1 row\(s\) in all\)"):
        per_token_logps(tiny_model_dir, [[1, 2], [5] * 8000], [[3], [6] * 193], source="traj")


def test_over_the_context_of_a_loaded_model_is_named(model):
    with pytest.raises(DataValueError, match=r"^row 0: prompt \+ completion = 8200 tokens, over the model's context "
                                             r"of 8192 tokens \(max_position_embeddings in Qwen2ForCausalLM.config\)"):
        per_token_logps(model, [[5] * 8000], [[6] * 200])
    # at the context exactly: scored
    assert len(per_token_logps(model, [[5] * 8000], [[6] * 192], mbs=1).logps[0]) == 192
