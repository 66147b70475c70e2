"""The advantages docs/scoring-gae.md maps TRL's and OpenRLHF's settings to give their numbers.

Their semantics, written here as float64 loops from their code (not copied; stated per sample and per token):
TRL's ``GRPOTrainer._generate_and_score_completions`` (huggingface/trl f2cd577, July 2026: ``reward_weights``,
``scale_rewards``, ``multi_objective_aggregation``, eps 1e-4, Bessel-corrected ``nanstd``) and OpenRLHF's
``compute_advantages_and_returns`` with ``compute_reward`` and ``get_cumulative_returns`` /
``get_advantages_and_returns`` (OpenRLHF/OpenRLHF 3c3be62, August 2026: the reward on the last valid token, a
KL penalty on every token, ``reward.clip_range``, returns that run through masked tokens, and a batch whitening
with the population variance floored at 1e-8).
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from pdsr_sdk.gae import (compute_gae, grpo_advantages, masked_whiten, reinforce_pp_advantages,
                          reinforce_pp_baseline_advantages, rloo_advantages)


# --------------------------------------------------------------------------- TRL

def trl_sum_then_normalize(per_func, ids, weights, scale, eps=1e-4):
    """Weighted sum of the reward functions, less its group's mean, over the group's or the batch's std."""
    r = [sum(w * float(v) for w, v in zip(weights, row)) for row in per_func]
    batch_std = statistics.stdev(r)
    out = []
    for i, x in enumerate(r):
        group = [r[j] for j in range(len(r)) if ids[j] == ids[i]]
        std = {"group": statistics.stdev(group), "batch": batch_std, "none": None}[scale]
        out.append((x - sum(group) / len(group)) / (std + eps if std is not None else 1.0))
    return np.array(out)


def trl_normalize_then_sum(per_func, ids, weights, eps=1e-4):
    """GDPO: each function's reward normalised in its group, the weighted sum of those, then normalised over the
    batch (its mean and unbiased std)."""
    n, k = len(per_func), len(weights)
    normed = np.zeros((n, k))
    for f in range(k):
        for i in range(n):
            group = [float(per_func[j][f]) for j in range(n) if ids[j] == ids[i]]
            normed[i, f] = (per_func[i][f] - sum(group) / len(group)) / (statistics.stdev(group) + eps)
    s = [sum(weights[f] * normed[i, f] for f in range(k)) for i in range(n)]
    mean, std = sum(s) / n, statistics.stdev(s)
    return np.array([(x - mean) / (std + eps) for x in s])


def trl_case(seed):
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(5), 4)
    rng.shuffle(ids)
    per_func = np.stack([rng.integers(0, 2, ids.size), rng.uniform(0, 1, ids.size), rng.integers(-1, 2, ids.size)], 1)
    return per_func.astype(np.float64), ids, [1.0, 0.5, 0.2]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("seed", [0, 1])
