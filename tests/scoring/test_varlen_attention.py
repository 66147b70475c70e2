"""pdsr_sdk.scoring.varlen_attention held to its float64 twin (a dense block-causal masked softmax).

The per-sample loop runs everywhere; flash attention's varlen kernel on a CUDA device only (marked ``cuda``).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pdsr_sdk.scoring import varlen_attention as va  # noqa: E402

HAS_CUDA = torch.cuda.is_available()

#: (query heads, key/value heads, sample lengths)
CASES = [
    (2, 2, [5]),
    (4, 2, [1, 7, 3]),
    (4, 1, [16, 1, 1, 9]),
    (6, 3, [33, 2, 64, 5]),
]


def _qkv(heads, kv_heads, n, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((heads, n, dim)), rng.standard_normal((kv_heads, n, dim)),
            rng.standard_normal((kv_heads, n, dim)))


@pytest.mark.parametrize("lengths", [[5], [1, 7, 3], [1, 1], [4, 1, 6, 2]])
def test_packed_bounds_follow_position_ids(lengths):
    pos = np.concatenate([np.arange(n) for n in lengths])
    expected = [0]
    for n in lengths:
        expected.append(expected[-1] + n)
    assert va.packed_bounds(pos).tolist() == expected
    assert va.packed_bounds(pos[None, :]).tolist() == expected


def test_packed_bounds_start_a_sample_where_positions_do_not_continue():
    # a sample of its own starts at any break, not only at position 0 (transformers' rule)
    assert va.packed_bounds(np.array([3, 4, 5, 0, 1, 7, 8])).tolist() == [0, 3, 5, 7]
    assert va.packed_bounds(np.array([], dtype=np.int64)).tolist() == [0]


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)], ids=["f64", "f32"])
@pytest.mark.parametrize("heads,kv_heads,lengths", CASES, ids=lambda c: str(c))
def test_segment_loop_matches_block_causal_reference(heads, kv_heads, lengths, dtype, tol):
    bounds = np.cumsum([0] + lengths)
    q, k, v = _qkv(heads, kv_heads, int(bounds[-1]))
    scale = 0.37
    ref = va.block_causal_reference(q, k, v, bounds, scale)
    got = va.segment_loop(*(torch.as_tensor(a, dtype=dtype) for a in (q, k, v)), bounds, scale)
    assert got.dtype == dtype and tuple(got.shape) == q.shape
    assert np.abs(got.double().numpy() - ref).max() <= tol


def test_reference_is_not_full_causal_attention():
    """The twin must see the bounds: with two samples it differs from one causal sequence after the first."""
    bounds = np.array([0, 4, 9])
    q, k, v = _qkv(2, 2, 9, seed=3)
    packed = va.block_causal_reference(q, k, v, bounds, 0.5)
    whole = va.block_causal_reference(q, k, v, np.array([0, 9]), 0.5)
    assert np.allclose(packed[:, :4], whole[:, :4])
    assert not np.allclose(packed[:, 4:], whole[:, 4:])


def _forward_inputs(heads, kv_heads, lengths, dtype, device="cpu"):
    bounds = np.cumsum([0] + lengths)
    q, k, v = _qkv(heads, kv_heads, int(bounds[-1]), seed=5)
    t = [torch.as_tensor(a, dtype=dtype, device=device)[None] for a in (q, k, v)]
    pos = torch.as_tensor(np.concatenate([np.arange(n) for n in lengths]), device=device)[None]
    return bounds, (q, k, v), t, pos


@pytest.mark.parametrize("heads,kv_heads,lengths", CASES[1:], ids=lambda c: str(c))
def test_attention_forward_reads_bounds_from_keywords_or_position_ids(heads, kv_heads, lengths):
    bounds, (q, k, v), (tq, tk, tv), pos = _forward_inputs(heads, kv_heads, lengths, torch.float64)
    ref = va.block_causal_reference(q, k, v, bounds, 0.25).transpose(1, 0, 2)[None]       # [1, N, H, D]
    by_pos, weights = va.attention_forward(None, tq, tk, tv, None, scaling=0.25, position_ids=pos)
    cu = torch.as_tensor(bounds, dtype=torch.int32)
    by_cu, _ = va.attention_forward(None, tq, tk, tv, None, scaling=0.25, position_ids=pos,
                                    cu_seq_lens_q=cu, max_length_q=max(lengths))
    assert weights is None
    assert np.abs(by_pos.numpy() - ref).max() <= 1e-12
    assert np.abs(by_cu.numpy() - ref).max() <= 1e-12


def test_attention_forward_refuses_a_batch_or_a_cache():
    _, _, (tq, tk, tv), pos = _forward_inputs(2, 2, [3, 4], torch.float32)
    with pytest.raises(ValueError, match="one packed row"):
        va.attention_forward(None, tq.repeat(2, 1, 1, 1), tk.repeat(2, 1, 1, 1), tv.repeat(2, 1, 1, 1), None)
    with pytest.raises(ValueError, match="without a KV cache"):
        va.attention_forward(None, tq[:, :, :5], tk, tv, None)


def _tiny_config(**extra):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, **extra)


def test_supports_packed_attention_only_without_sliding_windows():
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_config(_tiny_config(), attn_implementation="sdpa")
    sliding = AutoModelForCausalLM.from_config(_tiny_config(use_sliding_window=True, sliding_window=8,
                                                            max_window_layers=0), attn_implementation="sdpa")
    assert va.supports_packed_attention(plain)
    assert not va.supports_packed_attention(sliding)
    assert not va.supports_packed_attention(object())


def test_packed_attention_switches_and_restores_the_models_own():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(_tiny_config(), attn_implementation="sdpa").eval()
    with va.packed_attention(model):
        assert model.config._attn_implementation == va.ATTN_NAME
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="boom"), va.packed_attention(model):
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA or not va.flash_varlen_available("cuda", "bfloat16"),
                    reason="needs a CUDA device of Ampere or newer and torch.nn.attention.varlen")
@pytest.mark.parametrize("heads,kv_heads,lengths", CASES + [(8, 2, [700, 3, 1500, 64])], ids=lambda c: str(c))
def test_flash_varlen_matches_block_causal_reference(heads, kv_heads, lengths):
    bounds, (q, k, v), _, _ = _forward_inputs(heads, kv_heads, lengths, torch.float64)
    ref = va.block_causal_reference(q, k, v, bounds, 0.3)
    cu = torch.as_tensor(bounds, dtype=torch.int32, device="cuda")
    dq, dk, dv = (torch.as_tensor(a, dtype=torch.bfloat16, device="cuda") for a in (q, k, v))
    got = va.flash_varlen(dq, dk, dv, cu, max(lengths), 0.3)
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == q.shape
    # bf16 inputs: compare with the loop on the same bf16 inputs (upcast), and both with the float64 twin
    loop = va.segment_loop(dq.float(), dk.float(), dv.float(), bounds, 0.3).double().cpu().numpy()
    err = np.abs(got.double().cpu().numpy() - ref).max()
    assert np.abs(got.double().cpu().numpy() - loop).max() <= 2e-2
    assert err <= 5e-2, err
