"""pdsr_sdk.scoring: the torch backend on the tiny model (fixtures in conftest.py; the kernel and plans in
test_score_kernel.py, errors and tables in test_scoring_errors.py).

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
import pytest

torch = pytest.importorskip("torch")

from tiny_scoring import max_diff, naive_logps, random_samples  # noqa: E402

from pdsr_sdk.errors import ConfigError  # noqa: E402
from pdsr_sdk.scoring import per_token_logps  # noqa: E402
from pdsr_sdk.scoring.buckets import plan_fixed, plan_packed, plan_token_quota  # noqa: E402



def test_unbatched_matches_naive(unbatched, naive, samples):
    res = unbatched
    assert [len(x) for x in res.logps] == [len(c) for c in samples[1]]
    assert all(x.dtype == np.float32 for x in res.logps)
    assert max_diff(res.logps, naive) <= 1e-5
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
    assert max_diff(res.logps, unbatched.logps) <= 1e-6
    assert max_diff(res.logps, naive) <= 1e-5


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
    assert max_diff(res.logps, unbatched.logps) <= 1e-5
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
    assert max_diff(res.logps, padded.logps) <= 1e-5
    assert max_diff(res.entropy, padded.entropy) <= 1e-5
    assert [len(e) for e in res.entropy] == [len(c) for c in sub[1]]
    assert res.stats.mode == "packed, mbs=4" and res.stats.micro_batches == 3
    assert res.stats.computed_tokens == res.stats.real_tokens


def test_packed_forward_really_separates_samples(model, monkeypatch):
    """The packed forward is one row with restarting position ids and no mask; without the restart the
    samples would see each other and the log-probs change (so the agreement above is not vacuous)."""
    from pdsr_sdk.scoring import hf_model, packed
    from pdsr_sdk.scoring.buckets import MicroBatch
    from pdsr_sdk.scoring.varlen_attention import packed_attention

    prompts, completions = random_samples(3, 4, max_completion=30)
    seqs = [np.asarray(p + c) for p, c in zip(prompts, completions)]
    plens = np.array([len(p) for p in prompts])
    mb = MicroBatch((2, 0, 3), 1, int(sum(len(seqs[i]) for i in (2, 0, 3))))
    ids, pos_ids, pos, sizes = packed.packed_inputs(mb, seqs, plens)
    assert ids.shape == (1, mb.seq_len) and sizes == [len(completions[i]) for i in (2, 0, 3)]
    assert pos_ids[0, len(seqs[2])] == 0 and pos_ids[0, -1] == len(seqs[3]) - 1
    parts = hf_model.find_parts(model, seqs[0][:8])
    got, _ = packed.score_packed_micro_batch(model, parts, mb, seqs, plens, temperature=1.0, row_chunk=64,
                                             return_entropy=False)
    ref = naive_logps(model, [prompts[i] for i in (2, 0, 3)], [completions[i] for i in (2, 0, 3)])
    assert max_diff(got, ref) <= 1e-5
    with packed_attention(model):     # the sample bounds passed as keywords, each sample's attention its own
        got_varlen, _ = packed.score_packed_micro_batch(model, parts, mb, seqs, plens, temperature=1.0,
                                                        row_chunk=64, return_entropy=False, varlen=True)
    assert max_diff(got_varlen, ref) <= 1e-5
    monkeypatch.setattr(packed, "packed_inputs",
                        lambda *a: (ids, np.arange(ids.shape[1])[None, :], pos, sizes))   # one long sequence
    leaked, _ = packed.score_packed_micro_batch(model, parts, mb, seqs, plens, temperature=1.0,
                                                row_chunk=64, return_entropy=False)
    assert max_diff(leaked[1:], ref[1:]) > 1e-3


def test_pack_default_rule_and_model_check(model, monkeypatch):
    from pdsr_sdk.scoring import packed

    assert packed.resolve_pack(True, "cpu") and not packed.resolve_pack(False, "cuda")
    for key, faster in packed.PACK_MEASURED_FASTER.items():
        assert packed.resolve_pack(None, key[1], key[0]) == faster
    assert not packed.resolve_pack(None, "mps")
    prompts, completions = random_samples(5, 3, max_completion=20)
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
    assert max_diff(res.logps, naive_logps(model, prompts, completions)) <= 1e-5
    assert all(mb <= 640 for mb in (r * t for r, t in res.stats.shapes))


@pytest.mark.parametrize("temperature,modes", [
    (1.0, [{}, dict(mbs=4), dict(max_tokens_per_micro_batch=512)]),
    (0.7, [dict(mbs=5)]),
    (1.5, [dict(max_tokens_per_micro_batch=400)]),
])
def test_entropy_and_temperature_match_naive(model, samples, naive, temperature, modes):
    ref, ref_entropy = naive_logps(model, *samples, temperature=temperature, entropy=True)
    for kwargs in modes:
        res = per_token_logps(model, *samples, temperature=temperature, return_entropy=True, row_chunk=50, **kwargs)
        assert max_diff(res.logps, ref) <= 1e-5
        assert max_diff(res.entropy, ref_entropy) <= 1e-5
        assert [len(e) for e in res.entropy] == [len(c) for c in samples[1]]
    if temperature != 1.0:  # the temperature really changes the numbers
        assert max_diff(ref, naive) > 1e-2


def test_accepts_numpy_and_tensor_rows(model, samples, unbatched):
    prompts = [np.asarray(p, dtype=np.int32) for p in samples[0]]
    completions = [torch.tensor(c) for c in samples[1]]
    res = per_token_logps(model, prompts, completions, mbs=8)
    assert max_diff(res.logps, unbatched.logps) <= 1e-6


def test_model_directory_argument_and_bf16(tiny_model_dir, samples, unbatched):
    res = per_token_logps(tiny_model_dir, *samples, device="cpu", dtype="float32", mbs=16)
    assert max_diff(res.logps, unbatched.logps) <= 1e-6
    bf16 = per_token_logps(tiny_model_dir, *samples, device="cpu", dtype="bfloat16", mbs=16)
    assert all(x.dtype == np.float32 for x in bf16.logps)
    from pdsr_sdk.scoring.torch_backend import load_model

    naive_bf16 = naive_logps(load_model(tiny_model_dir, "cpu", "bfloat16"), *samples)
    bf16_error = max_diff(naive_bf16, unbatched.logps)  # what bf16 itself costs, unpadded
    assert bf16_error > 0
    # padding/micro-batching noise in bf16 stays below bf16's own error
    assert max_diff(bf16.logps, naive_bf16) <= bf16_error


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
    assert max_diff(res.logps, naive_logps(wrapped, *samples)) <= 1e-5
    assert max_diff(res.logps, naive) > 1e-2  # the post-processing was applied


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


def test_a_model_in_train_mode_is_scored_without_dropout_and_keeps_its_modes(tiny_model_dir, samples):
    """A trainer's model is in train mode between its optimizer steps; scoring it there for the old policy's
    log-probs ran dropout: two calls on the same weights differed by 4.07 (attention dropout 0.5). The forward now
    runs in eval mode, and each module's mode is as it was after (a frozen part the trainer put in eval stays)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32, attention_dropout=0.5)
    model.eval()
    reference = naive_logps(model, *samples)   # an unbatched forward per sample, dropout off
    model.train()
    model.model.embed_tokens.eval()
    for _ in range(2):
        got = per_token_logps(model, *samples, mbs=8)
        assert max_diff(got.logps, reference) <= 1e-5
    assert model.training and model.model.layers[0].self_attn.training and not model.model.embed_tokens.training
