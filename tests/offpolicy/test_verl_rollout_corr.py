"""importance_weights gives verl's rollout-correction numbers for the same inputs.

verl's semantics (``verl/trainer/ppo/rollout_corr_helper.py``, read at commit b178a3cd56f5, January 2026, and
at 518bada21's parent, before its December 2025 refactor), written here as float64 formulas:

- IS weights (``compute_rollout_correction_weights``, ``rollout_is`` token / sequence): the log-ratio
  ``old_log_prob - rollout_log_prob`` (per token, or summed over the response mask) clamped to +-20,
  exponentiated, times the mask, truncated above at ``rollout_is_threshold``: TIS.
- Rejection before the refactor (``rollout_rs`` token / sequence / geometric with ``rollout_rs_threshold``
  and ``rollout_rs_threshold_lower``, default its reciprocal): keep where lower <= ratio <= upper.
- Rejection after it (``rollout_rs`` token_k1 / seq_sum_k1 / seq_mean_k1 with ``"lower_upper"``): keep where
  log(lower) <= -log-ratio <= log(upper), i.e. lower <= 1 / ratio <= upper; the same for a symmetric pair
  (upper's reciprocal as lower, the default), the reciprocal pair of pdsr's ``lower``/``upper`` otherwise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdsr_sdk.offpolicy import importance_weights

torch = pytest.importorskip("torch")


def verl_is_weights(lp_train, lp_rollout, mask, level, threshold):
    log_ratio = np.asarray(lp_train, np.float64) - np.asarray(lp_rollout, np.float64)
    m = np.asarray(mask, np.float64)
    if level == "sequence":
        log_ratio = np.broadcast_to((log_ratio * m).sum(-1, keepdims=True), log_ratio.shape)
    return np.minimum(np.exp(np.clip(log_ratio, -20, 20)) * m, threshold)


def verl_level_ratio(lp_train, lp_rollout, mask, level):
    """exp of the clamped log-ratio per token, or per sequence: summed ("sequence") or averaged over the mask
    ("geometric", verl's masked_mean: count + 1e-8)."""
    log_ratio = np.asarray(lp_train, np.float64) - np.asarray(lp_rollout, np.float64)
    m = np.asarray(mask, np.float64)
    if level == "sequence":
        log_ratio = np.broadcast_to((log_ratio * m).sum(-1, keepdims=True), log_ratio.shape)
    elif level == "geometric":
        log_ratio = np.broadcast_to((log_ratio * m).sum(-1, keepdims=True) / (m.sum(-1, keepdims=True) + 1e-8),
                                    log_ratio.shape)
    return np.exp(np.clip(log_ratio, -20, 20))


def verl_old_rs_keep(lp_train, lp_rollout, mask, level, upper, lower=None):
    lower = 1 / upper if lower is None else lower
    ratio = verl_level_ratio(lp_train, lp_rollout, mask, level)
    return (np.asarray(mask) != 0) & (ratio >= lower) & (ratio <= upper)


def verl_k1_keep(lp_train, lp_rollout, mask, option, lower, upper):
    k1 = -np.clip(np.asarray(lp_train, np.float64) - np.asarray(lp_rollout, np.float64), -20, 20)
    m = np.asarray(mask, np.float64)
    if option == "seq_sum_k1":
        k1 = np.broadcast_to((k1 * m).sum(-1, keepdims=True), k1.shape)
    elif option == "seq_mean_k1":
        k1 = np.broadcast_to((k1 * m).sum(-1, keepdims=True) / (m.sum(-1) + 1e-8)[:, None], k1.shape)
    return (m != 0) & (k1 >= math.log(lower)) & (k1 <= math.log(upper))


# --------------------------------------------------------------------------- hand-computed cases

def test_tis_and_mis_hand_case():
    # ratios 3, 0.6, 1 on the valid tokens; the last token is masked (its log-prob must not matter)
    lp_t = np.log([[3.0, 0.6, 1.0, 50.0]])
    lp_r = np.zeros((1, 4))
    mask = np.array([[1, 1, 1, 0]])
    w, keep = importance_weights(lp_t, lp_r, mask, level="token", mode="truncate", upper=2.0)
    np.testing.assert_allclose(w, [[2.0, 0.6, 1.0, 0.0]], rtol=1e-12)      # min(ratio, 2), 0 off the mask
    assert keep.tolist() == [[True, True, True, False]]
    w, _ = importance_weights(lp_t, lp_r, mask, level="sequence", mode="truncate", upper=2.0)
    np.testing.assert_allclose(w, [[1.8, 1.8, 1.8, 0.0]], rtol=1e-12)      # 3 * 0.6 * 1 = 1.8 < 2
    w, _ = importance_weights(lp_t, lp_r, mask, level="sequence", mode="truncate", upper=1.5)
    np.testing.assert_allclose(w, [[1.5, 1.5, 1.5, 0.0]], rtol=1e-12)
    w, keep = importance_weights(lp_t, lp_r, mask, level="token", mode="mask", upper=2.0)   # keep 1/2..2
    assert keep.tolist() == [[False, True, True, False]]
    np.testing.assert_allclose(w, [[0.0, 0.6, 1.0, 0.0]], rtol=1e-12)
    w, keep = importance_weights(lp_t, lp_r, mask, level="geometric", mode="mask", upper=1.2)
    assert keep.tolist() == [[False, False, False, False]]                 # 1.8 ** (1/3) = 1.216 > 1.2
    w, keep = importance_weights(lp_t, lp_r, mask, level="geometric", mode="mask", upper=1.25)
    np.testing.assert_allclose(w, [[1.8 ** (1 / 3)] * 3 + [0.0]], rtol=1e-12)


def test_verl_k1_bounds_are_on_the_inverse_ratio_hand_case():
    """verl's token_k1 with "0.7_1.5" keeps 0.7 <= 1 / ratio <= 1.5: ratio 1.45 (1/1.45 = 0.69) is rejected and
    0.68 (1/0.68 = 1.47) kept, the opposite of lower=0.7, upper=1.5 here; lower=1/1.5, upper=1/0.7 is verl's."""
    lp_t = np.log([[1.45, 0.68, 1.0]])
    lp_r = np.zeros((1, 3))
    mask = np.ones((1, 3))
    assert verl_k1_keep(lp_t, lp_r, mask, "token_k1", 0.7, 1.5).tolist() == [[False, True, True]]
    _, keep = importance_weights(lp_t, lp_r, mask, level="token", mode="mask", lower=1 / 1.5, upper=1 / 0.7)
    assert keep.tolist() == [[False, True, True]]
    _, keep = importance_weights(lp_t, lp_r, mask, level="token", mode="mask", lower=0.7, upper=1.5)
    assert keep.tolist() == [[True, False, True]]                          # ratio bounds: verl's older reading


# --------------------------------------------------------------------------- random masked cases

#: (token noise, spread of a row's offset) per level: ratios on both sides of the bounds at each level
SPREADS = {"token": (0.4, 0.0), "sequence": (0.01, 0.02), "geometric": (0.3, 0.4)}


def random_logprobs(seed, level, rows=16, steps=30):
    rng = np.random.default_rng(seed)
    noise, offset = SPREADS[level]
    lp_r = -rng.exponential(1.0, (rows, steps))
    offsets = rng.permutation(np.linspace(-2 * offset, 2 * offset, rows))[:, None]   # rows near 1 and far off
    lp_t = lp_r + rng.standard_normal((rows, steps)) * noise + offsets
    mask = rng.random((rows, steps)) < 0.75
    mask[0] = False                                                        # a row with no valid token
    mask[1, 10:] = False
    lp_t[~mask] = 30.0                                                     # off the mask: never matters
    return lp_t, lp_r, mask


@pytest.mark.parametrize("as_torch", [False, True])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [1.2, 2.0, 10.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_tis_matches_verl_rollout_is(as_torch, level, threshold, seed):
    lp_t, lp_r, mask = random_logprobs(seed, level)
    args = (lp_t, lp_r, mask) if not as_torch else tuple(torch.from_numpy(a) for a in (lp_t, lp_r, mask))
    w, keep = importance_weights(*args, level=level, mode="truncate", upper=threshold)
    w, keep = np.asarray(w), np.asarray(keep)
    np.testing.assert_allclose(w, verl_is_weights(lp_t, lp_r, mask, level, threshold), rtol=1e-12, atol=1e-15)
    assert np.array_equal(keep, mask)
    if level == "sequence" and seed == 0 and threshold == 2.0:
        assert 0 < (w[mask] == threshold).mean() < 1                       # both sides of the truncation seen


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("upper, lower", [(2.0, None), (1.5, 0.8), (1.1, 0.9)])
@pytest.mark.parametrize("seed", [0, 1])
def test_mis_matches_verl_rejection_before_its_refactor(level, upper, lower, seed):
    lp_t, lp_r, mask = random_logprobs(seed, level)
    w, keep = importance_weights(lp_t, lp_r, mask, level=level, mode="mask", upper=upper, lower=lower)
    ref_keep = verl_old_rs_keep(lp_t, lp_r, mask, level, upper, lower)
    assert np.array_equal(keep, ref_keep)
    assert ref_keep.any() and (ref_keep != mask).any()                    # both outcomes occur
    # a kept token's weight is its (level's) ratio: verl's IS weight truncated at the same upper (Seq-MIS is
    # rollout_is="sequence" + rejection), times the rejection mask
    np.testing.assert_allclose(w[keep], verl_level_ratio(lp_t, lp_r, mask, level)[keep], rtol=1e-9)   # count + 1e-8
    if level != "geometric":                                               # verl has no geometric IS weight
        np.testing.assert_allclose(w, verl_is_weights(lp_t, lp_r, mask, level, upper) * ref_keep, rtol=1e-12)
    assert np.all(w[~keep] == 0.0)


@pytest.mark.parametrize("option, level", [("token_k1", "token"), ("seq_sum_k1", "sequence"),
                                           ("seq_mean_k1", "geometric")])
@pytest.mark.parametrize("lower, upper", [(0.5, 2.0), (0.7, 1.5), (0.9, 1.3)])
@pytest.mark.parametrize("seed", [0, 1])
def test_mis_with_reciprocal_bounds_matches_verl_k1_rejection(option, level, lower, upper, seed):
    """verl's current "lower_upper" k1 options: pdsr's mask mode with lower=1/upper, upper=1/lower."""
    lp_t, lp_r, mask = random_logprobs(seed, level)
    _, keep = importance_weights(lp_t, lp_r, mask, level=level, mode="mask", lower=1 / upper, upper=1 / lower)
    ref = verl_k1_keep(lp_t, lp_r, mask, option, lower, upper)
    assert np.array_equal(keep, ref)
    assert ref.any() and (ref != mask).any()                              # both outcomes occur