def test_trl_reward_weights_and_scale_rewards(scale, seed):
    per_func, ids, weights = trl_case(seed)
    got = grpo_advantages(per_func @ np.array(weights), ids, normalize_std=scale, eps=1e-4)
    np.testing.assert_allclose(got, trl_sum_then_normalize(per_func.tolist(), list(ids), weights, scale),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trl_normalize_then_sum_is_two_calls(seed):
    """docs/scoring-gae.md's two lines: a weighted sum of grpo_advantages per function, whose group means are 0,
    so normalize_std="batch" gives the batch's mean and std."""
    per_func, ids, weights = trl_case(seed)
    s = sum(w * grpo_advantages(per_func[:, k], ids, eps=1e-4) for k, w in enumerate(weights))
    got = grpo_advantages(s, ids, normalize_std="batch", eps=1e-4)
    np.testing.assert_allclose(got, trl_normalize_then_sum(per_func.tolist(), list(ids), weights),
                               rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------- OpenRLHF

def openrlhf(estimator, rewards, n, mask, *, gamma=1.0, lambd=1.0, values=None, kl=None, kl_coef=0.0,
             clip=(-10.0, 10.0), no_std_norm=False):
    """OpenRLHF's per-token advantages for [N] rewards in contiguous groups of n and an [N, T] action mask."""
    r = np.asarray(rewards, np.float64).reshape(-1, n)
    if estimator == "rloo":
        r = r - (r.sum(1, keepdims=True) - r) / (n - 1)
    elif estimator in ("reinforce_baseline", "dr_grpo"):
        r = r - r.mean(1, keepdims=True)
    elif estimator == "group_norm":
        r = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-9)
    r = np.clip(r.reshape(-1), *clip)
    m = np.asarray(mask, np.float64)
    rows, width = m.shape
    token = -kl_coef * (np.zeros(m.shape) if kl is None else np.asarray(kl, np.float64))
    for i in range(rows):
        last = max(t for t in range(width) if m[i, t])
        token[i, last] += r[i]
    token = token * m                         # rewards (and values) on masked tokens are 0; the recursion runs on
    adv = np.zeros(m.shape)
    for i in range(rows):
        if estimator == "gae":
            v = np.asarray(values, np.float64)[i] * m[i]
            running = 0.0
            for t in range(width - 1, -1, -1):
                nxt = v[t + 1] if t + 1 < width else 0.0
                running = token[i, t] + gamma * nxt - v[t] + gamma * lambd * running
                adv[i, t] = running
        else:
            g = gamma if estimator == "reinforce" else 1.0
            running = 0.0
            for t in range(width - 1, -1, -1):
                running = token[i, t] + g * running
                adv[i, t] = running
    if estimator in ("gae", "reinforce", "reinforce_baseline"):
        picked = adv[m != 0]
        mean = picked.mean()
        var = ((picked - mean) ** 2).mean()
        adv = (adv - mean) * (1.0 if no_std_norm else 1.0 / math.sqrt(max(var, 1e-8)))
    return adv


def right_padded(rng, rows, width):
    lengths = rng.integers(1, width + 1, rows)
    return np.arange(width)[None, :] < lengths[:, None]


def interior(rng, rows, width):
    m = rng.random((rows, width)) < 0.7
    m[:, 0] = True
    return m


def population_factor(mask):
    """OpenRLHF's whitening divides by the population std, pdsr's (verl's) by the unbiased one."""
    n = int(np.asarray(mask).sum())
    return math.sqrt(n / (n - 1))


N, ROWS, WIDTH = 4, 12, 9


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("make_mask", [right_padded, interior])
def test_openrlhf_group_estimators(seed, make_mask):
    rng = np.random.default_rng(seed)
    rewards, ids = rng.integers(0, 2, ROWS) * 1.0 + rng.uniform(0, 0.1, ROWS), np.repeat(np.arange(ROWS // N), N)
    mask = make_mask(rng, ROWS, WIDTH)
    valid = mask != 0
    for estimator, per_sample in [("group_norm", grpo_advantages(rewards, ids, eps=1e-9)),
                                  ("dr_grpo", grpo_advantages(rewards, ids, normalize_std=False)),
                                  ("rloo", rloo_advantages(rewards, ids))]:
        want = openrlhf(estimator, rewards, N, mask)
        np.testing.assert_allclose(np.where(valid, per_sample[:, None], 0.0), np.where(valid, want, 0.0),
                                   rtol=1e-10, atol=1e-12, err_msg=estimator)
    want = openrlhf("reinforce_baseline", rewards, N, mask)
    got = reinforce_pp_baseline_advantages(rewards, ids, mask) * population_factor(mask)
    np.testing.assert_allclose(got[valid], want[valid], rtol=1e-7, atol=1e-9)


def test_openrlhf_reward_clip_is_on_the_centred_reward():
    rewards, ids, mask = np.array([0.0, 30.0, 1.0, 2.0]), np.repeat([0, 1], 2), np.ones((4, 3), bool)
    got = np.clip(grpo_advantages(rewards, ids, normalize_std=False), -10, 10)
    np.testing.assert_allclose(got[:, None] * mask, openrlhf("dr_grpo", rewards, 2, mask))
    assert got[1] == 10.0
    mask = right_padded(np.random.default_rng(2), 4, 5)
    baseline = reinforce_pp_advantages(got, mask)[0] * population_factor(mask)
    np.testing.assert_allclose(baseline[mask], openrlhf("reinforce_baseline", rewards, 2, mask)[mask], rtol=1e-7)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("seed", [0, 1])
def test_openrlhf_reinforce_with_kl_in_the_reward(gamma, seed):
    """--algo.advantage.estimator reinforce with a KL penalty in the reward (--algo.kl.init_coef > 0 and no
    --algo.kl.use_loss): the token rewards into reinforce_pp_advantages, times the population factor. On
    right-padded rows at any gamma; with a masked span inside a row OpenRLHF discounts through it, pdsr skips it."""
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 2, ROWS) * 1.0
    kl = rng.normal(0, 0.05, (ROWS, WIDTH))
    for make_mask, same in [(right_padded, True), (interior, gamma == 1.0)]:
        mask = make_mask(rng, ROWS, WIDTH)
        last = WIDTH - 1 - np.argmax(mask[:, ::-1], axis=1)
        token = -0.1 * kl
        token[np.arange(ROWS), last] += rewards
        got = reinforce_pp_advantages(token, mask, gamma=gamma)[0] * population_factor(mask)
        want = openrlhf("reinforce", rewards, N, mask, gamma=gamma, kl=kl, kl_coef=0.1)
        valid = mask != 0
        assert np.allclose(got[valid], want[valid], rtol=1e-7, atol=1e-9) == same, make_mask.__name__


@pytest.mark.parametrize("no_std_norm", [False, True])
def test_openrlhf_gae_and_no_std_norm(no_std_norm):
    rng = np.random.default_rng(5)
    mask = right_padded(rng, ROWS, WIDTH)
    rewards, values = rng.uniform(-1, 1, ROWS), rng.normal(0, 1, (ROWS, WIDTH))
    last = WIDTH - 1 - np.argmax(mask[:, ::-1], axis=1)
    token = np.zeros((ROWS, WIDTH))
    token[np.arange(ROWS), last] = rewards
    adv = compute_gae(token, values, mask, 0.99, 0.95, backend="reference")[0]
    valid = mask != 0
    got = adv - adv[valid].mean() if no_std_norm else masked_whiten(adv, mask) * population_factor(mask)
    want = openrlhf("gae", rewards, N, mask, gamma=0.99, lambd=0.95, values=values, no_std_norm=no_std_norm)
    np.testing.assert_allclose(got[valid], want[valid], rtol=1e-7, atol=1e-9)


# --------------------------------------------------------------------------- vLLM importance sampling

def trl_is(old, rollout, mask, mode, clip_min, clip_max):
    """TRL's vllm_importance_sampling_mode: the ratio per token or (sequence_*) exp of the row's summed log-ratios;
    *_truncate clamps it to [clip_min, clip_max] (either may be None), *_mask sets it to 0 outside them."""
    m = np.asarray(mask, np.float64)
    diff = (old - rollout) * m
    ratio = np.exp(diff.sum(1, keepdims=True)) * np.ones_like(m) if mode.startswith("sequence") else np.exp(diff)
    lo = -math.inf if clip_min is None else clip_min
    hi = math.inf if clip_max is None else clip_max
    if mode.endswith("truncate"):
        return np.clip(ratio, lo, hi)
    return np.where((ratio < lo) | (ratio > hi), 0.0, ratio)


def openrlhf_is(old, rollout, mask, kind, low, high):
    """OpenRLHF's --algo.advantage.is_correction_type: tis clamps the token ratio to [low, high]; icepop zeroes a
    token ratio outside it; seq-mask-tis keeps the unclamped token ratios of a row whose geometric mean ratio is
    inside it."""
    m = np.asarray(mask, np.float64)
    ratio = np.exp(old - rollout)
    if kind == "tis":
        return np.clip(ratio, low, high)
    if kind == "icepop":
        return ratio * ((ratio >= low) & (ratio <= high))
    geo = np.exp(((old - rollout) * m).sum(1) / m.sum(1))
    return ratio * ((geo >= low) & (geo <= high))[:, None]


def is_case(seed):
    rng = np.random.default_rng(seed)
    mask = right_padded(rng, ROWS, WIDTH)
    rollout = rng.normal(-2, 0.5, (ROWS, WIDTH))
    return rollout + rng.normal(0, 0.9, (ROWS, WIDTH)) * rng.uniform(0, 1, (ROWS, 1)), rollout, mask


@pytest.mark.parametrize("seed", [0, 1])
def test_trl_and_openrlhf_importance_sampling(seed):
    """docs/sdk-batch.md's mappings: the weights on valid tokens (the loss's denominator stays the mask's in both)."""
    from pdsr_sdk import importance_weights

    old, rollout, mask = is_case(seed)
    valid = mask != 0
    for mode, level in [("token_mask", "token"), ("sequence_mask", "sequence")]:
        w, _ = importance_weights(old, rollout, mask, level=level, mode="mask", upper=3.0, lower=0.0)
        np.testing.assert_allclose(w[valid], trl_is(old, rollout, mask, mode, None, 3.0)[valid], rtol=1e-12)
    for mode, level in [("token_truncate", "token"), ("sequence_truncate", "sequence")]:
        w, keep = importance_weights(old, rollout, mask, level=level, mode="truncate", upper=2.0, lower=0.5)
        np.testing.assert_allclose(w[valid], trl_is(old, rollout, mask, mode, 0.5, 2.0)[valid], rtol=1e-12)
    w, keep = importance_weights(old, rollout, mask, level="token", mode="truncate", upper=5.0, lower=0.5)
    np.testing.assert_allclose(w[valid],
                               openrlhf_is(old, rollout, mask, "tis", 0.5, 5.0)[valid], rtol=1e-12)
    w, _ = importance_weights(old, rollout, mask, level="token", mode="mask", lower=0.8, upper=1.2)
    np.testing.assert_allclose(w[valid], openrlhf_is(old, rollout, mask, "icepop", 0.8, 1.2)[valid], rtol=1e-12)
    _, keep = importance_weights(old, rollout, mask, level="geometric", mode="mask", lower=0.8, upper=1.2)
    w = np.where(keep, np.exp(old - rollout), 0.0)
    want = openrlhf_is(old, rollout, mask, "seq-mask-tis", 0.8, 1.2)
    assert 0 < (want[valid] == 0).mean() < 1               # some rows kept, some not
    np.testing.assert_allclose(w[valid], want[valid], rtol=1e-12)
