"""GAE semantics pins (padding, skipped masked spans, verl's recurrence) and the API contract (arrays in and out,
dtypes, bad inputs, the backend registry)."""

from __future__ import annotations


import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gae_inputs import GAMMA_LAM, MASKS, assert_matches_reference, make_inputs  # noqa: E402

from pdsr_sdk.errors import ConfigError, DataError, PdsrError  # noqa: E402
from pdsr_sdk.gae import GAE_BACKENDS, GaeBackend, compute_gae, get_backend  # noqa: E402
from pdsr_sdk.gae.reference import reference_gae  # noqa: E402
from pdsr_sdk.registry import Registry  # noqa: E402


# --------------------------------------------------------------------------- semantics pins

def plain_gae(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """Textbook unmasked GAE of one sequence, closed form: A_t = sum_k (gamma lam)^(k-t) delta_k, V_L = 0."""
    n = len(rewards)
    v_next = np.append(np.asarray(values, dtype=np.float64)[1:], 0.0)
    delta = np.asarray(rewards, dtype=np.float64) + gamma * v_next - values
    return np.array([sum((gamma * lam) ** (k - t) * delta[k] for k in range(t, n)) for t in range(n)])


@pytest.mark.parametrize("backend", ["reference", "numba", "torch"])
@pytest.mark.parametrize("gamma,lam", GAMMA_LAM)
def test_right_padded_equals_plain_gae_on_prefix(backend, gamma, lam):
    rng = np.random.default_rng(2)
    rows, steps = 5, 60
    lengths = [60, 1, 0, 33, 59]
    r = rng.standard_normal((rows, steps)).astype(np.float32)
    v = rng.standard_normal((rows, steps)).astype(np.float32)
    mask = np.arange(steps)[None, :] < np.array(lengths)[:, None]
    r[~mask] = np.nan      # padding content must never matter
    v[~mask] = 1e30
    args = (r, v, mask)
    if backend == "torch":
        args = tuple(torch.from_numpy(a) for a in args)
    adv, _ = compute_gae(*args, gamma, lam, backend=backend)
    adv = np.asarray(adv)
    for row, n in enumerate(lengths):
        expected = plain_gae(r[row, :n], v[row, :n].astype(np.float64), gamma, lam)
        np.testing.assert_allclose(adv[row, :n], expected, rtol=1e-5, atol=1e-5)
        assert np.all(adv[row, n:] == 0.0), "advantage after the last valid token must be 0"


def test_zero_padded_unmasked_convention_agrees_for_right_padding():
    # slime: rewards/values padded with zeros, no mask -> same advantages on valid tokens
    r, v, mask = make_inputs(4, 6, 50, "right_padded")
    r0, v0 = np.where(mask, r, 0), np.where(mask, v, 0)
    masked, _ = compute_gae(r, v, mask, 0.99, 0.95, backend="reference")
    unmasked, _ = compute_gae(r0, v0, None, 0.99, 0.95, backend="reference")
    np.testing.assert_allclose(masked[mask], unmasked[mask], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", ["reference", "numba", "torch"])
def test_interior_masked_span_is_skipped(backend):
    # tokens 0 and 3 valid, 1-2 masked (e.g. a tool output), 4 masked padding
    g, lam = 0.9, 0.8
    r = np.array([[0.5, 7.0, -3.0, 2.0, 9.0]])
    v = np.array([[1.0, 50.0, 60.0, 3.0, 70.0]])
    m = np.array([[1, 0, 0, 1, 0]])
    a3 = 2.0 + g * 0.0 - 3.0                 # last valid token bootstraps from V = 0
    a0 = 0.5 + g * 3.0 - 1.0 + g * lam * a3  # skips the span: next value is V_3, one gamma, one lambda
    expected = np.array([[a0, a3, a3, a3, 0.0]])
    args = (r, v, m) if backend != "torch" else tuple(torch.from_numpy(x) for x in (r, v, m))
    adv, ret = compute_gae(*args, g, lam, backend=backend)
    np.testing.assert_allclose(np.asarray(adv), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(ret), expected + v, rtol=1e-12, atol=1e-12)


def verl_style_loop(rewards, values, mask, gamma, lam):
    """verl's recurrence with float-mask arithmetic (no branches), torch float64."""
    rows, steps = rewards.shape
    m = mask.to(torch.float64)
    nextvalues = torch.zeros(rows, dtype=torch.float64)
    lastgaelam = torch.zeros(rows, dtype=torch.float64)
    out = []
    for t in reversed(range(steps)):
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        cand = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * m[:, t] + (1 - m[:, t]) * nextvalues
        lastgaelam = cand * m[:, t] + (1 - m[:, t]) * lastgaelam
        out.append(lastgaelam)
    adv = torch.stack(out[::-1], dim=1)
    return adv, adv + values


@pytest.mark.parametrize("mask_kind", MASKS)
def test_reference_is_verls_recurrence(mask_kind):
    r, v, m = make_inputs(8, 4, 40, mask_kind)
    r64, v64 = r.astype(np.float64), v.astype(np.float64)
    expected = verl_style_loop(torch.from_numpy(r64), torch.from_numpy(v64), torch.from_numpy(m), 0.99, 0.95)
    got = reference_gae(r64, v64, m, 0.99, 0.95)
    np.testing.assert_allclose(got[0], expected[0].numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[1], expected[1].numpy(), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- API contract

@pytest.mark.parametrize("backend", ["reference", "numba", "torch"])
def test_numpy_in_numpy_out_and_out_buffers(backend):
    r, v, m = make_inputs(1, 3, 100, "interior")
    adv_buf, ret_buf = np.empty_like(r), np.empty_like(r)
    adv, ret = compute_gae(r, v, m, 0.99, 0.95, backend=backend, out=(adv_buf, ret_buf))
    assert adv is adv_buf and ret is ret_buf
    assert_matches_reference(adv, ret, r, v, m, 0.99, 0.95)
    fresh = compute_gae(r, v, m, 0.99, 0.95, backend=backend)
    assert all(isinstance(x, np.ndarray) and x.dtype == np.float32 for x in fresh)


@pytest.mark.parametrize("backend", ["auto", "reference", "numba", "torch"])
def test_tensor_in_tensor_out_and_out_buffers(backend):
    r, v, m = make_inputs(2, 3, 100, "interior")
    tr, tv, tm = torch.from_numpy(r), torch.from_numpy(v), torch.from_numpy(m)
    adv, ret = compute_gae(tr, tv, tm, 0.99, 0.95, backend=backend)
    assert isinstance(adv, torch.Tensor) and isinstance(ret, torch.Tensor) and adv.dtype == torch.float32
    assert_matches_reference(adv.numpy(), ret.numpy(), r, v, m, 0.99, 0.95)
    bufs = (torch.empty(3, 100), torch.empty(3, 100))
    got = compute_gae(tr, tv, tm, 0.99, 0.95, backend=backend, out=bufs)
    assert got[0] is bufs[0] and got[1] is bufs[1]
    assert torch.equal(got[0], adv) and torch.equal(got[1], ret)


@pytest.mark.parametrize("backend", ["reference", "numba", "torch"])
def test_out_may_alias_inputs(backend):
    r, v, m = make_inputs(6, 4, 301, "interior")
    r2, v2 = r.copy(), v.copy()
    adv, ret = compute_gae(r2, v2, m, 0.99, 0.95, backend=backend, out=(r2, v2))   # in place
    assert adv is r2 and ret is v2
    assert_matches_reference(adv, ret, r, v, m, 0.99, 0.95)


@pytest.mark.parametrize("backend", ["reference", "numba", "torch"])
@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
def test_empty_batches(backend, shape):
    z = np.zeros(shape, np.float32)
    adv, ret = compute_gae(z, z, np.ones(shape, bool), 0.9, 0.9, backend=backend)
    assert adv.shape == shape and ret.shape == shape


def test_float64_and_half_dtypes():
    r, v, m = make_inputs(3, 2, 50, "interior")
    adv, ret = compute_gae(r.astype(np.float64), v.astype(np.float64), m, 0.99, 0.95, backend="numba")
    assert adv.dtype == np.float64 and ret.dtype == np.float64
    assert_matches_reference(adv, ret, r, v, m, 0.99, 0.95, tol=1e-12)
    tadv, _ = compute_gae(torch.from_numpy(r).bfloat16(), torch.from_numpy(v).bfloat16(),
                          torch.from_numpy(m).long(), 0.99, 0.95, backend="torch")
    assert tadv.dtype == torch.float32
    adv_bf, _ = reference_gae(torch.from_numpy(r).bfloat16().float().numpy(),
                              torch.from_numpy(v).bfloat16().float().numpy(), m, 0.99, 0.95)
    np.testing.assert_allclose(tadv.numpy(), adv_bf, atol=1e-5)


def test_numeric_masks_mean_nonzero():
    r, v, m = make_inputs(9, 3, 64, "interior")
    expected = compute_gae(r, v, m, 0.99, 0.95, backend="numba")[0]
    for mask in (m.astype(np.int64), m.astype(np.float32), m.astype(np.uint8)):
        np.testing.assert_array_equal(compute_gae(r, v, mask, 0.99, 0.95, backend="numba")[0], expected)


@pytest.mark.parametrize("bad,match", [
    (dict(rewards=np.zeros(5, np.float32)), r"2-D \[B, T\].*\(5,\)"),
    (dict(rewards=np.zeros((2, 3, 4), np.float32)), r"2-D.*\(2, 3, 4\)"),
    (dict(values=np.zeros((2, 4), np.float32)), r"values has shape \(2, 4\), expected .*\(2, 3\)"),
    (dict(mask=np.ones((3, 3), bool)), r"mask has shape \(3, 3\)"),
    (dict(rewards=np.zeros((2, 3), "U1")), r"rewards must be a float array"),
    (dict(mask=np.full((2, 3), "y")), r"mask must be a bool or numeric array"),
    (dict(out=(np.zeros((2, 3), np.float32),)), r"out must be a pair"),
    (dict(out=(np.zeros((2, 3), np.float64), np.zeros((2, 3), np.float32))), r"out\[0\].*dtype float64"),
    (dict(out=(np.zeros((2, 4), np.float32), np.zeros((2, 3), np.float32))), r"out\[0\].*shape \(2, 4\)"),
])
def test_bad_arrays_raise_data_error(bad, match):
    kwargs = dict(rewards=np.zeros((2, 3), np.float32), values=np.zeros((2, 3), np.float32),
                  mask=np.ones((2, 3), bool))
    out = bad.pop("out", None)
    kwargs.update(bad)
    with pytest.raises(DataError, match=match):
        compute_gae(kwargs["rewards"], kwargs["values"], kwargs["mask"], 0.99, 0.95, backend="numba", out=out)


def test_mixed_array_kinds_raise():
    z = np.zeros((2, 3), np.float32)
    with pytest.raises(DataError, match=r"must all be numpy arrays or all torch tensors; "
                                         r"got rewards=numpy, values=torch"):
        compute_gae(z, torch.zeros(2, 3), np.ones((2, 3), bool), 0.9, 0.9)


def test_out_on_another_device_raises():
    z = torch.zeros(2, 3)
    with pytest.raises(DataError, match=r"out\[0\] \(advantages\) is on meta, expected the inputs' device cpu"):
        compute_gae(z, z, None, 0.9, 0.9, out=(torch.empty(2, 3, device="meta"), torch.empty(2, 3)))


@pytest.mark.parametrize("kwargs,match", [
    (dict(gamma=1.5), r"gamma: expected a number in \[0, 1\], got 1.5"),
    (dict(lam=-0.1), r"lam: expected a number in \[0, 1\]"),
    (dict(chunk_size=0), r"chunk_size: expected an integer >= 1"),
    (dict(carry_dtype="float16"), r"carry_dtype: expected one of auto, float32, float64"),
    (dict(threads=0), r"threads: expected None or an integer >= 1"),
])
def test_bad_parameters_raise_config_error(kwargs, match):
    params = dict(gamma=0.99, lam=0.95)
    params.update(kwargs)
    gamma, lam = params.pop("gamma"), params.pop("lam")
    z = np.zeros((2, 3), np.float32)
    with pytest.raises(ConfigError, match=match):
        compute_gae(z, z, None, gamma, lam, **params)


def test_unknown_backend_lists_valid_names():
    z = np.zeros((1, 2), np.float32)
    with pytest.raises(PdsrError, match=r"unknown GAE backend 'fast'; valid names: numba, reference, torch, triton"):
        compute_gae(z, z, None, 0.9, 0.9, backend="fast")


def test_backend_by_import_path_and_protocol():
    r, v, m = make_inputs(4, 2, 20, "interior")
    adv, _ = compute_gae(r, v, m, 0.99, 0.95, backend="pdsr_sdk.gae.reference:ReferenceGae")
    np.testing.assert_allclose(adv, reference_gae(r, v, m, 0.99, 0.95)[0], rtol=1e-6, atol=1e-6)
    for name in GAE_BACKENDS.names():
        backend = get_backend(name)
        assert isinstance(backend, GaeBackend)
        assert backend.array_kind in ("numpy", "torch")
        backend.warmup("float32", "auto")


def test_registry_rejects_duplicate_backend_name():
    registry: Registry[type] = Registry("GAE backend")
    registry.register("numba", "pdsr_sdk.gae.numba_kernel:NumbaGae")
    with pytest.raises(PdsrError, match="already registered"):
        registry.register("numba", "pdsr_sdk.gae.reference:ReferenceGae")
