"""docs/sdk-batch.md's slime rows: each of slime's corrections of the engine's numerics (read at 624b824) is the
``importance_weights`` call the table names, and its loss divides by the loss mask before the rejection.

The reference is a float64 loop of slime's rules as written there:

- ``--use-tis`` alone (``vanilla_tis_function``, slime/backends/megatron_utils/loss.py): every token's
  ``clamp(exp(old - rollout), tis_clip_low, tis_clip)``, no clamp of the log-ratio, the loss masks unchanged;
- ``icepop_function``: the ratio where ``tis_clip_low <= ratio <= tis_clip``, else 0, the loss masks unchanged;
- ``--custom-tis-function-path`` with slime's
  ``slime/examples/train_infer_mismatch_helper/mis.py:compute_mis_weights_with_cp``: the
  log-ratio per token, summed (``sequence``) or averaged (``geometric``, count clamped to 1) over the loss mask,
  clamped to +-20, exponentiated; ``truncate`` ``clamp(0, upper)``, ``clip`` ``clamp(lower, upper)``, ``mask``
  the ratio and a loss mask that drops what is outside ``[lower, upper]``; ``lower`` defaults to ``1 / upper``;
- ``policy_loss_function``: ``pg_loss * weights`` reduced with the modified masks in the numerator and, since
  7405851 (May 2026), the original masks' totals (``rollout_mask_sums``) in the denominator.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdsr_sdk.offpolicy import importance_weights


def level_log_ratio(d: float, valid: list[float], level: str) -> float:
    """mis.py's compute_log_ratio, then its clamp to +-20."""
    log_r = d if level == "token" else sum(valid) if level == "sequence" else sum(valid) / max(len(valid), 1)
    return min(max(log_r, -20.0), 20.0)


def slime_naive(old, rollout, mask, *, fn: str, level: str = "token", mode: str = "truncate", upper: float = 2.0,
                lower: float | None = None, rs: tuple[str, float | None, float | None] | None = None):
    """(weights, modified loss mask) of slime's ``fn`` (vanilla, icepop or mis), token by token in float64; ``rs``:
    mis.py's ``use_rs`` with (rs_level, rs_upper_bound, rs_lower_bound), the bounds defaulting to the IS ones."""
    weights, masks = [], []
    for o_row, r_row, m_row in zip(old, rollout, mask):
        raw = [float(o) - float(r) for o, r in zip(o_row, r_row)]
        valid = [d for d, m in zip(raw, m_row) if m]
        w_row, k_row = [], []
        for d, m in zip(raw, m_row):
            if fn == "vanilla":   # clamp(ratio, tis_clip_low, tis_clip); tis_clip_low defaults to 0
                w, k = min(max(math.exp(d), lower or 0.0), upper), bool(m)
            elif fn == "icepop":
                r = math.exp(d)
                w, k = (r if (lower or 0.0) <= r <= upper else 0.0), bool(m)
            else:
                r = math.exp(level_log_ratio(d, valid, level))
                low = 1.0 / upper if lower is None else lower
                if mode == "truncate":
                    w, k = min(max(r, 0.0), upper), bool(m)
                elif mode == "clip":
                    w, k = min(max(r, low), upper), bool(m)
                else:   # the ratio stays in the weights; the mask drops what is out of bounds
                    w, k = r, bool(m) and low <= r <= upper
                if rs is not None:   # rejection on top, on the mask only
                    rs_level, rs_upper, rs_lower = rs
                    r_rs = math.exp(level_log_ratio(d, valid, rs_level))
                    k = k and (low if rs_lower is None else rs_lower) <= r_rs <= (rs_upper or upper)
            w_row.append(w * bool(m))
            k_row.append(k)
        weights.append(w_row)
        masks.append(k_row)
    return weights, masks


def slime_losses(pg, weights, masks, loss_mask):
    """slime's two reductions of ``pg_loss * weights`` at 624b824: per token (``--calculate-per-token-loss``: the
    sum over the modified masks, divided by the original masks' token count, an empty sample counted as 1) and per
    sample (each sample's sum over its modified mask divided by its original mask's total, clamped to 1; one sample per
    rollout here)."""
    total, per_sample, count = 0.0, 0.0, 0
    for p_row, w_row, k_row, m_row in zip(pg, weights, masks, loss_mask):
        s = sum(float(p) * w for p, w, k in zip(p_row, w_row, k_row) if k)
        n = sum(1 for m in m_row if m)
        total, count, per_sample = total + s, count + max(n, 1), per_sample + s / max(n, 1)
    return total / count, per_sample


def logprobs(seed: int, rows: int = 12, cols: int = 19):
    rng = np.random.default_rng(seed)
    rollout = -rng.exponential(1.5, (rows, cols))
    old = rollout + rng.normal(0, 0.5, (rows, cols)) + rng.normal(0, 0.05, (rows, 1))   # ratios e^-2..e^2
    mask = np.arange(cols)[None, :] < rng.integers(1, cols + 1, rows)[:, None]
    mask[2, 3] = False                                                   # a multi-turn row's environment token
    mask[5] = False                                                      # an empty response
    old[~mask] = 30.0                                                    # off the mask: never matters
    return old, rollout, mask


