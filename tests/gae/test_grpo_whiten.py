"""GRPO group advantages and masked whitening against plain loops."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

torch = pytest.importorskip("torch")


from pdsr_sdk.errors import ConfigValueError, DataError, DataValueError  # noqa: E402
from pdsr_sdk.gae import grpo_advantages, masked_whiten  # noqa: E402


# --------------------------------------------------------------------------- GRPO

def grpo_loop(rewards, ids, normalize_std, eps):
    out = []
    for i, x in enumerate(rewards):
        group = [float(rewards[j]) for j in range(len(rewards)) if ids[j] == ids[i]]
        mean = sum(group) / len(group)
        if not normalize_std:
            out.append(float(x) - mean)
        elif len(group) == 1:
            out.append(0.0)
        else:
            out.append((float(x) - mean) / (statistics.stdev(group) + eps))
    return np.array(out)


@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("eps", [1e-6, 0.5])
@pytest.mark.parametrize("id_kind", ["int", "str"])
def test_grpo_matches_loop(normalize_std, eps, id_kind):
    rng = np.random.default_rng(3)
    sizes = [8, 8, 1, 3, 2, 1, 5]
    ids = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(ids)
    if id_kind == "str":
        ids = np.array([f"prompt-{i}" for i in ids], dtype=object)
    rewards = rng.standard_normal(len(ids)).astype(np.float32)
    rewards[ids == ids[0]] = 1.0            # a group with zero spread
    got = grpo_advantages(rewards, ids, normalize_std=normalize_std, eps=eps)
    assert got.dtype == np.float32 and got.shape == rewards.shape
    np.testing.assert_allclose(got, grpo_loop(rewards, list(ids), normalize_std, eps), rtol=1e-6, atol=1e-6)


def test_grpo_singleton_groups_get_zero_and_tensors_round_trip():
    rewards = torch.tensor([3.0, 1.0, 2.0, 5.0], dtype=torch.float64)
    ids = torch.tensor([7, 9, 9, 4])
    got = grpo_advantages(rewards, ids)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    assert got[0] == 0.0 and got[3] == 0.0
    std = statistics.stdev([1.0, 2.0])
    np.testing.assert_allclose(got[1:3].numpy(), [(1 - 1.5) / (std + 1e-6), (2 - 1.5) / (std + 1e-6)])


@pytest.mark.parametrize("dtype, expected", [(torch.float32, torch.float32), (torch.float16, torch.float32),
                                             (torch.bfloat16, torch.float32), (torch.float64, torch.float64)])
def test_grpo_tensor_result_dtype_is_float32_unless_float64(dtype, expected):
    """The docstring's rule for tensors as for arrays: float64 in -> float64 out, anything else float32."""
    rng = np.random.default_rng(3)
    ids = np.repeat(np.arange(5), 4)
    rewards = rng.standard_normal(ids.size)
    ref = grpo_advantages(torch.tensor(rewards, dtype=dtype).double(), torch.from_numpy(ids))   # float64 reference
    got = grpo_advantages(torch.tensor(rewards, dtype=dtype), torch.from_numpy(ids))
    assert got.dtype == expected
    np.testing.assert_allclose(got.double().numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rewards, match", [
    ([1.0, None, 0.5, None], r"2 of 4 are not: rewards\[1\] = None, rewards\[3\] = None; .*scores\[i\]\.error.*"
                             r"reward_error"),
    ([1.0, "x", 0.5, 0.0], r"1 of 4 is not: rewards\[1\] = 'x'$"),
])
def test_grpo_names_the_rewards_that_are_not_numbers(rewards, match):
    """A step's rewards with a None (the reward function raised) name the samples and where the errors are."""
    with pytest.raises(DataValueError, match=match) as exc:
        grpo_advantages(rewards, [0, 0, 1, 1])
    assert isinstance(exc.value, ValueError)


def test_grpo_takes_python_numbers_in_an_object_array():
    got = grpo_advantages(np.array([1, 2.0, np.float32(3), True], dtype=object), [0, 0, 1, 1])
    np.testing.assert_allclose(got, grpo_advantages([1.0, 2.0, 3.0, 1.0], [0, 0, 1, 1]))


def test_grpo_bad_shapes():
    with pytest.raises(DataError, match=r"group_ids has shape \(2,\), expected .*\(3,\)"):
        grpo_advantages(np.zeros(3), np.zeros(2))
    with pytest.raises(DataError, match=r"1-D \[N\]"):
        grpo_advantages(np.zeros((3, 2)), np.zeros((3, 2)))


def trl_batch_scaled(rewards, ids, eps):
    """TRL's scale_rewards="batch" (GRPOTrainer, trl f2cd577): the reward less its group's mean, over the
    unbiased std of every reward of the batch plus eps."""
    xs = [float(x) for x in rewards]
    std = statistics.stdev(xs)
    out = []
    for i, x in enumerate(xs):
        group = [xs[j] for j in range(len(xs)) if ids[j] == ids[i]]
        out.append((x - sum(group) / len(group)) / (std + eps))
    return np.array(out)


def test_grpo_batch_std_hand_case():
    """Groups {0, 1} and {2, 4}: centred -0.5, 0.5, -1, 1; the std of 0, 1, 2, 4 is sqrt(35/12)."""
    got = grpo_advantages(np.array([0.0, 1.0, 2.0, 4.0]), [0, 0, 1, 1], normalize_std="batch", eps=0.0)
    np.testing.assert_allclose(got, np.array([-0.5, 0.5, -1.0, 1.0]) / math.sqrt(35 / 12), rtol=1e-12)


