"""importance_weights(normalize=True, veto=V) gives verl's ``rollout_is_batch_normalize`` and
``rollout_token_veto_threshold`` numbers (``verl/trainer/ppo/rollout_corr_helper.py`` read at 0b4e2a81, 2026),
written here as float64 loops of its rules:

- normalize (``compute_rollout_correction_weights``): after truncation, the IS weights (zero off the response
  mask) are divided by their mean: over the masked tokens at token level; at sequence level over the sequences
  with a valid token, each its masked mean weight; not when the mean is at most 1e-8.
- veto (``compute_rollout_correction_and_rejection_mask``): a sequence with a valid token whose raw log-ratio is
  below log(threshold) leaves the response mask whole; the IS weights are not changed (the loss multiplies by
  them and aggregates over the vetoed mask, so pdsr's zero weight off ``keep`` gives the same loss).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdsr_sdk.errors import ConfigValueError
from pdsr_sdk.offpolicy import importance_weights
from pdsr_sdk.offpolicy.reference import importance_weights_naive

torch = pytest.importorskip("torch")


def verl_weights(lp_t, lp_r, mask, level, threshold, normalize):
    rows = []
    for t_row, r_row, m_row in zip(lp_t, lp_r, mask):
        total = sum(float(t) - float(r) for t, r, m in zip(t_row, r_row, m_row) if m)
        row = []
        for t, r, m in zip(t_row, r_row, m_row):
            log_ratio = float(t) - float(r) if level == "token" else total
            row.append(min(math.exp(min(max(log_ratio, -20.0), 20.0)) * float(bool(m)), threshold))
        rows.append(row)
    if normalize:
        if level == "token":
            valid = [w for row, m_row in zip(rows, mask) for w, m in zip(row, m_row) if m]
        else:
            valid = [sum(w for w, m in zip(row, m_row) if m) / sum(1 for m in m_row if m)
                     for row, m_row in zip(rows, mask) if any(m_row)]
        mean = sum(valid) / len(valid)
        if mean > 1e-8:
            rows = [[w / mean for w in row] for row in rows]
    return np.array(rows)


def verl_veto_mask(lp_t, lp_r, mask, threshold):
    return np.array([[bool(m) and not any(mm and float(t) - float(r) < math.log(threshold)
                                          for t, r, mm in zip(t_row, r_row, m_row)) for m in m_row]
                     for t_row, r_row, m_row in zip(lp_t, lp_r, mask)])


def _batch(seed, rows=12, steps=20):
    rng = np.random.default_rng(seed)
    lp_r = -rng.exponential(1.0, (rows, steps))
    lp_t = lp_r + rng.normal(0, 0.5, (rows, steps)) + rng.normal(0, 0.05, (rows, 1))
    lengths = rng.integers(1, steps + 1, rows)
    lengths[0] = 0                                          # a row with no valid token
    mask = np.arange(steps)[None, :] < lengths[:, None]
    lp_t[~mask] = 40.0                                      # off the mask: never matters
    return lp_t, lp_r, mask


@pytest.mark.parametrize("as_torch", [False, True], ids=["numpy", "torch"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("veto", [None, 0.5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_normalize_and_veto_match_verl(as_torch, level, veto, seed):
    lp_t, lp_r, mask = _batch(seed)
    args = (lp_t, lp_r, mask) if not as_torch else tuple(torch.from_numpy(a) for a in (lp_t, lp_r, mask))
    w, keep = importance_weights(*args, level=level, mode="truncate", upper=2.0, normalize=True, veto=veto)
    w, keep = np.asarray(w), np.asarray(keep)
    want_keep = verl_veto_mask(lp_t, lp_r, mask, veto) if veto is not None else mask
    want_w = verl_weights(lp_t, lp_r, mask, level, 2.0, normalize=True) * want_keep
    assert np.array_equal(keep, want_keep)
    np.testing.assert_allclose(w, want_w, rtol=1e-12, atol=0)
    plain, _ = importance_weights(lp_t, lp_r, mask, level=level, mode="truncate", upper=2.0)
    assert not np.allclose(w[keep], plain[keep])            # the normalization did something
    if veto is not None:
        assert keep.any(1).sum() < mask.any(1).sum()        # some sequence was vetoed, some kept
        assert keep.any()


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize("seed", [0, 1])
def test_normalize_and_veto_match_the_loop(level, mode, seed):
    lp_t, lp_r, mask = _batch(seed)
    for normalize, veto in ((True, None), (False, 0.3), (True, 0.5)):
        want_w, want_k = importance_weights_naive(lp_t, lp_r, mask, level=level, mode=mode, upper=1.6,
                                                  normalize=normalize, veto=veto)
        w, keep = importance_weights(lp_t, lp_r, mask, level=level, mode=mode, upper=1.6, normalize=normalize,
                                     veto=veto)
        assert keep.tolist() == want_k
        np.testing.assert_allclose(w, np.array(want_w), rtol=1e-12, atol=0)
        if normalize:   # the kept tokens (sequences) average 1, vetoed ones counted: verl normalizes first
            _, before_veto = importance_weights(lp_t, lp_r, mask, level=level, mode=mode, upper=1.6)
            raw, _ = importance_weights(lp_t, lp_r, mask, level=level, mode=mode, upper=1.6, normalize=True)
            per = raw[before_veto] if level == "token" else \
                np.array([raw[i][before_veto[i]][0] for i in range(len(raw)) if before_veto[i].any()])
            assert per.mean() == pytest.approx(1.0, rel=1e-12)


def test_hand_case():
    # ratios 4, 0.25, 1 in row 0 and 1, 1 in row 1; upper 2 truncates the 4
    lp_t = np.log([[4.0, 0.25, 1.0], [1.0, 1.0, 1.0]])
    lp_r = np.zeros((2, 3))
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    w, keep = importance_weights(lp_t, lp_r, mask, upper=2.0, normalize=True)
    mean = (2.0 + 0.25 + 1.0 + 1.0 + 1.0) / 5
    np.testing.assert_allclose(w, np.array([[2.0, 0.25, 1.0], [1.0, 1.0, 0.0]]) / mean, rtol=1e-12)
    w, keep = importance_weights(lp_t, lp_r, mask, upper=2.0, veto=0.3)    # 0.25 < 0.3: row 0 vetoed
    assert keep.tolist() == [[False] * 3, [True, True, False]]
    np.testing.assert_allclose(w, [[0.0] * 3, [1.0, 1.0, 0.0]], rtol=1e-12)
    _, keep = importance_weights(lp_t, lp_r, mask, upper=2.0, veto=0.25)   # not below: kept
    assert keep.tolist() == [[True] * 3, [True, True, False]]


@pytest.mark.parametrize("key, value, match", [("veto", 0.0, "veto: expected a ratio above 0"),
                                               ("veto", -1.0, "veto: expected a ratio above 0"),
                                               ("veto", "0.1", r"veto: expected a number, got '0.1'"),
                                               ("normalize", 1, "normalize: expected True or False, got 1")])
def test_bad_settings_are_named(key, value, match):
    lp_t, lp_r, mask = _batch(0)
    with pytest.raises(ConfigValueError, match=match):
        importance_weights(lp_t, lp_r, mask, **{key: value})
