"""GAE backends against the float64 reference (numba, torch chunk scan, triton), on every mask kind."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from gae_inputs import GAMMA_LAM, MASKS, SHAPES, assert_matches_reference, make_inputs, seed_of, tolerance  # noqa: E402

from pdsr_sdk.errors import ConfigError  # noqa: E402
from pdsr_sdk.gae import compute_gae  # noqa: E402
from pdsr_sdk.gae.numba_kernel import numba_gae  # noqa: E402
from pdsr_sdk.gae.reference import reference_gae  # noqa: E402
from support import ROOT  # noqa: E402


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
