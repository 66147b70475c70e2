"""pdsr_sdk.scoring's pure parts: the log-prob kernel against its float64 twin, and the micro-batch plans."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pdsr_sdk.errors import DataError  # noqa: E402
from pdsr_sdk.scoring.buckets import (  # noqa: E402
    length_groups,
    plan_fixed,
    plan_single,
    plan_stats,
    plan_token_quota,
)
from pdsr_sdk.scoring.logprob_kernel import chunked_token_logps, naive_token_logps  # noqa: E402

EPS32 = float(np.finfo(np.float32).eps)


# ---------------------------------------------------------------- kernel

def _kernel_tolerance(logits64: torch.Tensor, ref: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-row bound for fp32 logits/exp with float64 sums, rounded to fp32 once.

    (z - max) is rounded once (<= eps/2 * |z - max|), each exp() is within ~2
    ulp relative (so log(sum) within ~2 eps), and the result is rounded to
    fp32 (eps/2 * |result|). 4x margin.
    """
    z = logits64 / temperature
    spread = (z.max(-1).values - z.min(-1).values).abs()
    return 4 * EPS32 * (spread + 2 + ref.abs())


@pytest.mark.parametrize("n,vocab", [(1, 2), (7, 5), (64, 1024), (300, 97)])
@pytest.mark.parametrize("row_chunk", [1, 3, 64, 10_000])
@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_kernel_matches_float64_twin_on_logits(n, vocab, row_chunk, temperature):
    gen = torch.Generator().manual_seed(n * 1000 + vocab)
    logits = torch.randn(n, vocab, generator=gen) * 4
    targets = torch.randint(0, vocab, (n,), generator=gen)
    before = logits.clone()
    logps, entropy = chunked_token_logps(logits, targets, None, temperature=temperature, row_chunk=row_chunk,
                                         return_entropy=True)
    ref, ref_entropy = naive_token_logps(logits, targets, temperature=temperature, return_entropy=True)
    assert logps.dtype == torch.float32 and entropy.dtype == torch.float32
    tol = _kernel_tolerance(logits.double(), ref, temperature)
    assert ((logps.double() - ref).abs() <= tol).all()
    # entropy: sum of V terms |p z| each with ~2 eps relative error
    ent_tol = 4 * EPS32 * (tol.new_tensor(float(vocab)).sqrt() * (logits.double().abs().max() / temperature) + 2
                           + ref_entropy.abs())
    assert ((entropy.double() - ref_entropy).abs() <= ent_tol).all()
    assert torch.equal(logits, before), "the caller's logits were modified"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kernel_with_head_matches_twin(dtype):
    gen = torch.Generator().manual_seed(3)
    n, h, vocab = 50, 32, 300
    hidden = torch.randn(n, h, generator=gen).to(dtype)
    head = torch.nn.Linear(h, vocab, bias=True).to(dtype)
    targets = torch.randint(0, vocab, (n,), generator=gen)
    with torch.no_grad():
        logps, _ = chunked_token_logps(hidden, targets, head, row_chunk=8)
        # the twin sees the same head outputs (chunked vs full matmul may round differently in low precision)
        logits = torch.cat([head(hidden[i:i + 8]) for i in range(0, n, 8)])
    ref, _ = naive_token_logps(logits, targets)
    tol = _kernel_tolerance(logits.double(), ref, 1.0)
    assert ((logps.double() - ref).abs() <= tol).all()


def test_kernel_float64_head_against_exact_math():
    # an fp32 head vs logits from a float64 matmul: only the fp32 matmul rounding differs
    gen = torch.Generator().manual_seed(5)
    n, h, vocab = 40, 64, 200
    hidden = torch.randn(n, h, generator=gen)
    weight = torch.randn(vocab, h, generator=gen) / 8
    targets = torch.randint(0, vocab, (n,), generator=gen)
    logps, _ = chunked_token_logps(hidden, targets, lambda x: x @ weight.T, row_chunk=7)
    ref, _ = naive_token_logps(hidden.double() @ weight.double().T, targets)
    # |dz| <= h * eps * max|x||w| per logit; log-prob moves by at most 2 max|dz|
    dz = h * EPS32 * float(hidden.abs().max() * weight.abs().max())
    assert float((logps.double() - ref).abs().max()) <= 2 * dz + 1e-6


