"""pdsr's GAE, GRPO advantages and masked whitening give verl's numbers for the same inputs.

verl's semantics (``verl/trainer/ppo/core_algos.py``: ``compute_gae_advantage_return``,
``compute_grpo_outcome_advantage``; ``verl/utils/torch_functional.py``: ``masked_mean``, ``masked_var``,
``masked_whiten``; read at commit b178a3cd56f5, January 2026) are written here as float64 formulas, stated
differently from pdsr's loops: GAE as plain GAE over a row's valid tokens alone, each masked token taking the
advantage of the next valid one. Tiny cases first, with the expected numbers worked out by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pdsr_sdk.errors import ConfigValueError  # noqa: E402
from pdsr_sdk.gae import compute_gae, grpo_advantages, masked_whiten  # noqa: E402

BACKENDS = ["reference", "numba", "torch"]


# --------------------------------------------------------------------------- verl's formulas, in float64

def verl_gae(rewards, values, mask, gamma, lam):
    """verl's masked GAE: GAE over each row's valid tokens as if the masked ones were not there (bootstrap 0
    after the last); a masked token holds the advantage of the next valid token (0 after the last one);
    returns = advantages + values everywhere, before any whitening."""
    r, v = np.asarray(rewards, np.float64), np.asarray(values, np.float64)
    adv = np.zeros_like(r)
    w = gamma * lam
    for row in range(r.shape[0]):
        idx = np.flatnonzero(np.asarray(mask)[row])
        if idx.size == 0:
            continue
        vv = v[row, idx]
        delta = r[row, idx] + gamma * np.append(vv[1:], 0.0) - vv
        k = np.arange(idx.size)
        ahead = k[None, :] - k[:, None]                         # j - t
        weights = np.where(ahead >= 0, float(w) ** np.maximum(ahead, 0), 0.0)
        a_valid = weights @ delta                               # A_t = sum_{j >= t} (gamma lam)^(j-t) delta_j
        nxt = np.searchsorted(idx, np.arange(r.shape[1]))       # the next valid token at or after each position
        adv[row] = np.where(nxt < idx.size, a_valid[np.minimum(nxt, idx.size - 1)], 0.0)
    return adv, adv + v


def verl_whiten(x, mask, shift_mean=True):
    """verl's masked_whiten: mean and Bessel-corrected variance over the masked-in entries of the whole
    array (sums divided by count + 1e-8, as verl's masked_mean does), every entry transformed."""
    x, m = np.asarray(x, np.float64), (np.asarray(mask) != 0).astype(np.float64)
    n = m.sum()
    mean = (x * m).sum() / (n + 1e-8)
    var = ((x - mean) ** 2 * m).sum() / (n + 1e-8) * n / (n - 1)
    out = (x - mean) / math.sqrt(var + 1e-8)
    return out + mean if not shift_mean else out


def verl_grpo(scores, ids, normalize_std=True, eps=1e-6):
    """verl's GRPO outcome advantage per sample: (r - mean) / (std + eps), std unbiased (torch.std); a group of
    one takes mean 0 and std 1."""
    scores = np.asarray(scores, np.float64)
    out = np.empty_like(scores)
    for i, s in enumerate(scores):
        group = scores[[j for j in range(len(ids)) if ids[j] == ids[i]]]
        if group.size == 1:
            mean, std = 0.0, 1.0
        else:
            mean = group.sum() / group.size
            std = math.sqrt(((group - mean) ** 2).sum() / (group.size - 1))
        out[i] = (s - mean) / (std + eps) if normalize_std else s - mean
    return out


# --------------------------------------------------------------------------- hand-computed cases

# row 0: gamma = lam = 1, three valid tokens, two of padding; row 1: an interior masked token and a masked last one
HAND_R = np.array([[0.0, 0.0, 1.0, 8.0, -3.0], [0.0, 9.0, 0.0, 2.0, 7.0]])
HAND_V = np.array([[0.5, 0.4, 0.3, 4.0, -2.0], [1.0, 5.0, 2.0, 1.0, 3.0]])
HAND_M = np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0]], dtype=bool)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gae_hand_cases(backend):
    # row 0 (gamma = lam = 1): A_t = sum of later rewards - V_t = 1 - V_t on the valid tokens, 0 on the padding.
    # row 1 (gamma = lam = 0.5, w = 0.25), backwards: t=4 masked: A=0, next V stays 0; t=3: delta = 2 - 1 = 1,
    # A=1; t=2: delta = 0 + 0.5*1 - 2 = -1.5, A = -1.5 + 0.25*1 = -1.25; t=1 masked: carries -1.25, next V stays
    # 2 (its reward 9 and value 5 never enter); t=0: delta = 0 + 0.5*2 - 1 = 0, A = 0.25 * -1.25 = -0.3125.
    expected = [np.array([0.5, 0.6, 0.7, 0.0, 0.0]), np.array([-0.3125, -1.25, -1.25, 1.0, 0.0])]
    for row, gamma_lam in enumerate([(1.0, 1.0), (0.5, 0.5)]):
        args = (HAND_R[row:row + 1], HAND_V[row:row + 1], HAND_M[row:row + 1])
        if backend == "torch":
            args = tuple(torch.from_numpy(a) for a in args)
        adv, ret = compute_gae(*args, *gamma_lam, backend=backend)
        np.testing.assert_allclose(np.asarray(adv)[0], expected[row], rtol=0, atol=1e-12)
        np.testing.assert_allclose(np.asarray(ret)[0], expected[row] + HAND_V[row], rtol=0, atol=1e-12)
        ref, _ = verl_gae(HAND_R[row:row + 1], HAND_V[row:row + 1], HAND_M[row:row + 1], *gamma_lam)
        np.testing.assert_allclose(ref[0], expected[row], atol=1e-12)     # the formula agrees with the hand


