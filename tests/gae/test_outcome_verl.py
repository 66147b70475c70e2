"""pdsr's RLOO, REINFORCE++ and REINFORCE++-baseline advantages give verl's numbers for the same inputs.

verl's semantics (``verl/trainer/ppo/core_algos.py``: ``compute_rloo_outcome_advantage``,
``compute_rloo_vectorized_outcome_advantage``, ``compute_reinforce_plus_plus_outcome_advantage``,
``compute_reinforce_plus_plus_baseline_outcome_advantage``; ``verl/utils/torch_functional.py``:
``masked_whiten``; read at verl-project/verl 1dda039b9c63, August 2026, which has PR #7300's REINFORCE++ over
masked spans) are written here as float64 formulas, stated differently from pdsr's code: RLOO as the mean of
the other samples, REINFORCE++'s return as a sum over the valid tokens from t on. Tiny cases first, with the
expected numbers worked out by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pdsr_sdk.errors import ConfigValueError, DataValueError  # noqa: E402
from pdsr_sdk.gae import (compute_gae, grpo_advantages, reinforce_pp_advantages, reinforce_pp_baseline_advantages,  # noqa: E402
                          rloo_advantages)


# --------------------------------------------------------------------------- verl's formulas, in float64

def verl_rloo(scores, ids, vectorized=False):
    """A sample's score less the mean score of the others of its group; alone, it keeps its score (``rloo``) or
    gets 0 (``rloo_vectorized``)."""
    out = []
    for i, s in enumerate(scores):
        others = [scores[j] for j in range(len(ids)) if ids[j] == ids[i] and j != i]
        out.append((0.0 if vectorized else s) if not others else s - sum(others) / len(others))
    return np.array(out, np.float64)


def verl_whiten_valid(x, mask):
    """verl's masked_whiten of x over the valid tokens (sums divided by count + 1e-8, Bessel's correction),
    then zeroed on masked tokens."""
    m = np.asarray(mask) != 0
    n = m.sum()
    mean = x[m].sum() / (n + 1e-8)
    var = ((x[m] - mean) ** 2).sum() / (n + 1e-8) * n / (n - 1)
    return np.where(m, (x - mean) / math.sqrt(var + 1e-8), 0.0)


def verl_reinforce_pp(token_rewards, mask, gamma):
    """On a valid token t, G_t = sum of gamma^k r_j over the valid tokens j from t on, k the number of valid
    tokens from t to j less one (masked tokens neither discount nor add); 0 on masked tokens. Advantages: G
    whitened over the valid tokens."""
    r, m = np.asarray(token_rewards, np.float64), np.asarray(mask) != 0
    returns = np.zeros_like(r)
    for row in range(r.shape[0]):
        idx = np.flatnonzero(m[row])
        for k, t in enumerate(idx):
            returns[row, t] = sum(gamma ** i * r[row, j] for i, j in enumerate(idx[k:]))
    return verl_whiten_valid(returns, m), returns


def verl_reinforce_pp_baseline(scores, ids, mask):
    """The score less its group's mean (0 for a group of one) on each valid token, whitened over the valid
    tokens."""
    centered = []
    for i, s in enumerate(scores):
        group = [scores[j] for j in range(len(ids)) if ids[j] == ids[i]]
        centered.append(s - (sum(group) / len(group) if len(group) > 1 else 0.0))
    return verl_whiten_valid(np.array(centered)[:, None] * (np.asarray(mask) != 0), mask)


# --------------------------------------------------------------------------- hand-computed cases

MASK = np.array([[1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 0, 0]], dtype=bool)


def test_rloo_hand_case():
    # group a: 1, 0, 0: 1 - mean(0, 0) = 1, 0 - mean(1, 0) = -0.5 twice (GRPO's r - mean would be 2/3, -1/3);
    # group b: one sample of 2; group c: 3, 3 (no spread)
    rewards = np.array([1.0, 0.0, 0.0, 2.0, 3.0, 3.0])
    ids = ["a", "a", "a", "b", "c", "c"]
    np.testing.assert_allclose(rloo_advantages(rewards, ids), [1.0, -0.5, -0.5, 0.0, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(rloo_advantages(rewards, ids, singleton="score"), [1.0, -0.5, -0.5, 2.0, 0.0, 0.0],
                               atol=1e-15)
    np.testing.assert_allclose(verl_rloo(rewards, ids), [1.0, -0.5, -0.5, 2.0, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(verl_rloo(rewards, ids, vectorized=True), [1.0, -0.5, -0.5, 0.0, 0.0, 0.0],
                               atol=1e-15)


def test_reinforce_pp_hand_case():
    # gamma 0.5; rewards 1, 2, 0 on each row's last valid token (t = 2, 3, 1).
    # row 0: G = 0.25, 0.5, 1 on the valid tokens, 0 on the padding.
    # row 1: G_3 = 2, G_2 = 1; t = 1 is masked: 0, and the return passes it unchanged, so G_0 = 0.5 G_2 = 0.5
    # (verl before its PR #7300 reset the return there, G_0 = 0). row 2: all 0.
    # Valid returns 0.25, 0.5, 1, 0.5, 1, 2, 0, 0: sum 5.25, mean 21/32, sum of squares 6.5625,
    # squared deviations 6.5625 - 8 (21/32)^2 = 399/128, unbiased variance 57/128.
    returns = np.array([[0.25, 0.5, 1.0, 0.0], [0.5, 0.0, 1.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    expected = np.where(MASK, (returns - 21 / 32) / math.sqrt(57 / 128 + 1e-8), 0.0)
    adv, ret = reinforce_pp_advantages(np.array([1.0, 2.0, 0.0]), MASK, gamma=0.5)
    np.testing.assert_allclose(ret, returns, atol=1e-15)
    np.testing.assert_allclose(adv, expected, rtol=1e-12, atol=1e-15)
    ref_adv, ref_ret = verl_reinforce_pp(np.where(MASK & (np.arange(4) == [[2], [3], [1]]), [[1.0], [2.0], [0.0]],
                                                  0.0), MASK, 0.5)
    np.testing.assert_allclose(ref_ret, returns, atol=1e-15)          # the formula agrees with the hand
    np.testing.assert_allclose(ref_adv, expected, rtol=1e-7, atol=1e-7)


def test_reinforce_pp_baseline_hand_case():
    # rewards 1, 0 (group 0), 2 (alone in group 1); valid tokens 3, 3, 2.
    # "score" (verl): 0.5 x 3 tokens, -0.5 x 3, 2 x 2: mean 4/8 = 1/2 (token-weighted; a mean over samples
    # would be 2/3), sum of squares 9.5, squared deviations 9.5 - 8 (1/2)^2 = 7.5, unbiased variance 15/14.
    # "zero" (default): the sample alone gets 0: 0.5 x 3, -0.5 x 3, 0 x 2: mean 0, variance 1.5/7.
    rewards, ids = np.array([1.0, 0.0, 2.0]), [0, 0, 1]
    centered = np.array([[0.5], [-0.5], [2.0]])
    expected = np.where(MASK, (centered - 0.5) / math.sqrt(15 / 14 + 1e-8), 0.0)
    got = reinforce_pp_baseline_advantages(rewards, ids, MASK, singleton="score")
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(verl_reinforce_pp_baseline(rewards, ids, MASK), expected, rtol=1e-7, atol=1e-7)
    centered[2] = 0.0
    np.testing.assert_allclose(reinforce_pp_baseline_advantages(rewards, ids, MASK),
                               np.where(MASK, centered / math.sqrt(1.5 / 7 + 1e-8), 0.0), rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------------- random cases

SIZES = [4, 1, 8, 2, 1, 5, 3]


def random_groups(seed):
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(len(SIZES)), SIZES)
    rng.shuffle(ids)
    scores = np.where(rng.random(ids.size) < 0.5, 1.0, 0.0) + rng.standard_normal(ids.size) * 0.1
    scores[ids == 2] = 0.5                                        # a group with no spread
    return rng, scores, ids


def random_mask(rng, rows, steps=30):
    mask = rng.random((rows, steps)) < 0.7                        # interior masked spans
    mask[0, 12:] = False                                          # right padding
    mask[1] = False                                               # a row with no valid token
    mask[2] = True
    return mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rloo_matches_verl(seed):
    _, scores, ids = random_groups(seed)
    np.testing.assert_allclose(rloo_advantages(scores, ids, singleton="score"), verl_rloo(scores, list(ids)),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rloo_advantages(scores, ids), verl_rloo(scores, list(ids), vectorized=True),
                               rtol=1e-12, atol=1e-12)
    got32 = rloo_advantages(torch.tensor(scores, dtype=torch.float32), torch.from_numpy(ids), singleton="score")
    assert got32.dtype == torch.float32
    np.testing.assert_allclose(got32.numpy(), verl_rloo(scores.astype(np.float32).tolist(), list(ids)),
                               rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_pp_matches_verl_on_random_masks(gamma, seed):
    rng = np.random.default_rng(seed)
    mask = random_mask(rng, 6)
    token = rng.standard_normal(mask.shape) * (rng.random(mask.shape) < 0.3)   # sparse, on masked tokens too
    adv, ret = reinforce_pp_advantages(token, mask, gamma=gamma)
    ref_adv, ref_ret = verl_reinforce_pp(token, mask, gamma)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-7, atol=1e-7)
    # on the valid tokens the returns are GAE's advantages with lambda 1 and values 0 (GAE skips masked tokens)
    gae, _ = compute_gae(token, np.zeros(mask.shape), mask, gamma, 1.0, backend="reference")
    np.testing.assert_allclose(ret[mask], gae[mask], rtol=1e-12, atol=1e-12)
    # float32 tensors in, float32 tensors out; and one reward per sample is the token form on the last valid token
    adv32, ret32 = reinforce_pp_advantages(torch.tensor(token, dtype=torch.float32), torch.from_numpy(mask),
                                           gamma=gamma)
    assert adv32.dtype == ret32.dtype == torch.float32
    np.testing.assert_allclose(adv32.numpy(), ref_adv, rtol=1e-5, atol=1e-5)
    scores = rng.standard_normal(mask.shape[0])
    scores[1] = 0.0                                               # the row with no valid token
    last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)
    placed = np.zeros(mask.shape)
    placed[np.arange(mask.shape[0]), last] = scores
    got_adv, got_ret = reinforce_pp_advantages(scores, mask, gamma=gamma)
    ref_adv, ref_ret = verl_reinforce_pp(placed, mask, gamma)
    np.testing.assert_allclose(got_ret, ref_ret, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_adv, ref_adv, rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_pp_baseline_matches_verl_on_random_masks(seed):
    rng, scores, ids = random_groups(seed)
    mask = random_mask(rng, ids.size)
    ref = verl_reinforce_pp_baseline(scores, list(ids), mask)
    got = reinforce_pp_baseline_advantages(scores, ids, mask, singleton="score")
    np.testing.assert_allclose(got, ref, rtol=1e-7, atol=1e-7)
    # the default: every sample less its group's mean, a sample alone its own (so 0): verl's numbers but for
    # the groups of one
    default = reinforce_pp_baseline_advantages(scores, ids, mask)
    centered = scores - np.array([scores[ids == g].mean() for g in ids])
    np.testing.assert_allclose(default, verl_whiten_valid(centered[:, None] * mask, mask), rtol=1e-7, atol=1e-7)
    alone = np.isin(ids, [g for g, n in enumerate(SIZES) if n == 1])
    assert not np.allclose(default[alone], ref[alone])
    got32 = reinforce_pp_baseline_advantages(torch.tensor(scores, dtype=torch.float32), torch.from_numpy(ids),
                                             torch.from_numpy(mask.astype(np.int64)), singleton="score")
    assert got32.dtype == torch.float32
    np.testing.assert_allclose(got32.numpy(), ref, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- bad inputs

M2 = np.ones((2, 3), bool)
BAD = [
    ("rloo None", lambda: rloo_advantages([1.0, None], [0, 0]), DataValueError,
     r"rewards\[1\] = None.*scores\[i\]\.error"),
    ("rloo ids shape", lambda: rloo_advantages([1.0, 0.0], [0, 0, 0]), DataValueError, r"group_ids has shape \(3,\)"),
    ("rloo ids kinds", lambda: rloo_advantages([1.0, 0.0], [None, "p1"]), DataValueError,
     "group_ids must be ids of one sortable kind"),
    ("grpo ids kinds", lambda: grpo_advantages([1.0, 0.0], [None, "p1"]), DataValueError,
     "group_ids must be ids of one sortable kind"),
    ("rloo singleton", lambda: rloo_advantages([1.0], [0], singleton="keep"), ConfigValueError,
     "singleton: expected one of zero, score, got 'keep'"),
    ("rpp None", lambda: reinforce_pp_advantages([[1.0, None, 0.0], [0.0, 0.0, 0.0]], M2), DataValueError,
     r"rewards\[0, 1\] = None"),
    ("rpp ragged", lambda: reinforce_pp_advantages([[1.0, 0.0], [0.0]], M2), DataValueError,
     r"rewards must be \[N\] .* or \[N, T\] .*rows of one length"),
    ("rpp 3-D", lambda: reinforce_pp_advantages(np.zeros((2, 3, 1)), M2), DataValueError,
     r"rewards must be 1-D or 2-D .*got shape \(2, 3, 1\)"),
    ("rpp shape", lambda: reinforce_pp_advantages(np.zeros((2, 4)), M2), DataValueError,
     r"mask has shape \(2, 3\), expected the shape of rewards \(2, 4\)"),
    ("rpp mask rows", lambda: reinforce_pp_advantages(np.zeros(3), M2), DataValueError,
     r"mask must be 2-D \[N, T\] with N = 3 rows"),
    ("rpp empty mask", lambda: reinforce_pp_advantages(np.zeros(2), np.zeros((2, 3))), DataValueError,
     "mask has 0 valid tokens in all; REINFORCE\\+\\+ whitens .* at least 2"),
    ("rpp lost reward", lambda: reinforce_pp_advantages([1.0, 0.5], [[1, 1, 0], [0, 0, 0]]), DataValueError,
     r"on a mask row with no valid token, nowhere to place them: rewards\[1\] = 0.5"),
    ("rpp gamma", lambda: reinforce_pp_advantages(np.zeros(2), M2, gamma=1.5), ConfigValueError,
     r"gamma: expected a number in \[0, 1\], got 1.5"),
    ("baseline None", lambda: reinforce_pp_baseline_advantages([None, 1.0], [0, 0], M2), DataValueError,
     r"rewards\[0\] = None"),
    ("baseline mask", lambda: reinforce_pp_baseline_advantages([0.0, 1.0], [0, 0], np.ones(2)), DataValueError,
     r"mask must be 2-D \[N, T\]"),
    ("baseline one token", lambda: reinforce_pp_baseline_advantages([0.0, 1.0], [0, 0], [[0, 1], [0, 0]]),
     DataValueError, "mask has 1 valid token in all; REINFORCE\\+\\+-baseline"),
    ("baseline 2-D rewards", lambda: reinforce_pp_baseline_advantages(np.zeros((2, 3)), [0, 0], M2),
     DataValueError, r"rewards must be 1-D \[N\] \(one scalar per sample\)"),
]


@pytest.mark.parametrize("call, kind, match", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_inputs_name_the_argument(call, kind, match):
    with pytest.raises(kind, match=match):
        call()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("estimator", ["grpo", "rloo", "rpp", "rpp_baseline"])
def test_a_non_finite_reward_is_named(estimator, bad):
    rewards, ids, mask = np.array([1.0, bad, 0.0, 1.0]), np.array([0, 0, 1, 1]), np.ones((4, 3))
    call = {"grpo": lambda: grpo_advantages(rewards, ids), "rloo": lambda: rloo_advantages(rewards, ids),
            "rpp": lambda: reinforce_pp_advantages(rewards, mask),
            "rpp_baseline": lambda: reinforce_pp_baseline_advantages(rewards, ids, mask)}[estimator]
    with pytest.raises(DataValueError, match=r"finite.*rewards\[1\] = (nan|-?inf)"):
        call()
