"""Off-policy helpers against their float64 loop twins (pdsr_sdk.offpolicy.reference)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

from pdsr_sdk.errors import ConfigValueError, DataValueError
from pdsr_sdk.offpolicy import (LEVELS, MODES, importance_weights, off_policy_share, token_versions,
                                token_versions_of_rows)
from pdsr_sdk.offpolicy.reference import importance_weights_naive, token_versions_naive


def _logprobs(seed: int, rows: int = 6, cols: int = 17):
    rng = np.random.default_rng(seed)
    rollout = -rng.exponential(1.5, (rows, cols))
    trainer = rollout + rng.normal(0, 0.6, (rows, cols))
    trainer[0, 3] = rollout[0, 3] + 30.0    # beyond the clamp
    lengths = rng.integers(0, cols + 1, rows)
    lengths[1] = 0                          # an empty row
    mask = np.arange(cols)[None, :] < lengths[:, None]
    trainer[~mask] = np.nan                 # padding may hold anything
    return trainer, rollout, mask


@pytest.mark.parametrize("as_torch", [False, True], ids=["numpy", "torch"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_importance_weights_match_the_loop(seed, level, mode, as_torch):
    trainer, rollout, mask = _logprobs(seed)
    upper, lower = (2.0, None) if seed != 2 else (5.0, 0.8)
    want_w, want_k = importance_weights_naive(np.nan_to_num(trainer), rollout, mask, level=level, mode=mode,
                                              upper=upper, lower=lower)
    args = (torch.tensor(trainer), torch.tensor(rollout), torch.tensor(mask)) if as_torch else (trainer, rollout, mask)
    weights, keep = importance_weights(*args, level=level, mode=mode, upper=upper, lower=lower)
    if as_torch:
        assert isinstance(weights, torch.Tensor) and weights.dtype == torch.float64
        weights, keep = weights.numpy(), keep.numpy()
    np.testing.assert_allclose(weights, np.array(want_w), rtol=1e-12, atol=0)
    assert (keep == np.array(want_k)).all()
    assert not (keep & ~mask).any() and (weights[~keep] == 0).all()
    if mode == "truncate":
        assert weights.max() <= upper and (keep == mask).all()
        if lower is not None:   # a lower bound given to truncate clamps from below
            assert weights[keep].min() >= lower
            assert level != "token" or (weights[keep] == lower).any(), "some token ratio must be clamped up"
    elif level == "token":
        assert (~keep & mask).any(), "the 30-nat outlier must be rejected"


def test_float32_in_float32_out_and_the_rejected_leave_the_denominator():
    trainer = np.log(np.array([[0.5, 0.2, 0.9]], np.float32))
    rollout = np.log(np.array([[0.25, 0.6, 0.9]], np.float32))
    weights, keep = importance_weights(trainer, rollout, [[1, 1, 1]], mode="mask", upper=1.5)
    assert weights.dtype == np.float32
    # ratios 2, 1/3, 1: only the last is inside [1/1.5, 1.5]
    assert keep.tolist() == [[False, False, True]]
    np.testing.assert_allclose(weights, [[0, 0, 1]], rtol=1e-6)
    truncated, _ = importance_weights(trainer, rollout, [[1, 1, 1]], upper=1.5)
    np.testing.assert_allclose(truncated, [[1.5, 1 / 3, 1]], rtol=1e-6)


def test_bad_arguments_name_what_was_expected():
    t, r, m = _logprobs(0)
    with pytest.raises(ConfigValueError, match="level: expected one of token, sequence, geometric"):
        importance_weights(t, r, m, level="seq")
    with pytest.raises(ConfigValueError, match="mode: expected one of truncate, mask"):
        importance_weights(t, r, m, mode="clip")
    with pytest.raises(ConfigValueError, match="0 <= lower <= upper"):
        importance_weights(t, r, m, upper=2.0, lower=3.0)
    with pytest.raises(DataValueError, match=r"one shape, got \(6, 17\), \(6, 16\)"):
        importance_weights(t, r[:, :16], m)
    r2 = r.copy()
    r2[4, 0] = np.nan
    m[4, 0] = True
    with pytest.raises(DataValueError, match="row 4: a masked-in log-prob is NaN"):
        importance_weights(np.nan_to_num(t), r2, m)


@pytest.mark.parametrize("to", [np.asarray, torch.tensor], ids=["numpy", "torch"])
def test_a_nan_in_the_mask_is_named_not_kept(to):
    """bool(nan) is True: a NaN in the mask kept its token (keep [[True, False]]); it is refused, naming its row."""
    mask = [[1.0, 0.0], [float("nan"), 0.0]]
    with pytest.raises(DataValueError, match=r"^mask row 1: a value is NaN or infinite; a mask holds 0 or 1"):
        importance_weights(to([[0.0, 0.0]] * 2), to([[0.0, 0.0]] * 2), to(mask))
    _, keep = importance_weights(to([[0.0, 0.0]] * 2), to([[0.0, 0.0]] * 2), to([[1.0, 0.0], [0.0, 2.0]]))
    assert np.asarray(keep).tolist() == [[True, False], [False, True]]


@pytest.mark.parametrize("seed", range(6))
def test_token_versions_match_the_loop(seed):
    rng = np.random.default_rng(seed)
    spans, start, version = [], 0, 0
    for _ in range(rng.integers(1, 8)):
        if rng.random() < 0.2:
            start = 0                      # a restart: the spans begin again
        count = int(rng.integers(0, 12))
        version += int(rng.integers(0, 2))
        spans.append((start, count, version))
        start += count
    length = max((s + c for s, c, _ in spans), default=0)
    got = token_versions(*zip(*spans), length) if spans else token_versions([], [], [], 0)
    assert got.tolist() == token_versions_naive(spans, length)


def test_versions_of_trajectory_rows_and_the_off_policy_share():
    rows = [
        {"response_length": 5, "segments": [{"start_token": 0, "num_tokens": 3, "policy_version": 1},
                                            {"start_token": 3, "num_tokens": 2, "policy_version": 2}]},
        {"response_length": 2, "segments": [{"start_token": 0, "num_tokens": 4, "policy_version": 0},   # restarted
                                            {"start_token": 0, "num_tokens": 2, "policy_version": 2}]},
    ]
    first, second = token_versions_of_rows(rows)
    assert first.tolist() == [1, 1, 1, 2, 2] and second.tolist() == [2, 2]
    assert off_policy_share(np.concatenate([first, second]), current=2) == pytest.approx(3 / 7)
    assert off_policy_share(first, current=2, mask=[0, 0, 1, 1, 1]) == pytest.approx(1 / 3)
    assert off_policy_share([], current=3) == 0.0


def test_tokens_without_a_version_are_not_counted_in_the_off_policy_share():
    """A multi-turn row's environment tokens have no version (-1: no span covers them, as trainer_batch's
    token_versions shows): they were not sampled, so docs/sdk-batch.md's ``off_policy_share(np.concatenate(versions),
    current=...)`` used to count them as off-policy. Now they count on neither side (nor does padding's -1)."""
    rows = [{"response_length": 6, "segments": [{"start_token": 0, "num_tokens": 2, "policy_version": 3},
                                                {"start_token": 4, "num_tokens": 2, "policy_version": 2}]}]
    (versions,) = token_versions_of_rows(rows)
    assert versions.tolist() == [3, 3, -1, -1, 2, 2]   # tokens 2-3: the environment's
    assert off_policy_share(versions, current=3) == pytest.approx(2 / 4)
    assert off_policy_share(versions, current=3, mask=[1, 0, 1, 1, 1, 0]) == pytest.approx(1 / 2)
    assert off_policy_share([-1, -1], current=3) == 0.0


@pytest.mark.parametrize("mode", MODES)
def test_bf16_log_probs_give_float32_weights_within_the_bounds(mode):
    """A trainer's bf16 log-probs came back as bf16 weights: min(1.5, 1.2) was 1.203125 (bf16's nearest), above the
    cap, and every weight rounded to 8 bits (AReaL's behave_imp_weight is float32 whatever its inputs)."""
    trainer = torch.log(torch.tensor([[1.5, 1.19, 0.5, 1.003]], dtype=torch.float64)).to(torch.bfloat16)
    rollout = torch.zeros(1, 4)
    weights, keep = importance_weights(trainer, rollout, torch.ones(1, 4), mode=mode, upper=1.2, lower=0.6)
    assert weights.dtype == torch.float32
    want_w, want_k = importance_weights_naive(trainer.double().tolist(), rollout.tolist(), [[1] * 4], level="token",
                                              mode=mode, upper=1.2, lower=0.6)
    assert keep.tolist() == want_k
    np.testing.assert_allclose(weights.numpy(), np.array(want_w, np.float32), rtol=0, atol=0)
    assert float(weights.max()) <= float(np.float32(1.2))   # the cap as float32 holds it, not 1.203125


def test_bounds_that_are_not_numbers_or_keep_nothing_are_named():
    """upper='2' ended in "TypeError: '>' not supported between instances of 'str' and 'int'", upper=True was read
    as 1.0, and mode='mask' with upper=0.5 and no lower (1 / upper = 2 above it) rejected every token without a
    word, so a loss normalised by keep.sum() divided 0 by 0."""
    t, r, m = _logprobs(0)
    t = np.nan_to_num(t)
    for key, value in (("upper", "2"), ("upper", True), ("lower", "0.5"), ("upper", None), ("lower", [0.5])):
        with pytest.raises(ConfigValueError, match=rf"^{key}: expected a number, got {re.escape(repr(value))}$"):
            importance_weights(t, r, m, **{key: value})
    with pytest.raises(ConfigValueError,
                       match=r"upper: mode='mask' keeps 1 / upper <= ratio <= upper .* upper=0.5 < 1"):
        importance_weights(t, r, m, mode="mask", upper=0.5)
    _, keep = importance_weights(t, r, m, mode="mask", upper=0.5, lower=0.1)   # an interval of its own: fine
    assert keep.any()
    weights, _ = importance_weights(t, r, m, mode="truncate", upper=0.5)        # truncating at 0.5 is allowed
    assert weights.max() == 0.5
    weights, _ = importance_weights(t, r, m, upper=np.float32(2.0), lower=torch.tensor(0.5))   # numbers of any kind
    assert weights[m].min() == 0.5 and weights.max() == 2.0


def test_minus_infinity_on_the_padding_is_no_warning():
    """Padding holding -inf on both sides (a log-prob of nothing) gave numpy's "RuntimeWarning: invalid value
    encountered in subtract", an error under -W error, though the mask leaves those tokens out."""
    trainer, rollout, mask = _logprobs(0)
    trainer[~mask], rollout[~mask] = -np.inf, -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weights, keep = importance_weights(trainer, rollout, mask)
    want_w, want_k = importance_weights_naive(trainer, rollout, mask, level="token", mode="truncate", upper=2.0)
    np.testing.assert_allclose(weights, want_w, rtol=1e-12, atol=0)
    assert (keep == np.array(want_k)).all()
