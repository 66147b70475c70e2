"""Fixtures of the scoring tests on the tiny model (each test module gets its own, module-scoped)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tiny_scoring import naive_logps, random_samples  # noqa: E402


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from pdsr_sdk.scoring.torch_backend import load_model

    torch.manual_seed(0)
    return load_model(tiny_model_dir, "cpu", "float32")


@pytest.fixture(scope="module")
def samples():
    return random_samples(1, 24, max_completion=100)


@pytest.fixture(scope="module")
def unbatched(model, samples):
    """One forward over every sample (a micro-batch of them all): the reference micro-batching is held to."""
    from pdsr_sdk.scoring import per_token_logps

    return per_token_logps(model, *samples, mbs=len(samples[0]))


@pytest.fixture(scope="module")
def naive(model, samples):
    return naive_logps(model, *samples)