#: slime's setting -> the table's call
ROWS = [
    (dict(fn="vanilla", upper=2.0), dict(level="token", mode="truncate", upper=2.0)),
    (dict(fn="vanilla", upper=2.0, lower=0.5), dict(level="token", mode="truncate", upper=2.0, lower=0.5)),
    (dict(fn="icepop", upper=2.0), dict(level="token", mode="mask", upper=2.0, lower=0.0)),
    (dict(fn="icepop", upper=1.5, lower=0.5), dict(level="token", mode="mask", upper=1.5, lower=0.5)),
    *[(dict(fn="mis", level=lv, mode="truncate", upper=u), dict(level=lv, mode="truncate", upper=u))
      for lv, u in (("token", 1.5), ("sequence", 2.0), ("geometric", 1.05))],
    *[(dict(fn="mis", level=lv, mode="clip", upper=u), dict(level=lv, mode="truncate", upper=u, lower=1 / u))
      for lv, u in (("token", 1.5), ("sequence", 2.0), ("geometric", 1.05))],
    *[(dict(fn="mis", level=lv, mode="mask", upper=u, lower=lo), dict(level=lv, mode="mask", upper=u, lower=lo))
      for lv, u, lo in (("token", 1.5, None), ("sequence", 2.0, None), ("geometric", 1.05, None),
                        ("geometric", 1.1, 0.97))],
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("slime,ours", ROWS, ids=["-".join(str(v) for v in a.values()) for a, _ in ROWS])
def test_each_slime_correction_is_the_tables_call(slime, ours, seed):
    old, rollout, mask = logprobs(seed)
    want_w, want_m = slime_naive(old, rollout, mask, **slime)
    weights, keep = importance_weights(old, rollout, mask, **ours)
    # icepop leaves slime's loss masks as they are and weighs the rejected 0; keep drops them: the same loss
    assert (keep == (np.array(want_m) if slime["fn"] != "icepop" else mask & (np.array(want_w) > 0))).all()
    np.testing.assert_allclose(weights, np.array(want_w) * np.array(want_m), rtol=1e-12, atol=0)
    # the bounds fall inside the data: some tokens (rows) are out of them, truncated or rejected, and some not
    level, upper = slime.get("level", "token"), slime["upper"]
    low = slime.get("lower") or (1 / upper if slime.get("mode") in ("clip", "mask") else 0.0)
    log_r = np.where(mask, old - rollout, 0.0)
    if level != "token":
        log_r = log_r.sum(1, keepdims=True) / (np.maximum(mask.sum(1, keepdims=True), 1) if level == "geometric" else 1)
    out = np.broadcast_to((np.exp(log_r) > upper) | (np.exp(log_r) < low), mask.shape)
    assert 0 < (out & mask).sum() < mask.sum()
    # slime's loss divides by the mask before the rejection: pdsr's numbers with mask.sum(), not keep.sum()
    pg = np.random.default_rng(seed + 7).normal(size=mask.shape)
    per_token, per_sample = slime_losses(pg, want_w, want_m, mask)
    rows = mask.sum(1)
    assert (pg * weights).sum() / np.maximum(rows, 1).sum() == pytest.approx(per_token, rel=1e-12)
    assert ((pg * weights).sum(1) / np.maximum(rows, 1)).sum() == pytest.approx(per_sample, rel=1e-12)
    if ours["mode"] == "mask":   # rejected tokens there; dividing by keep.sum() is not slime's number
        assert keep.sum() < mask.sum()
        assert (pg * weights).sum() / (keep.sum() + 1) != pytest.approx(per_token, rel=1e-6)


#: mis.py with use_rs (its mis.yaml has it on): (tis_level, tis_mode, upper, lower), (rs_level, rs_upper, rs_lower)
RS_ROWS = [(("token", "truncate", 2.0, 0.5), ("token", None, None)),          # mis.yaml's IS and RS bounds
           (("token", "clip", 1.5, None), ("geometric", 1.05, None)),
           (("sequence", "truncate", 3.0, None), ("token", 1.8, 0.6)),
           (("geometric", "mask", 1.1, 0.97), ("sequence", 2.0, None))]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("tis,rs", RS_ROWS, ids=[f"{t[0]}-{t[1]}-rs-{r[0]}" for t, r in RS_ROWS])
def test_slime_rejection_on_top_is_the_weights_times_the_masks_keep(tis, rs, seed):
    """The table's use_rs row: the IS row's weights and keep, times keep of mode="mask" at rs_level with the RS
    bounds (each defaulting to the IS stage's lower, 1 / upper unless given, and upper)."""
    level, mode, upper, lower = tis
    rs_level, rs_upper, rs_lower = rs
    old, rollout, mask = logprobs(seed)
    want_w, want_m = slime_naive(old, rollout, mask, fn="mis", level=level, mode=mode, upper=upper, lower=lower, rs=rs)
    low = 1 / upper if lower is None else lower   # mis.py's lower bound of clip, mask and (by default) the rejection
    weights, keep = importance_weights(old, rollout, mask, level=level, upper=upper,   # truncate: no lower bound
                                       mode="mask" if mode == "mask" else "truncate",
                                       lower=None if mode == "truncate" else low)
    _, rs_keep = importance_weights(old, rollout, mask, level=rs_level, mode="mask", upper=rs_upper or upper,
                                    lower=low if rs_lower is None else rs_lower)
    want_m = np.array(want_m)
    assert (keep & rs_keep == want_m).all()
    assert 0 < (mask & ~rs_keep).sum() and want_m.sum() > 0                 # the rejection took some, not all
    np.testing.assert_allclose(weights * rs_keep, np.array(want_w) * want_m, rtol=1e-12, atol=0)
