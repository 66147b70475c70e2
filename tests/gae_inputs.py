"""Shared by the GAE tests: seeded inputs of every mask kind and the check against the float64 reference."""

from __future__ import annotations

import zlib

import numpy as np

from pdsr_sdk.gae.reference import reference_gae


# (gamma, lam) with w = gamma*lam in {0.5, 0.9405, 1.0}
GAMMA_LAM = [(1.0, 0.5), (0.99, 0.95), (1.0, 1.0)]
SHAPES = [(1, 1), (1, 9), (3, 1), (4, 37), (2, 512), (3, 1000)]
MASKS = ["full", "right_padded", "left_padded", "interior", "none_valid"]


def seed_of(*parts) -> int:
    """A seed that is stable across processes (``hash`` of a str is not)."""
    return zlib.crc32(repr(parts).encode())


def make_inputs(seed: int, rows: int, steps: int, mask_kind: str):
    rng = np.random.default_rng(seed)
    rewards = rng.standard_normal((rows, steps)).astype(np.float32)
    values = rng.standard_normal((rows, steps)).astype(np.float32)
    lengths = rng.integers(0, steps + 1, size=rows)
    col = np.arange(steps)[None, :]
    mask = {
        "full": np.ones((rows, steps), dtype=bool),
        "right_padded": col < lengths[:, None],
        "left_padded": col >= (steps - lengths)[:, None],
        "interior": rng.random((rows, steps)) < 0.6,
        "none_valid": np.zeros((rows, steps), dtype=bool),
    }[mask_kind]
    return rewards, values, mask


def tolerance(gamma: float, lam: float, adv_ref: np.ndarray) -> float:
    """The spec's bounds: 1e-5 absolute for w <= 0.95, 1e-4 * max|A| at w = 1."""
    if gamma * lam <= 0.95:
        return 1e-5
    return 1e-4 * max(float(np.abs(adv_ref).max(initial=0.0)), 1.0)


def assert_matches_reference(adv, ret, rewards, values, mask, gamma, lam, tol=None):
    adv_ref, ret_ref = reference_gae(rewards, values, mask, gamma, lam)
    tol = tolerance(gamma, lam, adv_ref) if tol is None else tol
    adv, ret = np.asarray(adv, dtype=np.float64), np.asarray(ret, dtype=np.float64)
    assert adv.shape == adv_ref.shape
    err_adv = float(np.abs(adv - adv_ref).max(initial=0.0))
    err_ret = float(np.abs(ret - ret_ref).max(initial=0.0))
    assert err_adv <= tol, f"advantages off by {err_adv:.3g} (tolerance {tol:.3g})"
    assert err_ret <= tol + 1e-6 * float(np.abs(ret_ref).max(initial=0.0)), f"returns off by {err_ret:.3g}"
