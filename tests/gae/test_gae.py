"""GAE backends against the float64 reference, semantics pins, API contract, GRPO and whitening."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdsr_sdk.errors import ConfigError, DataError, DataValueError, PdsrError
from pdsr_sdk.gae import GAE_BACKENDS, GaeBackend, compute_gae, get_backend, grpo_advantages, masked_whiten
from pdsr_sdk.gae.numba_kernel import numba_gae
from pdsr_sdk.gae.reference import reference_gae
from pdsr_sdk.registry import Registry
from support import ROOT

torch = pytest.importorskip("torch")

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


# --------------------------------------------------------------------------- backends vs reference

def run_numba(r, v, m, gamma, lam, carry):
    return compute_gae(r, v, m, gamma, lam, backend="numba", carry_dtype=carry)


def run_numba_simple(r, v, m, gamma, lam, carry):
    return numba_gae(r, v, m, gamma, lam, carry_dtype=carry, kernel="simple")


@pytest.mark.parametrize("runner", [run_numba, run_numba_simple], ids=["numba", "numba-simple"])
@pytest.mark.parametrize("carry", ["float32", "float64"])
@pytest.mark.parametrize("gamma,lam", GAMMA_LAM)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("mask_kind", MASKS)
def test_numba_matches_reference(runner, carry, gamma, lam, shape, mask_kind):
    r, v, m = make_inputs(seed_of(shape, mask_kind), *shape, mask_kind)
    adv, ret = runner(r, v, m, gamma, lam, carry)
    assert adv.dtype == np.float32
    assert_matches_reference(adv, ret, r, v, m, gamma, lam)


@pytest.mark.parametrize("chunk", [1, 7, 64, 256])
@pytest.mark.parametrize("gamma,lam", GAMMA_LAM)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("mask_kind", MASKS)
def test_torch_chunk_scan_matches_reference(chunk, gamma, lam, shape, mask_kind):
    r, v, m = make_inputs(seed_of(shape, mask_kind, "t"), *shape, mask_kind)
    adv, ret = compute_gae(torch.from_numpy(r), torch.from_numpy(v), torch.from_numpy(m), gamma, lam,
                           backend="torch", chunk_size=chunk)
    assert isinstance(adv, torch.Tensor) and adv.dtype == torch.float32
    assert_matches_reference(adv.numpy(), ret.numpy(), r, v, m, gamma, lam)


HAS_TRITON = importlib.util.find_spec("triton") is not None
CUDA_TRITON = HAS_TRITON and torch.cuda.is_available()


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_TRITON, reason="needs a CUDA device and triton (the CPU run is "
                                            "test_triton_in_interpreter_matches_reference)")
@pytest.mark.parametrize("carry", ["float32", "float64"])
@pytest.mark.parametrize("gamma,lam", GAMMA_LAM)
@pytest.mark.parametrize("shape", SHAPES + [(5, 3000)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("mask_kind", MASKS)
def test_triton_matches_reference(carry, gamma, lam, shape, mask_kind):
    from pdsr_sdk.gae.triton_kernel import triton_gae

    r, v, m = make_inputs(seed_of(shape, mask_kind, "tt"), *shape, mask_kind)
    dev = [torch.from_numpy(a).cuda() for a in (r, v, m)]
    # one segment per row; three (summary kernel + fold); each with and without prefetching the next tile
    for segments, prefetch in [(None, False), (3, False), (None, True), (3, True)]:
        adv, ret = triton_gae(*dev, gamma, lam, carry_dtype=carry, block=256, segments=segments, prefetch=prefetch)
        assert adv.dtype == torch.float32 and adv.is_cuda
        assert_matches_reference(adv.cpu().numpy(), ret.cpu().numpy(), r, v, m, gamma, lam)
    adv, ret = compute_gae(*dev, gamma, lam, backend="triton", carry_dtype=carry)
    assert_matches_reference(adv.cpu().numpy(), ret.cpu().numpy(), r, v, m, gamma, lam)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_in_interpreter_matches_reference():
    """The kernel itself, on the CPU: every mask kind and (gamma, lam), one and several tiles and
    segments per row, float32 and float64 carries, in Triton's interpreter (a subprocess, since
    TRITON_INTERPRET must be set before triton is imported)."""
    script = Path(__file__).with_name("gae_triton_interpret.py")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0 and "interpret" in proc.stderr.lower() and "not supported" in proc.stderr.lower():
        pytest.skip(f"Triton's interpreter cannot run here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["checked"] == len(MASKS) * len(GAMMA_LAM) * 3   # x the script's CASES
    assert report["failures"] == []
    api = report["api"]
    assert api["numpy_kind"] == "ndarray" and api["numpy_dtype"] == "float32" and api["numpy_err"] < 1e-5
    assert api["alias_same_objects"] and api["alias_dtype"] == "torch.float64" and api["alias_err"] < 1e-12
    assert api["empty_shape"] == [0, 4]


def test_triton_on_cpu_tensors_without_interpreter_raises(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    z = torch.zeros((2, 3))
    with pytest.raises(ConfigError, match="needs CUDA tensors"):
        compute_gae(z, z, None, 0.9, 0.9, backend="triton")


def test_auto_picks_triton_on_cuda_when_importable(monkeypatch):
    from pdsr_sdk.gae import api

    assert api.resolve_backend_name("auto", cuda=False) == "numba"
    assert api.resolve_backend_name("auto", cuda=True) == ("triton" if HAS_TRITON else "torch")
    monkeypatch.setattr(api, "triton_available", lambda: False)
    assert api.resolve_backend_name("auto", cuda=True) == "torch"
    assert api.resolve_backend_name("triton", cuda=False) == "triton"


def test_triton_backend_is_imported_lazily():
    code = ("import sys, pdsr_sdk.gae\nfrom pdsr_sdk.gae import get_backend, resolve_backend_name\n"
            "resolve_backend_name('auto', cuda=True); get_backend('triton')\n"
            "print('triton' in sys.modules, 'pdsr_sdk.gae.triton_kernel' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("block_rows", [1, 2, 3])
def test_torch_row_blocks_mix_mask_paths(block_rows):
    # blocks of rows take the right-padded or the compaction path independently
    from pdsr_sdk.gae.torch_chunk_scan import chunk_scan_gae

    r, v, m = make_inputs(12, 7, 90, "right_padded")
    m[[1, 5]] = make_inputs(13, 2, 90, "interior")[2]
    tr, tv = torch.from_numpy(r.copy()), torch.from_numpy(v.copy())
    adv, ret = chunk_scan_gae(tr, tv, torch.from_numpy(m), 0.99, 0.95, chunk_size=16, block_rows=block_rows,
                              out=(tv, tr))   # crossed in-place outputs
    assert adv is tv and ret is tr
    assert_matches_reference(adv.numpy(), ret.numpy(), r, v, m, 0.99, 0.95)


@pytest.mark.parametrize("chunk", [7, 256])
@pytest.mark.parametrize("gamma,lam", GAMMA_LAM)
@pytest.mark.parametrize("mask_kind", ["right_padded", "interior"])
def test_torch_float32_scans_within_relative_bound(chunk, gamma, lam, mask_kind):
    # float32 matmuls round each of their C additions at the running sum's
    # magnitude: they hold 1e-5 relative to max|A|, not 1e-5 absolute
    r, v, m = make_inputs(11, 3, 1000, mask_kind)
    adv, ret = compute_gae(torch.from_numpy(r), torch.from_numpy(v), torch.from_numpy(m), gamma, lam,
                           backend="torch", chunk_size=chunk, carry_dtype="float32")
    scale = max(float(np.abs(reference_gae(r, v, m, gamma, lam)[0]).max()), 1.0)
    assert_matches_reference(adv.numpy(), ret.numpy(), r, v, m, gamma, lam, tol=1e-5 * scale)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 4),
    steps=st.integers(1, 70),
    p_valid=st.sampled_from([0.0, 0.3, 0.9, 1.0]),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    chunk=st.integers(1, 80),
    scale=st.sampled_from([1e-3, 1.0, 100.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_backends_match_reference_property(rows, steps, p_valid, gamma, lam, chunk, scale, seed):
    rng = np.random.default_rng(seed)
    r = (rng.standard_normal((rows, steps)) * scale).astype(np.float32)
    v = (rng.standard_normal((rows, steps)) * scale).astype(np.float32)
    m = rng.random((rows, steps)) < p_valid
    adv_ref, _ = reference_gae(r, v, m, gamma, lam)
    tol = max(tolerance(gamma, lam, adv_ref / scale), 1e-5) * scale   # bounds are for unit-scale data
    for carry in ("float32", "float64"):
        assert_matches_reference(*compute_gae(r, v, m, gamma, lam, backend="numba", carry_dtype=carry),
                                 r, v, m, gamma, lam, tol=tol)
    adv, ret = compute_gae(torch.from_numpy(r), torch.from_numpy(v), torch.from_numpy(m), gamma, lam,
                           backend="torch", chunk_size=chunk)
    assert_matches_reference(adv.numpy(), ret.numpy(), r, v, m, gamma, lam, tol=tol)


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_long_sequence_at_w_one(backend):
    # T = 65536 at gamma = lam = 1: sums over the whole row; interior masks
    r, v, m = make_inputs(5, 2, 65536, "interior")
    if backend == "torch":
        adv, ret = compute_gae(torch.from_numpy(r), torch.from_numpy(v), torch.from_numpy(m), 1.0, 1.0,
                               backend="torch", chunk_size=256)
        adv, ret = adv.numpy(), ret.numpy()
    else:
        adv, ret = compute_gae(r, v, m, 1.0, 1.0, backend="numba")
    assert_matches_reference(adv, ret, r, v, m, 1.0, 1.0)


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_row_blocks_over_threads_match_one_thread(monkeypatch, threads):
    from pdsr_sdk.gae import numba_kernel

    monkeypatch.setattr(numba_kernel, "_MIN_TOKENS_PER_BLOCK", 64)   # many small blocks
    r, v, m = make_inputs(3, 29, 300, "interior")
    one = compute_gae(r, v, m, 0.99, 0.95, backend="numba", threads=1)
    for _ in range(5):   # blocks go to whichever thread asks first: repeat
        many = compute_gae(r, v, m, 0.99, 0.95, backend="numba", threads=threads)
        np.testing.assert_array_equal(one[0], many[0])
        np.testing.assert_array_equal(one[1], many[1])
    assert_matches_reference(*many, r, v, m, 0.99, 0.95)


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
