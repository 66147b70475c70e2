"""Packed against unpacked scoring on CUDA (issue 52): the packed path's attention on a GPU keeps to each sample.

A small random Qwen2 built from its config on the GPU (no files, nothing downloaded; sdpa attention), packed
with pdsr's varlen attention and with the model's own (sdpa's packed mask):
- fp32: packed log-probs equal the unpacked (right-padded, token quota) ones to 1e-4 relative, in input order,
  and no computed token is padding;
- bf16: packed and unpacked each against the fp32 model (the same weights): packing costs no more than bf16
  itself does.

Marked ``cuda`` and skipped without a CUDA device; ``scripts/gpu_check.sh`` runs them with ``-m cuda``.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tiny_scoring import max_diff  # noqa: E402

from pdsr_sdk.scoring import per_token_logps  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (packed scoring on CUDA)")]

VOCAB = 1024


@pytest.fixture(scope="module")
def cuda_model():
    """A Qwen2 of the tiny model's shape (hidden 256, 4 layers) with random weights, fp32, on the GPU."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.to(device="cuda", dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def samples():
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, VOCAB, int(rng.integers(1, 60))).tolist() for _ in range(32)]
    completions = [rng.integers(0, VOCAB, int(rng.integers(1, 400))).tolist() for _ in range(32)]
    return prompts, completions


@pytest.mark.parametrize("attention", ["varlen", "model"])
@pytest.mark.parametrize("kwargs", [dict(max_tokens_per_micro_batch=2048), dict(mbs=8)], ids=["quota-2048", "mbs-8"])
def test_packed_matches_unpacked_on_cuda_fp32(cuda_model, samples, kwargs, attention):
    padded = per_token_logps(cuda_model, *samples, pack=False, **kwargs)
    packed = per_token_logps(cuda_model, *samples, pack=True, packed_attention=attention, **kwargs)
    assert packed.stats.head.endswith("(varlen per-sample sdpa attention)" if attention == "varlen"
                                      else "(sdpa attention)")
    assert [len(x) for x in packed.logps] == [len(c) for c in samples[1]]
    assert all(x.dtype == np.float32 for x in packed.logps)
    assert max_diff(packed.logps, padded.logps) <= 1e-4
    st = packed.stats
    assert st.mode.startswith("packed") and not padded.stats.mode.startswith("packed")
    assert st.computed_tokens == st.real_tokens == sum(len(p) + len(c) for p, c in zip(*samples))
    assert all(rows == 1 for rows, _ in st.shapes)


@pytest.mark.parametrize("attention", ["varlen", "model"])
def test_packed_bf16_costs_no_more_than_bf16_itself(cuda_model, samples, attention):
    """bf16 on CUDA: 'varlen' is flash attention's varlen kernel (Ampere or newer), 'model' sdpa's packed mask."""
    import copy

    ref = per_token_logps(cuda_model, *samples, max_tokens_per_micro_batch=2048, pack=False).logps
    model16 = copy.deepcopy(cuda_model).to(torch.bfloat16)     # the fixture's fp32 weights stay as they are
    padded = per_token_logps(model16, *samples, max_tokens_per_micro_batch=2048, pack=False).logps
    res = per_token_logps(model16, *samples, max_tokens_per_micro_batch=2048, pack=True, packed_attention=attention)
    if attention == "varlen" and torch.cuda.get_device_capability()[0] >= 8:
        assert res.stats.head.endswith("(varlen flash attention)")
    packed = res.logps
    padded_err, packed_err = max_diff(padded, ref), max_diff(packed, ref)
    assert padded_err > 0
    assert packed_err <= max(2.0 * padded_err, 0.05), (packed_err, padded_err)


def test_pack_none_on_cuda_follows_the_measured_rule(cuda_model, samples):
    from pdsr_sdk.scoring import packed

    res = per_token_logps(cuda_model, samples[0][:4], samples[1][:4])
    assert res.stats.mode.startswith("packed") == packed.PACK_MEASURED_FASTER[("torch", "cuda")]