def test_verl_gae_whitens_its_advantages_masked_whiten_gives_them():
    """verl's compute_gae_advantage_return returns masked_whiten(A, mask) and A + V: pdsr's compute_gae returns
    A; masked_whiten of it is verl's. Row 1's valid advantages -0.3125, -1.25, 1: mean -0.1875, deviations
    -0.125, -1.0625, 1.1875, squares summing to 2.5546875, unbiased variance 2.5546875 / 2 = 1.27734375."""
    adv, ret = compute_gae(HAND_R[1:], HAND_V[1:], HAND_M[1:], 0.5, 0.5, backend="reference")
    white = masked_whiten(adv, HAND_M[1:])
    expected = (np.array([-0.3125, -1.25, -1.25, 1.0, 0.0]) + 0.1875) / math.sqrt(1.27734375 + 1e-8)
    np.testing.assert_allclose(white[0], expected, rtol=1e-12)   # the masked entries are transformed too
    np.testing.assert_allclose(ret[0], [0.6875, 3.75, 0.75, 2.0, 3.0], atol=1e-12)   # returns: before whitening


def test_grpo_hand_case_and_the_singleton_option():
    # group a: 1, 0, 0: mean 1/3, unbiased variance ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3 (the population one, 2/9,
    # would give 1.414 for the first sample); group b: one sample of 2; group c: 3, 3 (no spread).
    rewards = np.array([1.0, 0.0, 0.0, 2.0, 3.0, 3.0])
    ids = ["a", "a", "a", "b", "c", "c"]
    std_a = math.sqrt(1 / 3) + 1e-6
    np.testing.assert_allclose(grpo_advantages(rewards, ids),
                               [2 / 3 / std_a, -1 / 3 / std_a, -1 / 3 / std_a, 0.0, 0.0, 0.0], rtol=1e-12)
    np.testing.assert_allclose(grpo_advantages(rewards, ids, singleton="score"),     # verl's: 2 / (1 + 1e-6)
                               [2 / 3 / std_a, -1 / 3 / std_a, -1 / 3 / std_a, 2 / (1 + 1e-6), 0.0, 0.0], rtol=1e-12)
    # Dr. GRPO (verl's norm_adv_by_std_in_grpo=False): r - mean; a group of one keeps r with singleton="score"
    np.testing.assert_allclose(grpo_advantages(rewards, ids, normalize_std=False),
                               [2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(grpo_advantages(rewards, ids, normalize_std=False, singleton="score"),
                               [2 / 3, -1 / 3, -1 / 3, 2.0, 0.0, 0.0], atol=1e-12)
    assert grpo_advantages(rewards, ids)[0] == pytest.approx(1.1547, abs=1e-4)


def test_masked_whiten_hand_case():
    # masked-in 1, 2, 3, 4: mean 2.5, unbiased variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3 (population: 1.25)
    values = np.array([[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]])
    mask = np.array([[1, 1, 0], [1, 1, 0]])
    scale = math.sqrt(5 / 3 + 1e-8)
    np.testing.assert_allclose(masked_whiten(values, mask), (values - 2.5) / scale, rtol=1e-12)
    np.testing.assert_allclose(masked_whiten(values, mask, shift_mean=False), (values - 2.5) / scale + 2.5,
                               rtol=1e-12)


# --------------------------------------------------------------------------- random masked cases

def random_case(seed, rows=6, steps=40):
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((rows, steps)) * (rng.random((rows, steps)) < 0.3)   # sparse, as token rewards are
    v = rng.standard_normal((rows, steps))
    mask = rng.random((rows, steps)) < 0.7                                       # interior masked spans
    mask[1, 25:] = False                                                         # right padding
    mask[2] = False                                                              # a row with no valid token
    return r, v, mask


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 0.9)])
@pytest.mark.parametrize("seed", [0, 1])
def test_gae_matches_verl_on_random_masks(backend, gamma, lam, seed):
    r, v, mask = random_case(seed)
    args = (r, v, mask) if backend != "torch" else tuple(torch.from_numpy(a) for a in (r, v, mask))
    adv, ret = compute_gae(*args, gamma, lam, backend=backend)
    adv_ref, ret_ref = verl_gae(r, v, mask, gamma, lam)
    np.testing.assert_allclose(np.asarray(adv), adv_ref, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(np.asarray(ret), ret_ref, rtol=1e-9, atol=1e-10)
    # verl's advantages are these whitened (count + 1e-8 there, the exact count here: 1e-8 / count relative)
    np.testing.assert_allclose(masked_whiten(np.asarray(adv), mask), verl_whiten(adv_ref, mask), rtol=1e-7,
                               atol=1e-7)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten_matches_verl_on_random_masks(kind, shift_mean):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 33)) * 4 - 3
    mask = rng.random((5, 33)) < 0.4
    got = masked_whiten(torch.from_numpy(x), torch.from_numpy(mask), shift_mean=shift_mean).numpy() \
        if kind == "torch" else masked_whiten(x, mask, shift_mean=shift_mean)
    np.testing.assert_allclose(got, verl_whiten(x, mask, shift_mean), rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_matches_verl_with_singleton_score(normalize_std, seed):
    rng = np.random.default_rng(seed)
    sizes = [4, 1, 8, 2, 1, 5, 3]
    ids = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(ids)
    scores = np.where(rng.random(ids.size) < 0.5, 1.0, 0.0) + rng.standard_normal(ids.size) * 0.1
    scores[ids == 2] = 0.5                                         # a group with no spread: 0 / (0 + eps)
    ref = verl_grpo(scores, list(ids), normalize_std)
    got = grpo_advantages(scores, ids, normalize_std=normalize_std, singleton="score")
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    # the default differs from verl exactly on the groups of one, which it gives 0
    alone = np.isin(ids, [g for g, n in enumerate(sizes) if n == 1])
    default = grpo_advantages(scores, ids, normalize_std=normalize_std)
    np.testing.assert_allclose(default[~alone], ref[~alone], rtol=1e-12, atol=1e-12)
    assert np.all(default[alone] == 0.0) and np.all(ref[alone] != 0.0)
    # float32 tensors, as verl's token_level_rewards: float32 out, verl's numbers to float32 rounding
    got32 = grpo_advantages(torch.tensor(scores, dtype=torch.float32), torch.from_numpy(ids), singleton="score",
                            normalize_std=normalize_std)
    assert got32.dtype == torch.float32
    np.testing.assert_allclose(got32.numpy(), verl_grpo(scores.astype(np.float32), list(ids), normalize_std),
                               rtol=2e-6, atol=2e-6)


def test_grpo_singleton_option_is_checked():
    with pytest.raises(ConfigValueError, match=r"singleton: expected one of zero, score, got 'raw'"):
        grpo_advantages([1.0, 2.0], [0, 1], singleton="raw")