@pytest.mark.parametrize("eps", [1e-4, 0.5])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_grpo_batch_std_matches_trl(eps, kind):
    rng = np.random.default_rng(7)
    ids = np.repeat(np.arange(6), 4)
    rng.shuffle(ids)
    rewards = rng.standard_normal(ids.size) * np.repeat(rng.uniform(0.01, 3.0, 6), 4)[ids]   # spreads differ
    rewards[ids == ids[0]] = 0.25            # a group with zero spread: 0, not 0 / eps
    want = trl_batch_scaled(rewards, list(ids), eps)
    r_in = torch.from_numpy(rewards) if kind == "torch" else rewards
    got = grpo_advantages(r_in, ids, normalize_std="batch", eps=eps)
    assert (isinstance(got, torch.Tensor) if kind == "torch" else got.dtype == np.float64)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
    group = grpo_advantages(rewards, ids, eps=eps)        # the per-group std gives other numbers here
    assert not np.allclose(group, want)


def test_grpo_normalize_std_names():
    """True / False are "group" / "none" (TRL's scale_rewards takes the same); a batch of one reward has std 0."""
    rewards, ids = np.array([0.0, 1.0, 3.0, 3.5, 9.0]), [0, 0, 1, 1, 2]
    np.testing.assert_array_equal(grpo_advantages(rewards, ids, normalize_std="group"),
                                  grpo_advantages(rewards, ids, normalize_std=True))
    np.testing.assert_array_equal(grpo_advantages(rewards, ids, normalize_std="none"),
                                  grpo_advantages(rewards, ids, normalize_std=np.bool_(False)))
    np.testing.assert_allclose(grpo_advantages(rewards, ids, normalize_std="none"), [-0.5, 0.5, -0.25, 0.25, 0.0])
    std = statistics.stdev(rewards.tolist())
    np.testing.assert_allclose(grpo_advantages(rewards, ids, normalize_std="batch", singleton="score", eps=0.0),
                               [-0.5 / std, 0.5 / std, -0.25 / std, 0.25 / std, 9.0 / std])
    np.testing.assert_allclose(grpo_advantages([2.0], [0], normalize_std="batch", singleton="score", eps=0.5), [4.0])
    with pytest.raises(ConfigValueError, match=r"normalize_std: expected True, False or one of 'group', 'batch', "
                                               r"'none', got 'global'"):
        grpo_advantages(rewards, ids, normalize_std="global")


@pytest.mark.parametrize("normalize_std", [True, "batch"])
def test_grpo_eps_zero_gives_a_group_of_equal_rewards_zero(normalize_std):
    """eps=0 (no floor on the std): a group of equal rewards is 0 / 0; it gets 0 as with eps > 0, not NaN, and the
    other groups are the centred rewards over the plain std (the loop's numbers with eps 0)."""
    rewards, ids = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.5]), [0, 0, 1, 1, 2, 2]
    with np.errstate(all="raise"):       # a 0 / 0 would raise here instead of warning
        got = grpo_advantages(rewards, ids, normalize_std=normalize_std, eps=0.0)
    if normalize_std is True:        # each group's own std
        std1, std2 = statistics.stdev([0.0, 1.0]), statistics.stdev([0.0, 0.5])
    else:                            # the batch's
        std1 = std2 = statistics.stdev(rewards.tolist())
    np.testing.assert_allclose(got, [0.0, 0.0, -0.5 / std1, 0.5 / std1, -0.25 / std2, 0.25 / std2])
    # two singletons keeping their rewards over a batch std of 0: 0 too, not 2 / 0
    np.testing.assert_array_equal(grpo_advantages([2.0, 2.0], [0, 1], normalize_std="batch", singleton="score",
                                                  eps=0.0), [0.0, 0.0])


@pytest.mark.parametrize("eps", [-1e-6, float("nan"), float("inf"), "1e-6", None, True])
def test_grpo_refuses_an_eps_that_is_not_a_number_at_least_0(eps):
    """A negative eps flips or blows up the advantages of a group that spreads little; NaN makes them all NaN."""
    with pytest.raises(ConfigValueError, match=r"^eps: expected a finite number >= 0 .*got "):
        grpo_advantages([0.0, 1.0], [0, 0], eps=eps)


# --------------------------------------------------------------------------- whitening

def whiten_loop(values, mask, shift_mean, eps):
    picked = [float(x) for x, keep in zip(values.ravel(), mask.ravel()) if keep]
    mean = sum(picked) / len(picked)
    var = sum((x - mean) ** 2 for x in picked) / (len(picked) - 1)
    out = [(float(x) - mean) / math.sqrt(var + eps) + (0.0 if shift_mean else mean) for x in values.ravel()]
    return np.array(out).reshape(values.shape)


@pytest.mark.parametrize("shift_mean", [True, False])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_masked_whiten_matches_loop(shift_mean, kind):
    rng = np.random.default_rng(5)
    values = (rng.standard_normal((4, 30)) * 3 + 2).astype(np.float32)
    mask = rng.random((4, 30)) < 0.5
    expected = whiten_loop(values, mask, shift_mean, 1e-8)
    if kind == "torch":
        got = masked_whiten(torch.from_numpy(values), torch.from_numpy(mask), shift_mean=shift_mean)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
        got = got.numpy()
    else:
        got = masked_whiten(values, mask, shift_mean=shift_mean)
        assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_masked_whiten_needs_two_entries():
    with pytest.raises(DataError, match="at least 2 masked-in entries.*got 1"):
        masked_whiten(np.ones((2, 2)), np.array([[1, 0], [0, 0]]))
    with pytest.raises(DataError, match=r"mask has shape \(2,\)"):
        masked_whiten(np.ones((2, 2)), np.ones(2))
