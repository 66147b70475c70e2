"""docs/sdk-batch.md's old-policy block, run as written on a real step sampled at a temperature other than 1, and
greedily: the trainer's log-probs it gives line up with the batch's ``rollout_log_probs`` (the engine's, of the
distribution it sampled from; greedy sampling reports the model's own, at temperature 1, vLLM's rule), and the batch's
rows are the step's raw token lists."""

from __future__ import annotations

import re

import numpy as np
import pytest

from support import ROOT, requires_vllm, run_on

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s

#: fp32 engines against the trainer's fp32 forward (docs/scoring-gae.md's bound)
TOL = 1e-3


def the_block() -> str:
    """The python block of docs/sdk-batch.md that scores the old policy, as the reader copies it."""
    text = (ROOT / "docs" / "sdk-batch.md").read_text()
    return next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "per_token_logps(" in b)


@pytest.mark.parametrize("temperature", [0.7, 0.0])   # 0.7: the engine's log-probs are of logits / 0.7
def test_the_docs_old_log_probs_match_the_rollouts_at_its_temperature(engine_loop, vllm_pair, tiny_model_dir,
                                                                     temperature):
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk import RolloutConfig, RolloutSession

    cfg = RolloutConfig(model=str(tiny_model_dir), batch_size=2, seed=0,
                        sampling={"n": 3, "max_tokens": 12, "temperature": temperature})

    async def scenario():
        async with RolloutSession(cfg, engines=vllm_pair) as session:
            await session.aupdate_weights(str(tiny_model_dir))   # the engines may hold another test's weights
            return session, await session.astep(["Tell me about cats.", "Tell me about rain."])

    session, out = run_on(engine_loop, scenario(), timeout=600)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    scope = {"out": out, "model": model, "session": session}
    exec(the_block(), scope)
    b, old_logp = scope["b"], scope["old_logp"]
    samples = scope["samples"]
    assert len(samples) == 6
    width = max(len(s.token_ids) for s in samples)
    for i, s in enumerate(samples):   # each row against the raw lists it came from
        k = len(s.token_ids)
        assert b.tensors["responses"][i, :k].tolist() == list(s.token_ids)
        assert b.tensors["response_mask"][i].tolist() == [1] * k + [0] * (width - k)
        assert np.array_equal(b.tensors["rollout_log_probs"][i, :k].numpy(), np.asarray(s.logprobs, np.float32))
    mask = b.tensors["response_mask"].bool()
    gap = (old_logp - b.tensors["rollout_log_probs"])[mask].abs()
    assert gap.max().item() < TOL, f"old log-probs differ from the engine's by up to {gap.max().item():.3g}"
    assert torch.all(old_logp[~mask] == -1)
