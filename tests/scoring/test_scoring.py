"""pdsr_sdk.scoring: kernel vs its float64 twin, micro-batch plans, and the torch backend on the tiny model.

The model tests load the tiny random Qwen2 in fp32 and compare every
micro-batching mode with the unbatched result (one padded forward, 1e-6) and
with an independent reference: one unpadded full-model forward per sample,
``log_softmax(model(ids).logits.float(), -1)`` gathered (1e-5).

Tolerances are relative to max(1, |log-prob|): differently shaped fp32
matmuls round differently (BLAS picks kernels by shape), and the tiny model's
log-probs reach -15 or so, where one fp32 ulp is already ~1e-6. So 1e-6 means
a few ulps of the value, and the absolute 1e-6 holds for |log-prob| <= 1.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

torch = pytest.importorskip("torch")

from pdsr_sdk.config import load_config  # noqa: E402
from pdsr_sdk.errors import ConfigError, DataError  # noqa: E402
from pdsr_sdk.scoring import ScoreConfig, per_token_logps  # noqa: E402
from pdsr_sdk.scoring.buckets import (  # noqa: E402
    length_groups,
    plan_fixed,
    plan_packed,
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


# ------------------------------------------------------------ tiny model

@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from pdsr_sdk.scoring.torch_backend import load_model

    torch.manual_seed(0)
    return load_model(tiny_model_dir, "cpu", "float32")


def _samples(seed, n, vocab=1024, max_prompt=40, max_completion=150):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab, int(rng.integers(1, max_prompt))).tolist() for _ in range(n)]
    completions = [rng.integers(0, vocab, int(rng.integers(1, max_completion))).tolist() for _ in range(n)]
    return prompts, completions


def _naive(model, prompts, completions, temperature=1.0, entropy=False):
    """One unpadded full-model forward per sample; fp32 log_softmax of the full logits, gathered."""
    out, ents = [], []
    for p, c in zip(prompts, completions):
        ids = torch.tensor([p + c])
        with torch.inference_mode():
            logits = model(ids).logits.float()[0, len(p) - 1:-1] / temperature
        logp = torch.log_softmax(logits, -1)
        out.append(logp.gather(-1, torch.tensor(c)[:, None])[:, 0].numpy())
        ents.append((-(logp.double().exp() * logp.double()).sum(-1)).numpy())
    return (out, ents) if entropy else out


def _max_diff(a, b):
    """max |a - b| / max(1, |b|) over all tokens of all samples (shapes must match)."""
    assert len(a) == len(b)
    worst = 0.0
    for x, y in zip(a, b):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        assert x.shape == y.shape
        worst = max(worst, float((np.abs(x - y) / np.maximum(1.0, np.abs(y))).max()))
    return worst


@pytest.fixture(scope="module")
def samples():
    return _samples(1, 24, max_completion=100)


@pytest.fixture(scope="module")
def unbatched(model, samples):
    return per_token_logps(model, *samples)


@pytest.fixture(scope="module")
def naive(model, samples):
    return _naive(model, *samples)


def test_unbatched_matches_naive(unbatched, naive, samples):
    res = unbatched
    assert [len(x) for x in res.logps] == [len(c) for c in samples[1]]
    assert all(x.dtype == np.float32 for x in res.logps)
    assert _max_diff(res.logps, naive) <= 1e-5
    st = res.stats
    assert (st.micro_batches, st.distinct_shapes) == (1, 1)
    assert st.real_tokens == sum(len(p) + len(c) for p, c in zip(*samples))
    assert st.scored_tokens == sum(len(c) for c in samples[1])
    longest = max(len(p) + len(c) for p, c in zip(*samples))
    assert st.computed_tokens == len(samples[0]) * (-(-longest // 64) * 64)
    assert st.padding_efficiency == pytest.approx(st.real_tokens / st.computed_tokens)
    assert st.head.startswith("chunked lm_head")


MODES = [
    dict(mbs=1),
    dict(mbs=7),  # 24 = 3 x 7 + 3: tail block padded with 4 dummy rows
    dict(mbs=64),  # one block, mostly dummy rows
    dict(mbs=4, length_bucket=1),
    dict(max_tokens_per_micro_batch=512),
    dict(max_tokens_per_micro_batch=1024, max_padding_fraction=0.0),
    dict(max_tokens_per_micro_batch=600, token_grouping="none"),
    dict(mbs=5, attention_mask=False),
    dict(row_chunk=1),
    dict(row_chunk=13, mbs=3),
    dict(pad_id=977, mbs=6),
]


@pytest.mark.parametrize("kwargs", MODES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_micro_batching_modes_match_unbatched_and_naive(model, samples, unbatched, naive, kwargs):
    res = per_token_logps(model, *samples, **kwargs)
    assert _max_diff(res.logps, unbatched.logps) <= 1e-6
    assert _max_diff(res.logps, naive) <= 1e-5


@pytest.mark.parametrize("attention", ["varlen", "model"])
@pytest.mark.parametrize("kwargs", [dict(), dict(max_tokens_per_micro_batch=512)], ids=["one-row", "quota-512"])
def test_packed_matches_unpacked_and_packs(model, samples, unbatched, kwargs, attention):
    """fp32 on the CPU: packed log-probs agree with the unpacked ones to 1e-5, in input order (the
    token budget reorders samples), and no computed token is padding; with pdsr's per-sample attention
    and with the model's own (sdpa with transformers' packed mask)."""
    res = per_token_logps(model, *samples, pack=True, packed_attention=attention, **kwargs)
    assert res.stats.head.endswith("(varlen per-sample sdpa attention)" if attention == "varlen"
                                   else "(sdpa attention)")
    assert model.config._attn_implementation == "sdpa", "the model's own attention is restored"
    assert [len(x) for x in res.logps] == [len(c) for c in samples[1]]
    assert _max_diff(res.logps, unbatched.logps) <= 1e-5
    st = res.stats
    assert st.computed_tokens == st.real_tokens == sum(len(p) + len(c) for p, c in zip(*samples))
    assert st.padding_efficiency == 1.0 and all(rows == 1 for rows, _ in st.shapes)
    assert st.mode.startswith("packed")
    if kwargs:
        assert st.micro_batches > 1 and all(n <= 512 for _, n in st.shapes)
        lengths = np.array([len(p) + len(c) for p, c in zip(*samples)])
        order = [i for mb in plan_packed(lengths, max_tokens=512) for i in mb.indices]
        assert order != list(range(len(order))), "the plan must reorder for the order check to bite"


def test_packed_entropy_temperature_and_mbs_match_unpacked(model, samples):
    sub = (samples[0][:10], samples[1][:10])
    kw = dict(return_entropy=True, temperature=0.7)
    padded = per_token_logps(model, *sub, mbs=4, pack=False, **kw)
    res = per_token_logps(model, *sub, mbs=4, pack=True, row_chunk=13, **kw)
    assert _max_diff(res.logps, padded.logps) <= 1e-5
    assert _max_diff(res.entropy, padded.entropy) <= 1e-5
    assert [len(e) for e in res.entropy] == [len(c) for c in sub[1]]
    assert res.stats.mode == "packed, mbs=4" and res.stats.micro_batches == 3
    assert res.stats.computed_tokens == res.stats.real_tokens


def test_packed_forward_really_separates_samples(model, monkeypatch):
    """The packed forward is one row with restarting position ids and no mask; without the restart the
    samples would see each other and the log-probs change (so the agreement above is not vacuous)."""
    from pdsr_sdk.scoring import hf_model, packed
    from pdsr_sdk.scoring.buckets import MicroBatch
    from pdsr_sdk.scoring.varlen_attention import packed_attention

    prompts, completions = _samples(3, 4, max_completion=30)
    seqs = [np.asarray(p + c) for p, c in zip(prompts, completions)]
    plens = np.array([len(p) for p in prompts])
    mb = MicroBatch((2, 0, 3), 1, int(sum(len(seqs[i]) for i in (2, 0, 3))))
    ids, pos_ids, pos, sizes = packed.packed_inputs(mb, seqs, plens)
    assert ids.shape == (1, mb.seq_len) and sizes == [len(completions[i]) for i in (2, 0, 3)]
    assert pos_ids[0, len(seqs[2])] == 0 and pos_ids[0, -1] == len(seqs[3]) - 1
    parts = hf_model.find_parts(model, seqs[0][:8])
    got, _ = packed.score_packed_micro_batch(model, parts, mb, seqs, plens, temperature=1.0, row_chunk=64,
                                             return_entropy=False)
    ref = _naive(model, [prompts[i] for i in (2, 0, 3)], [completions[i] for i in (2, 0, 3)])
    assert _max_diff(got, ref) <= 1e-5
    with packed_attention(model):     # the sample bounds passed as keywords, each sample's attention its own
        got_varlen, _ = packed.score_packed_micro_batch(model, parts, mb, seqs, plens, temperature=1.0,
                                                        row_chunk=64, return_entropy=False, varlen=True)
    assert _max_diff(got_varlen, ref) <= 1e-5
    monkeypatch.setattr(packed, "packed_inputs",
                        lambda *a: (ids, np.arange(ids.shape[1])[None, :], pos, sizes))   # one long sequence
    leaked, _ = packed.score_packed_micro_batch(model, parts, mb, seqs, plens, temperature=1.0,
                                                row_chunk=64, return_entropy=False)
    assert _max_diff(leaked[1:], ref[1:]) > 1e-3


def test_pack_default_rule_and_model_check(model, monkeypatch):
    from pdsr_sdk.scoring import packed

    assert packed.resolve_pack(True, "cpu") and not packed.resolve_pack(False, "cuda")
    for key, faster in packed.PACK_MEASURED_FASTER.items():
        assert packed.resolve_pack(None, key[1], key[0]) == faster
    assert not packed.resolve_pack(None, "mps")
    prompts, completions = _samples(5, 3, max_completion=20)
    res = per_token_logps(model, prompts, completions)   # pack=None on the CPU: the rule
    assert res.stats.mode.startswith("packed") == packed.PACK_MEASURED_FASTER[("torch", "cpu")]
    # a model whose attention ignores packed position ids is refused, not silently wrong
    real = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, position_ids=None, **kw: real(*a, **kw))
    with pytest.raises(ConfigError, match="does not keep attention inside packed samples"):
        per_token_logps(model, prompts, completions, pack=True)


def test_pack_is_refused_by_vllm_backend():
    with pytest.raises(ConfigError, match="pack"):
        per_token_logps("unused", [[1]], [[2]], backend="vllm", pack=True)


def test_fixed_mbs_stats_and_shapes(model, samples):
    res = per_token_logps(model, *samples, mbs=7)
    plan = plan_fixed(np.array([len(p) + len(c) for p, c in zip(*samples)]), 7, length_bucket=64)
    st = res.stats
    assert st.micro_batches == 4 and st.mode == "mbs=7"
    assert all(rows == 7 for rows, _ in st.shapes)
    assert st.distinct_shapes == len({mb.seq_len for mb in plan})
    assert st.computed_tokens == sum(7 * mb.seq_len for mb in plan)


def test_token_quota_preserves_order_with_shuffled_lengths(model):
    rng = np.random.default_rng(7)
    n = 24
    completion_lengths = rng.permutation(np.arange(5, 5 + 9 * n, 9))  # distinct lengths, shuffled
    prompts = [rng.integers(0, 1024, int(rng.integers(1, 30))).tolist() for _ in range(n)]
    completions = [rng.integers(0, 1024, int(k)).tolist() for k in completion_lengths]
    lengths = np.array([len(p) + len(c) for p, c in zip(prompts, completions)])
    _, parts = plan_token_quota(lengths, 640, length_bucket=64)
    assert [i for part in parts for i in part] != list(range(n)), "the plan must reorder for this test to bite"
    res = per_token_logps(model, prompts, completions, max_tokens_per_micro_batch=640)
    assert res.stats.micro_batches == len(parts) > 1
    assert [len(x) for x in res.logps] == completion_lengths.tolist()
    assert _max_diff(res.logps, _naive(model, prompts, completions)) <= 1e-5
    assert all(mb <= 640 for mb in (r * t for r, t in res.stats.shapes))


@pytest.mark.parametrize("temperature,modes", [
    (1.0, [{}, dict(mbs=4), dict(max_tokens_per_micro_batch=512)]),
    (0.7, [dict(mbs=5)]),
    (1.5, [dict(max_tokens_per_micro_batch=400)]),
])
def test_entropy_and_temperature_match_naive(model, samples, naive, temperature, modes):
    ref, ref_entropy = _naive(model, *samples, temperature=temperature, entropy=True)
    for kwargs in modes:
        res = per_token_logps(model, *samples, temperature=temperature, return_entropy=True, row_chunk=50, **kwargs)
        assert _max_diff(res.logps, ref) <= 1e-5
        assert _max_diff(res.entropy, ref_entropy) <= 1e-5
        assert [len(e) for e in res.entropy] == [len(c) for c in samples[1]]
    if temperature != 1.0:  # the temperature really changes the numbers
        assert _max_diff(ref, naive) > 1e-2


def test_accepts_numpy_and_tensor_rows(model, samples, unbatched):
    prompts = [np.asarray(p, dtype=np.int32) for p in samples[0]]
    completions = [torch.tensor(c) for c in samples[1]]
    res = per_token_logps(model, prompts, completions, mbs=8)
    assert _max_diff(res.logps, unbatched.logps) <= 1e-6


def test_model_directory_argument_and_bf16(tiny_model_dir, samples, unbatched):
    res = per_token_logps(tiny_model_dir, *samples, device="cpu", dtype="float32", mbs=16)
    assert _max_diff(res.logps, unbatched.logps) <= 1e-6
    bf16 = per_token_logps(tiny_model_dir, *samples, device="cpu", dtype="bfloat16", mbs=16)
    assert all(x.dtype == np.float32 for x in bf16.logps)
    from pdsr_sdk.scoring.torch_backend import load_model

    naive_bf16 = _naive(load_model(tiny_model_dir, "cpu", "bfloat16"), *samples)
    bf16_error = _max_diff(naive_bf16, unbatched.logps)  # what bf16 itself costs, unpadded
    assert bf16_error > 0
    # padding/micro-batching noise in bf16 stays below bf16's own error
    assert _max_diff(bf16.logps, naive_bf16) <= bf16_error


class _ScaledLogits(torch.nn.Module):
    """A causal LM whose logits are post-processed after the lm_head (like soft-capping)."""

    def __init__(self, inner, scale, hide_head=False):
        super().__init__()
        self.inner, self.scale, self.hide_head = inner, scale, hide_head
        self.config = inner.config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def get_output_embeddings(self):
        return None if self.hide_head else self.inner.get_output_embeddings()

    def get_decoder(self):
        return self.inner.get_decoder()

    def forward(self, input_ids=None, **kwargs):
        return SimpleNamespace(logits=self.inner(input_ids=input_ids, **kwargs).logits * self.scale)


@pytest.mark.parametrize("hide_head", [False, True])
def test_full_logits_fallback(model, samples, naive, hide_head):
    wrapped = _ScaledLogits(model, 1.7, hide_head=hide_head)
    res = per_token_logps(wrapped, *samples, mbs=8)
    assert res.stats.head.startswith("full logits")
    assert _max_diff(res.logps, _naive(wrapped, *samples)) <= 1e-5
    assert _max_diff(res.logps, naive) > 1e-2  # the post-processing was applied


def test_progress_reports_each_micro_batch(model, samples, capsys):
    events = []

    class Bar:
        def update(self, n=1):
            events.append(("update", n))

        def set_postfix_str(self, s="", refresh=True):
            events.append(("postfix", s))

        def close(self):
            events.append(("close",))

    def factory(desc="", total=None, unit="it"):
        events.append(("open", desc, total, unit))
        return Bar()

    res = per_token_logps(model, *samples, mbs=8, progress=factory)
    assert events[0] == ("open", "score", res.stats.micro_batches, "mb")
    assert sum(e[1] for e in events if e[0] == "update") == res.stats.micro_batches == math.ceil(len(samples[0]) / 8)
    assert events[-1] == ("close",)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""  # the SDK never prints


def test_stats_summary_names_the_numbers(unbatched):
    st = unbatched.stats
    line = st.summary()
    for piece in ("tokens/s", "peak memory", "micro-batches", "distinct shapes", "padding efficiency"):
        assert piece in line
    assert st.seconds > 0 and st.tokens_per_s > 0
    assert st.peak_memory_method
    json.dumps(st.to_dict())


# ----------------------------------------------------------------- errors

@pytest.mark.parametrize("options", [{}, {"mbs": 2}, {"max_tokens_per_micro_batch": 64},
                                     {"pack": True, "max_tokens_per_micro_batch": 8}])
def test_empty_completions_get_empty_arrays(model, options):
    # a failed sample of pdsr rollout has no response tokens; micro-batches of only such samples included
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [11]]
    completions = [[20, 21], [], [22, 23, 24], [], []]
    res = per_token_logps(model, prompts, completions, entropy=True, **options)
    assert [len(x) for x in res.logps] == [2, 0, 3, 0, 0] == [len(x) for x in res.entropy]
    assert all(x.dtype == np.float32 for x in res.logps)
    want, want_entropy = _naive(model, [prompts[0], prompts[2]], [completions[0], completions[2]], entropy=True)
    assert _max_diff([res.logps[0], res.logps[2]], want) < 1e-5
    assert _max_diff([res.entropy[0], res.entropy[2]], want_entropy) < 1e-5
    assert res.stats.scored_tokens == 5


def test_error_empty_prompt_names_row(model):
    with pytest.raises(DataError, match=r"row 0: empty prompt"):
        per_token_logps(model, [[], [3]], [[4], [5]])


@pytest.mark.parametrize("bad", [1024, 5000, -1])
def test_error_token_outside_vocabulary(model, bad):
    with pytest.raises(DataError, match=rf"row 2: token id {bad} in completion_ids .*vocab size 1024"):
        per_token_logps(model, [[1], [2], [3]], [[4], [5], [6, bad]])


def test_error_row_count_mismatch(model):
    with pytest.raises(DataError, match="prompt_ids has 2 rows but completion_ids has 1"):
        per_token_logps(model, [[1], [2]], [[3]])


def test_error_non_integer_ids(model):
    with pytest.raises(DataError, match=r"completion_ids\[0\]: expected integer token ids"):
        per_token_logps(model, [[1]], [[0.5]])


def test_error_both_micro_batch_modes(model):
    with pytest.raises(ConfigError, match="exclusive"):
        per_token_logps(model, [[1]], [[2]], mbs=2, max_tokens_per_micro_batch=100)
    with pytest.raises(ConfigError, match="mbs .* and max_tokens_per_micro_batch .* are exclusive"):
        load_config(ScoreConfig, None, {"data": "a.parquet", "out": "b.parquet", "mbs": 2,
                                        "max_tokens_per_micro_batch": 100})


def test_error_bad_options(model):
    with pytest.raises(ConfigError, match="temperature"):
        per_token_logps(model, [[1]], [[2]], temperature=0.0)
    with pytest.raises(ConfigError, match="backend"):
        per_token_logps(model, [[1]], [[2]], backend="jax")
    with pytest.raises(ConfigError, match="mbs"):
        per_token_logps(model, [[1]], [[2]], mbs=0)
    with pytest.raises(ConfigError, match=r"pad_id: 1024 is not a token id of the model \(vocab size 1024\)"):
        per_token_logps(model, [[1]], [[2]], pad_id=1024)


def test_error_model_dir_without_config(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(DataError, match=rf"{tmp_path}: not a Hugging Face model directory \(no config.json"):
        per_token_logps(tmp_path, [[1]], [[2]])
    with pytest.raises(DataError, match="does not exist"):
        per_token_logps(tmp_path / "missing", [[1]], [[2]])


def test_error_sample_longer_than_quota(model):
    with pytest.raises(DataError, match="sample 1: .*max_tokens_per_micro_batch=64"):
        per_token_logps(model, [[1], [2] * 50], [[3], [4] * 30], max_tokens_per_micro_batch=64)


def test_empty_input(model):
    res = per_token_logps(model, [], [])
    assert res.logps == [] and res.stats.micro_batches == 0


# ------------------------------------------------------------------ table

def test_score_table_adds_described_column(model, samples, unbatched):
    from pdsr_sdk.scoring import score_output_schema, score_table

    table = pa.table({"prompt_token_ids": samples[0], "response_token_ids": samples[1],
                      "ref_logps": [[0.0]] * len(samples[0]), "keep": list(range(len(samples[0])))})
    config = ScoreConfig(data="in.parquet", out="out.parquet", mbs=8, entropy=True)
    out, stats = score_table(table, config, model)
    assert out.column_names == ["prompt_token_ids", "response_token_ids", "ref_logps", "keep", "ref_logps_entropy"]
    assert out.schema.field("ref_logps").type == pa.list_(pa.float32())
    got = [np.asarray(x, np.float32) for x in out.column("ref_logps").to_pylist()]
    assert _max_diff(got, unbatched.logps) <= 1e-6
    expected = score_output_schema("ref_logps", entropy=True)
    for name in ("ref_logps", "ref_logps_entropy"):
        assert out.schema.field(name).metadata[b"description"] == expected.field(name).metadata[b"description"]
    assert stats.micro_batches == math.ceil(len(samples[0]) / 8)


def test_score_table_rejects_non_list_column(model):
    from pdsr_sdk.scoring import score_table

    table = pa.table({"prompt_token_ids": [[1]], "response_token_ids": ["abc"]})
    config = ScoreConfig(data="in.parquet", out="out.parquet")
    with pytest.raises(DataError, match="column 'response_token_ids' must be a list of integer token ids"):
        score_table(table, config, model, source="in.parquet")


def test_score_result_padded_is_trainer_batch_layout():
    """Ragged log-probs -> [B, width] float32, each row from column 0 and -1 after it, as trainer_batch's
    rollout_log_probs; a row over the width is named."""
    from pdsr_sdk.errors import DataValueError
    from pdsr_sdk.scoring import ScoreResult

    rows = [np.array([-0.5, -1.5], np.float32), np.array([-2.0], np.float32), np.array([-0.1, -0.2, -0.3])]
    result = ScoreResult(logps=rows, entropy=[np.ones(len(r), np.float32) for r in rows], stats=None)
    got = result.padded()
    assert got.dtype == np.float32 and got.shape == (3, 3)
    np.testing.assert_allclose(got, [[-0.5, -1.5, -1.0], [-2.0, -1.0, -1.0], [-0.1, -0.2, -0.3]], rtol=1e-6)
    assert result.padded(5, fill=0.0)[1].tolist() == [-2.0, 0.0, 0.0, 0.0, 0.0]
    assert result.padded(4, entropy=True).tolist() == [[1, 1, -1, -1], [1, -1, -1, -1], [1, 1, 1, -1]]
    with pytest.raises(DataValueError, match="sample 2 has 3 tokens, over width=2"):
        result.padded(2)
    with pytest.raises(DataValueError, match="no entropy was computed"):
        ScoreResult(logps=rows, entropy=None, stats=None).padded(entropy=True)
    assert ScoreResult(logps=[], entropy=None, stats=None).padded().shape == (0, 0)
