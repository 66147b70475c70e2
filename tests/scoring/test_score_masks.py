"""per_token_logps on a trainer's padded batch: ``prompt_mask`` / ``completion_mask`` drop each row's padding, and
``ScoreResult.padded()`` puts the log-probs back at the mask's positions. The reference is the unpadded ragged call
on the same samples (the same rows reach the same micro-batches, so the numbers are equal, not close); each bad
mask is an error naming the mask and the row."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tiny_scoring import random_samples  # noqa: E402

from pdsr_sdk.dispatch.types import Group, Sample, SegmentRecord, TurnRecord  # noqa: E402
from pdsr_sdk.errors import DataValueError  # noqa: E402
from pdsr_sdk.rollout.padded import trainer_batch  # noqa: E402
from pdsr_sdk.scoring import per_token_logps  # noqa: E402

PAD = 977   # a real token of the tiny model's vocabulary: scored as one, unless masked


def pad_batch(prompts, completions, pad=PAD):
    """Prompts left-padded to [B, P], completions right-padded to [B, R] and their 0/1 masks, as a trainer holds
    them, built a row at a time."""
    p, r = max(map(len, prompts)), max(map(len, completions))
    ids_p = [[pad] * (p - len(x)) + list(x) for x in prompts]
    mask_p = [[0] * (p - len(x)) + [1] * len(x) for x in prompts]
    ids_c = [list(x) + [pad] * (r - len(x)) for x in completions]
    mask_c = [[1] * len(x) + [0] * (r - len(x)) for x in completions]
    return ids_p, mask_p, ids_c, mask_c


@pytest.fixture(scope="module")
def rows():
    prompts, completions = random_samples(5, 7, max_prompt=20, max_completion=30)
    completions[3] = []   # a failed sample: no response tokens, an all-0 completion row
    assert len(set(map(len, prompts))) > 2 and len(set(map(len, completions))) > 2
    return prompts, completions


@pytest.fixture(scope="module")
def reference(model, rows):
    return per_token_logps(model, *rows, entropy=True, mbs=3)


@pytest.mark.parametrize("kind", ["torch", "numpy-bool", "lists"])
def test_masked_padded_batch_scores_as_the_ragged_rows(model, rows, reference, kind):
    ids_p, mask_p, ids_c, mask_c = pad_batch(*rows)
    if kind == "torch":
        ids_p, mask_p, ids_c, mask_c = (torch.tensor(x) for x in (ids_p, mask_p, ids_c, mask_c))
    elif kind == "numpy-bool":
        # padding ids outside the vocabulary: dropped before the vocabulary check
        ids_p, ids_c = (np.where(np.array(m) == 1, np.array(x), -1) for x, m in ((ids_p, mask_p), (ids_c, mask_c)))
        mask_p, mask_c = np.array(mask_p, bool), np.array(mask_c, bool)
    got = per_token_logps(model, ids_p, ids_c, prompt_mask=mask_p, completion_mask=mask_c, entropy=True, mbs=3)
    assert [len(x) for x in got.logps] == [len(c) for c in rows[1]]
    for a, b in zip(got.logps + got.entropy, reference.logps + reference.entropy):
        assert a.dtype == np.float32 and np.array_equal(a, b)
    assert got.stats.real_tokens == reference.stats.real_tokens
    assert got.completion_width == max(map(len, rows[1])) and reference.completion_width is None


def test_without_masks_the_padding_is_scored(model, rows, reference):
    """The trap the masks close: the padded ids alone are B rows of P and R tokens, padding and all."""
    ids_p, _, ids_c, _ = pad_batch(*rows)
    plain = per_token_logps(model, ids_p, ids_c, mbs=3)
    assert [len(x) for x in plain.logps] == [len(ids_c[0])] * len(ids_c)
    short = next(i for i, p in enumerate(rows[0]) if len(p) < len(ids_p[0]))   # a left-padded prompt
    k = len(rows[1][short])
    assert np.abs(plain.logps[short][:k] - reference.logps[short]).max() > 0.01


def test_padded_places_the_rows_at_the_mask(model, rows, reference):
    ids_p, mask_p, ids_c, mask_c = (torch.tensor(x) for x in pad_batch(*rows))
    got = per_token_logps(model, ids_p, ids_c, prompt_mask=mask_p, completion_mask=mask_c, entropy=True, mbs=3)
    mask = mask_c.numpy().astype(bool)
    for fill in (-1.0, 0.0):
        for entropy, want in ((False, reference.logps), (True, reference.entropy)):
            out = got.padded(fill=fill, entropy=entropy)
            assert out.dtype == np.float32 and out.shape == tuple(mask_c.shape)
            assert np.array_equal(out[mask], np.concatenate(want))
            assert np.all(out[~mask] == fill)
    # rows wider than the longest completion: the mask's width R is the default
    wide = torch.cat([mask_c, torch.zeros(len(mask_c), 4, dtype=mask_c.dtype)], 1)
    ids_wide = torch.cat([ids_c, torch.full((len(ids_c), 4), PAD)], 1)
    res = per_token_logps(model, ids_p, ids_wide, prompt_mask=mask_p, completion_mask=wide, mbs=3)
    assert res.padded().shape == tuple(wide.shape)
    assert np.array_equal(res.padded()[:, :-4], got.padded())


def sample(pid, prompt, tokens, mask=None):
    g = Group(prompt_id=pid, prompt_token_ids=list(prompt), prompt_text="", n=1)
    s = Sample(group=g, index=0, max_tokens=64, token_ids=list(tokens), logprobs=[-0.5] * len(tokens),
               finish_reason="stop", response_mask=mask)
    s.segments = [SegmentRecord(pool="fast", engine="fast-0", start_token=0, num_tokens=len(tokens),
                                policy_version=0)]
    g.samples = [s]
    return s


def test_trainer_batch_round_trips(model):
    """trainer_batch's own tensors, masked with its attention_mask, score as docs/sdk-batch.md scores the samples'
    own lists; its response_mask (0 on a multi-turn response's environment tokens) is refused, naming the row."""
    rng = np.random.default_rng(3)
    samples = [sample(f"p{i}", rng.integers(5, 1000, int(rng.integers(1, 12))).tolist(),
                      rng.integers(5, 1000, int(rng.integers(1, 16))).tolist()) for i in range(5)]
    samples.append(sample("turns", [8, 9], [13, 14, 15, 16], mask=[1, 0, 0, 1]))
    samples[-1].turns = [TurnRecord(role=role, start_token=a, num_tokens=n) for role, a, n in
                         (("assistant", 0, 1), ("environment", 1, 2), ("assistant", 3, 1))]
    temperature = 0.7
    # the reference: docs/sdk-batch.md's block on the samples' own lists
    b = trainer_batch(samples, pad_token_id=0)
    scores = per_token_logps(model, [list(s.group.prompt_token_ids) for s in samples],
                             [list(s.token_ids) for s in samples], backend="torch", temperature=temperature)
    want = torch.from_numpy(scores.padded(b.tensors["responses"].shape[1]))

    t, p = b.tensors, b.tensors["prompts"].shape[1]
    got = per_token_logps(model, t["prompts"], t["responses"], prompt_mask=t["attention_mask"][:, :p],
                          completion_mask=t["attention_mask"][:, p:], backend="torch", temperature=temperature)
    assert torch.equal(torch.from_numpy(got.padded()), want)
    assert torch.all(torch.from_numpy(got.padded())[t["attention_mask"][:, p:] == 0] == -1)
    with pytest.raises(DataValueError, match=r"completion_mask row 5 is not right padding: .* columns 0, 3 .*"
                                             r"pass attention_mask\[:, P:\]"):
        per_token_logps(model, t["prompts"], t["responses"], prompt_mask=t["attention_mask"][:, :p],
                        completion_mask=t["response_mask"])


BAD = [
    # (prompt ids, prompt mask, completion ids, completion mask, message)
    (np.array([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1], [1, 1]]), [[1], [2]], None,
     r"^prompt_mask has shape \[2, 2\] but prompt_ids has \[2, 3\]: a mask has one entry per token id$"),
    ([[5, 6], [7, 8, 9]], None, [[1, 2], [3, 4, 5, 6]], [[1, 1], [1, 1, 0]],
     r"^completion_mask row 1 has 3 entries but completion_ids row 1 has 4 token ids"),
    ([[5, 6], [7, 8]], [[1, 1]], [[1], [2]], None, r"^prompt_mask has 1 rows but prompt_ids has 2$"),
    ([[5, 6], [0, 0]], [[1, 1], [0, 0]], [[1], [2]], None,
     r"^prompt_mask row 1 has no real token \(all 0\)"),
    ([[5, 6], [7, 0]], [[1, 1], [1, 0]], [[1], [2]], None,
     r"^prompt_mask row 1 is not left padding: .* this row's are at columns 0$"),
    ([[5], [7]], None, [[1, 0, 3, 0], [2, 2, 2, 2]], [[1, 0, 1, 0], [1, 1, 1, 1]],
     r"^completion_mask row 0 is not right padding: .* columns 0, 2 \(a loss mask"),
    ([[5, 6], [7, 8]], [[1, 2], [1, 1]], [[1], [2]], None,
     r"^prompt_mask row 0, column 1: 2 is not a mask value \(1 or True: a real token, 0 or False: padding\)$"),
    ([[5, 6], [7, 8]], np.array([1, 1]), [[1], [2]], None, r"^prompt_mask: expected a 2-D mask \[rows, tokens\]"),
    ([[5, 6], [7, 8]], [["a", "b"], [1, 1]], [[1], [2]], None, r"^prompt_mask row 0: expected 0/1 or True/False"),
]


@pytest.mark.parametrize("prompts,prompt_mask,completions,completion_mask,message", BAD)
def test_a_bad_mask_is_named(tiny_model_dir, prompts, prompt_mask, completions, completion_mask, message):
    with pytest.raises(DataValueError, match=message) as caught:
        per_token_logps(tiny_model_dir, prompts, completions, prompt_mask=prompt_mask,
                        completion_mask=completion_mask)
    assert isinstance(caught.value, ValueError)


def test_a_ragged_batch_with_masks_of_its_lengths(model, rows, reference):
    """A mask also applies to ragged rows, when each mask row is as long as its ids."""
    prompts = [[PAD, PAD] + list(p) for p in rows[0]]
    masks = [[0, 0] + [1] * len(p) for p in rows[0]]
    got = per_token_logps(model, prompts, rows[1], prompt_mask=masks, entropy=True, mbs=3)
    assert all(np.array_equal(a, b) for a, b in zip(got.logps, reference.logps))
    assert got.completion_width is None