def test_kernel_entropy_with_masked_vocabulary_is_finite():
    logits = torch.tensor([[0.0, -math.inf, 1.0], [2.0, 2.0, -math.inf]])
    logps, entropy = chunked_token_logps(logits, torch.tensor([0, 1]), None, return_entropy=True)
    ref, ref_entropy = naive_token_logps(torch.where(torch.isinf(logits), torch.full_like(logits, -1e30), logits),
                                         torch.tensor([0, 1]), return_entropy=True)
    assert torch.isfinite(entropy).all()
    assert torch.allclose(entropy.double(), ref_entropy, atol=1e-6)
    assert torch.allclose(logps.double(), ref, atol=1e-6)


# ----------------------------------------------------------------- plans

def _covers(plan, n):
    seen = sorted(i for mb in plan for i in mb.indices)
    return seen == list(range(n))


@pytest.mark.parametrize("seed", range(5))
def test_plans_cover_every_sample_once_with_bucketed_lengths(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    lengths = rng.integers(1, 3000, n)
    for bucket in (1, 64):
        single = plan_single(lengths, length_bucket=bucket)
        assert _covers(single, n) and single[0].seq_len == -(-lengths.max() // bucket) * bucket
        for mbs in (1, 7, 64, 500):
            plan = plan_fixed(lengths, mbs, length_bucket=bucket)
            assert _covers(plan, n)
            assert all(mb.rows == mbs for mb in plan)  # scheme B: the tail block is padded to mbs rows
            assert [i for mb in plan for i in mb.indices] == list(range(n))  # input order
            for mb in plan:
                longest = lengths[list(mb.indices)].max()
                assert mb.seq_len % bucket == 0 and longest <= mb.seq_len < longest + bucket
        cap = int(lengths.max()) * 3 + bucket
        plan, parts = plan_token_quota(lengths, cap, length_bucket=bucket)
        assert _covers(plan, n) and parts == [list(mb.indices) for mb in plan]
        assert max(mb.computed_tokens for mb in plan) <= cap  # padding included
        plan, _ = plan_token_quota(lengths, cap, length_bucket=bucket, grouping="none")
        assert _covers(plan, n)
        assert max(int(lengths[list(mb.indices)].sum()) for mb in plan) <= cap  # real tokens only


@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.2])
def test_length_groups_bound_padding(fraction):
    rng = np.random.default_rng(11)
    lengths = np.clip(rng.lognormal(6, 0.9, 400).astype(np.int64), 1, None)
    groups = length_groups(lengths, fraction)
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(lengths)))
    for g in groups:
        longest = lengths[g].max()
        assert lengths[g].sum() >= (1 - fraction) * len(g) * longest - 1e-9
    # with length_bucket=1 the whole plan keeps the bound
    plan, _ = plan_token_quota(lengths, int(lengths.max()) * 8, length_bucket=1, max_padding_fraction=fraction)
    stats = plan_stats(plan)
    assert lengths.sum() / stats["computed_tokens"] >= 1 - fraction - 1e-12


def test_token_quota_beats_global_kk_on_long_tail():
    rng = np.random.default_rng(0)
    lengths = rng.integers(100, 301, 512) + np.clip(rng.lognormal(np.log(400), 0.9, 512).astype(np.int64), 16, 4096)
    grouped, _ = plan_token_quota(lengths, 16384, length_bucket=64)
    flat, _ = plan_token_quota(lengths, 16384, length_bucket=64, grouping="none")
    eff = lambda plan: lengths.sum() / plan_stats(plan)["computed_tokens"]  # noqa: E731
    assert eff(grouped) >= 0.9
    assert eff(flat) < 0.6  # KK on real tokens mixes long and short samples in one padded forward


def test_token_quota_sample_longer_than_cap_is_named():
    with pytest.raises(DataError, match=r"sample 2: prompt \+ completion = 900 tokens.*max_tokens_per_micro_batch=512"):
        plan_token_quota(np.array([10, 20, 900]), 512, length_bucket=64)
