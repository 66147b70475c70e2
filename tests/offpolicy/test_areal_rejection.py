"""docs/partial-rollout.md's table "Coming from AReaL": each ``rejection_sampling`` setting of AReaL's decoupled loss
(metric ratio) is the ``importance_weights`` call the table names. The reference is a float64 loop of AReaL's rules
as its ``apply_rejection_sampling`` (4aef98d) states them, written here token by token."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdsr_sdk.errors import DataValueError
from pdsr_sdk.offpolicy import importance_weights


def areal_naive(prox, behave, mask, *, level: str, action: str, upper: float, lower: float | None):
    """AReaL's (behave_imp_weight, loss_mask after the rejection): ratio exp(prox - behave); at sequence level the
    geometric mean of a row's masked ratios, for the check and as every token's weight. ``mask`` drops what is out
    of ``[lower, upper]`` (no lower bound when None); ``clamp`` clamps the out-of-bounds weights to
    ``[lower or 0, upper]`` and keeps the mask. Weights are 0 off the mask."""
    weights, keeps = [], []
    for p_row, b_row, m_row in zip(prox, behave, mask):
        logs = [float(p) - float(b) for p, b, m in zip(p_row, b_row, m_row) if m]
        geo = math.exp(sum(logs) / max(len(logs), 1))
        w_row, k_row = [], []
        for p, b, m in zip(p_row, b_row, m_row):
            r = math.exp(float(p) - float(b)) if level == "token" else geo
            inside = r <= upper and (lower is None or r >= lower)
            if action == "mask":
                keep, w = bool(m) and inside, r
            else:
                keep, w = bool(m), r if inside else min(max(r, lower or 0.0), upper)
            w_row.append(w if keep else 0.0)
            k_row.append(keep)
        weights.append(w_row)
        keeps.append(k_row)
    return np.array(weights), np.array(keeps)


def logprobs(seed: int, rows: int = 16, cols: int = 23):
    rng = np.random.default_rng(seed)
    behave = -rng.exponential(1.5, (rows, cols))
    prox = behave + rng.normal(0, 1.2, (rows, cols))   # ratios from about e^-4 to e^4: either side of the bounds
    mask = np.arange(cols)[None, :] < rng.integers(1, cols + 1, rows)[:, None]
    return prox, behave, mask


#: AReaL's setting -> the table's call
ROWS = [
    (dict(level="token", action="mask", upper=5.0, lower=None), dict(level="token", mode="mask", upper=5.0, lower=0.0)),
    (dict(level="token", action="mask", upper=2.0, lower=0.5), dict(level="token", mode="mask", upper=2.0, lower=0.5)),
    (dict(level="token", action="clamp", upper=5.0, lower=None),
     dict(level="token", mode="truncate", upper=5.0, lower=None)),
    (dict(level="token", action="clamp", upper=2.0, lower=0.5),
     dict(level="token", mode="truncate", upper=2.0, lower=0.5)),
    (dict(level="sequence", action="mask", upper=1.1, lower=None),
     dict(level="geometric", mode="mask", upper=1.1, lower=0.0)),
    (dict(level="sequence", action="clamp", upper=1.3, lower=0.8),
     dict(level="geometric", mode="truncate", upper=1.3, lower=0.8)),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("areal,ours", ROWS, ids=[f"{a['level']}-{a['action']}-{a['lower']}" for a, _ in ROWS])
def test_each_rejection_sampling_setting_is_the_tables_call(areal, ours, seed):
    prox, behave, mask = logprobs(seed)
    want_w, want_keep = areal_naive(prox, behave, mask, **areal)
    got_w, got_keep = importance_weights(prox, behave, mask, **ours)
    assert (got_keep == want_keep).all()
    np.testing.assert_allclose(got_w, want_w, rtol=1e-12, atol=0)
    # the bounds fall inside the data: some tokens (rows) are out of them, rejected or clamped, and some not
    log_r = np.where(mask, prox - behave, 0.0)
    if areal["level"] == "sequence":
        log_r = np.broadcast_to(log_r.sum(1, keepdims=True) / mask.sum(1, keepdims=True), mask.shape)
    out = (np.exp(log_r) > areal["upper"]) | (np.exp(log_r) < (areal["lower"] or 0.0))
    assert 0 < (out & mask).sum() < mask.sum()
    # AReaL's loss divides by the mask before the rejection, not by what is kept
    pg = np.where(mask, np.random.default_rng(seed).normal(size=mask.shape), 0.0)
    want_loss = sum(pg[i, t] * want_w[i, t] for i in range(len(pg)) for t in range(pg.shape[1])) / mask.sum()
    assert (pg * got_w).sum() / mask.sum() == pytest.approx(want_loss, rel=1e-12)


def test_a_non_finite_log_ratio_is_an_error_naming_its_row_where_areal_weighs_it_1():
    prox, behave, mask = logprobs(0)
    behave[3, 0] = -np.inf
    with pytest.raises(DataValueError, match=r"row 3: a masked-in log-prob is NaN or infinite"):
        importance_weights(prox, behave, mask, level="token", mode="mask", upper=5.0, lower=0.0)
