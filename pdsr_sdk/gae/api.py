"""``compute_gae``: input checks, backend choice and array-kind plumbing.

The numerics live in the backend modules (``reference``, ``numba_kernel``,
``torch_chunk_scan``); this module only validates, converts between numpy
and torch where a backend needs the other kind, and dispatches. See the
package docstring (:mod:`pdsr_sdk.gae`) for the exact semantics.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pdsr_sdk.errors import ConfigValueError, DataValueError
from pdsr_sdk.gae.inputs import check_unit_interval
from pdsr_sdk.registry import Registry

CARRY_DTYPES = ("auto", "float32", "float64")


@runtime_checkable
class GaeBackend(Protocol):
    """One GAE implementation, registered by name in :data:`GAE_BACKENDS`.

    :func:`compute_gae` instantiates the registered class with no arguments
    on every call, so keep ``__init__`` cheap (import heavy modules in the
    methods).
    """

    #: ``"numpy"`` or ``"torch"``: the array kind :meth:`compute` receives.
    #: compute_gae converts the caller's arrays to this kind (zero-copy for
    #: CPU memory) and converts the results back.
    array_kind: str

    def warmup(self, dtype: str, carry_dtype: str) -> None:
        """Called before timed work (``pdsr gae``, ``bench/gae.py``), never by
        compute_gae itself: compile or load kernels for data of ``dtype``
        ("float32"/"float64") and ``carry_dtype`` ("auto"/"float32"/"float64")
        so that the next compute() is warm. May be a no-op."""

    def compute(self, rewards: Any, values: Any, mask: Any, *, gamma: float, lam: float,
                chunk_size: int, carry_dtype: str, threads: int | None,
                out: tuple[Any, Any] | None) -> tuple[Any, Any]:
        """Called once per compute_gae call, after validation, with [B, T]
        arrays of ``array_kind`` (``carry_dtype`` may be "auto": the backend's
        default precision): rewards and values of one float dtype
        (float32 or float64), C-contiguous for numpy; mask of any dtype
        (nonzero = valid; bool for torch). ``out`` is None or two
        arrays of the same kind, shape and dtype to write advantages and
        returns into; when given, return exactly those objects.
        Returns ``(advantages, returns)``."""


#: name -> backend class (lazy import paths). ``auto`` is resolved by
#: :func:`compute_gae`: ``triton`` for CUDA tensors when triton is installed,
#: else ``torch`` for CUDA tensors, ``numba`` otherwise.
GAE_BACKENDS: Registry[type] = Registry("GAE backend",
                                        register_hint="pdsr_sdk.gae.GAE_BACKENDS.register('name', MyBackend)")
GAE_BACKENDS.register("reference", "pdsr_sdk.gae.reference:ReferenceGae")
GAE_BACKENDS.register("numba", "pdsr_sdk.gae.numba_kernel:NumbaGae")
GAE_BACKENDS.register("torch", "pdsr_sdk.gae.torch_chunk_scan:TorchChunkScanGae")
GAE_BACKENDS.register("triton", "pdsr_sdk.gae.triton_backend:TritonGae")


def compute_gae(rewards: Any, values: Any, mask: Any, gamma: float, lam: float, *,
                backend: str = "auto", chunk_size: int = 256, out: tuple[Any, Any] | None = None,
                carry_dtype: str = "auto", threads: int | None = None) -> tuple[Any, Any]:
    """Generalized advantage estimation over [B, T] arrays; returns ``(advantages, returns)``.

    Args:
        rewards, values: [B, T] float arrays, all numpy or all torch tensors
            (float32 or float64; float16/bfloat16 are computed in float32).
        mask: [B, T] response mask (bool or numeric, nonzero = valid token),
            or None for "every token is valid".
        gamma, lam: discount and GAE lambda, each in [0, 1].
        backend: ``"auto"`` (triton for CUDA tensors when triton is installed,
            else torch for CUDA tensors; numba otherwise), a name
            in :data:`GAE_BACKENDS`, or an import path ``"pkg.mod:Class"``.
        chunk_size: chunk length C of the torch chunk-scan (ignored by others).
        out: optional ``(advantages, returns)`` buffers of the input's kind,
            shape and result dtype; they are filled and returned (no new
            output allocation). They may alias ``rewards``/``values``.
        carry_dtype: precision of the recurrence state: "float32", "float64"
            or "auto" (default), the backend's choice. numba: the data's
            dtype; for float32 data that is a sequential float32 recurrence
            like verl's torch loop, within ~3e-6 * max|A| even at
            gamma*lam = 1 over T = 131072 (float64 costs ~1.5x). torch:
            float64, because float32 matmuls lose more (see
            :mod:`pdsr_sdk.gae.torch_chunk_scan`). triton: the data's dtype
            (its tile scans round like a tree, not like a C-term matmul). The reference backend
            always uses float64.
        threads: CPU threads for the numba backend (None = all available).

    The result has the kind (numpy/torch), device and float dtype of the
    inputs. Bad shapes or dtypes raise :class:`~pdsr_sdk.errors.DataValueError`, bad parameters
    :class:`~pdsr_sdk.errors.ConfigValueError` (both also ValueErrors).
    """
    _check_params(gamma, lam, chunk_size, carry_dtype, threads)
    kind = _array_kind(rewards, values, mask)
    if kind == "torch":
        return _compute_torch(rewards, values, mask, float(gamma), float(lam), backend,
                              int(chunk_size), carry_dtype, threads, out)
    return _compute_numpy(rewards, values, mask, float(gamma), float(lam), backend,
                          int(chunk_size), carry_dtype, threads, out)


def get_backend(name: str) -> GaeBackend:
    """Instantiate the backend registered as ``name`` (``auto`` is not resolved here)."""
    impl = GAE_BACKENDS.get(name)
    return impl() if isinstance(impl, type) else impl


def resolve_backend_name(name: str, *, cuda: bool = False) -> str:
    """``auto`` -> ``triton`` for CUDA data when triton is importable (else ``torch``),
    ``numba`` otherwise; other names pass through."""
    if name == "auto":
        if not cuda:
            return "numba"
        return "triton" if triton_available() else "torch"
    return name


def triton_available() -> bool:
    """Whether triton can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


# --------------------------------------------------------------------------- checks

def _check_params(gamma: Any, lam: Any, chunk_size: Any, carry_dtype: Any, threads: Any) -> None:
    for key, value in (("gamma", gamma), ("lam", lam)):
        check_unit_interval(key, value)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ConfigValueError(f"chunk_size: expected an integer >= 1, got {chunk_size!r}")
    if str(carry_dtype) not in CARRY_DTYPES:
        raise ConfigValueError(f"carry_dtype: expected one of {', '.join(CARRY_DTYPES)}, got {carry_dtype!r}")
    if threads is not None and (not isinstance(threads, (int, np.integer)) or threads < 1):
        raise ConfigValueError(f"threads: expected None or an integer >= 1, got {threads!r}")


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    return torch is not None and isinstance(x, torch.Tensor)


def _array_kind(rewards: Any, values: Any, mask: Any) -> str:
    named = [("rewards", rewards), ("values", values)] + ([("mask", mask)] if mask is not None else [])
    kinds = {name: ("torch" if _is_tensor(x) else "numpy") for name, x in named}
    if len(set(kinds.values())) > 1:
        listing = ", ".join(f"{k}={v}" for k, v in kinds.items())
        raise DataValueError(f"rewards, values and mask must all be numpy arrays or all torch tensors; got {listing}")
    return kinds["rewards"]


def _check_shapes(rewards: Any, values: Any, mask: Any) -> tuple[int, int]:
    shape = tuple(rewards.shape)
    if len(shape) != 2:
        raise DataValueError(f"rewards must be a 2-D [B, T] array, got shape {shape} "
                        f"(for one sequence use rewards[None], values[None], mask[None])")
    for name, x in (("values", values), ("mask", mask)):
        if x is not None and tuple(x.shape) != shape:
            raise DataValueError(f"{name} has shape {tuple(x.shape)}, expected the shape of rewards {shape}")
    return shape[0], shape[1]


def _check_out(out: Any, kind: str, shape: tuple[int, int], dtype: Any, device: Any = None) -> None:
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise DataValueError(f"out must be a pair (advantages, returns) of buffers, got {type(out).__name__}")
    for name, buf in zip(("out[0] (advantages)", "out[1] (returns)"), out):
        buf_kind = "torch" if _is_tensor(buf) else ("numpy" if isinstance(buf, np.ndarray) else type(buf).__name__)
        if buf_kind != kind:
            raise DataValueError(f"{name} must be a {kind} array like the inputs, got {buf_kind}")
        if tuple(buf.shape) != shape:
            raise DataValueError(f"{name} has shape {tuple(buf.shape)}, expected {shape}")
        if buf.dtype != dtype:
            raise DataValueError(f"{name} has dtype {buf.dtype}, expected {dtype} (the result dtype)")
        if kind == "numpy" and not (buf.flags.c_contiguous and buf.flags.writeable):
            raise DataValueError(f"{name} must be a writeable C-contiguous array")
        if kind == "torch" and buf.device != device:
            raise DataValueError(f"{name} is on {buf.device}, expected the inputs' device {device}")
    if out[0] is out[1]:
        raise DataValueError("out[0] and out[1] must be two different buffers")


# --------------------------------------------------------------------------- numpy inputs

def _numpy_float(x: np.ndarray, name: str) -> np.ndarray:
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise DataValueError(f"{name} must be a float array, got dtype {x.dtype}")
    return x


def _compute_numpy(rewards, values, mask, gamma, lam, backend, chunk_size, carry_dtype, threads, out):
    rewards = _numpy_float(np.asarray(rewards), "rewards")
    values = _numpy_float(np.asarray(values), "values")
    mask = None if mask is None else np.asarray(mask)
    if mask is not None and not (mask.dtype == np.bool_ or np.issubdtype(mask.dtype, np.number)):
        raise DataValueError(f"mask must be a bool or numeric array (nonzero = valid), got dtype {mask.dtype}")
    shape = _check_shapes(rewards, values, mask)
    dtype = np.result_type(rewards.dtype, values.dtype)
    dtype = np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
    rewards = np.ascontiguousarray(rewards, dtype=dtype)
    values = np.ascontiguousarray(values, dtype=dtype)
    mask = np.ones(shape, dtype=np.bool_) if mask is None else np.ascontiguousarray(mask)
    if out is not None:
        _check_out(out, "numpy", shape, dtype)
    impl = get_backend(resolve_backend_name(backend, cuda=False))
    if impl.array_kind == "numpy":
        return impl.compute(rewards, values, mask, gamma=gamma, lam=lam, chunk_size=chunk_size,
                            carry_dtype=carry_dtype, threads=threads, out=None if out is None else tuple(out))
    import torch

    t_out = None if out is None else (torch.from_numpy(out[0]), torch.from_numpy(out[1]))
    adv, ret = impl.compute(torch.from_numpy(rewards), torch.from_numpy(values), torch.from_numpy(mask != 0),
                            gamma=gamma, lam=lam, chunk_size=chunk_size, carry_dtype=carry_dtype,
                            threads=threads, out=t_out)
    if out is not None:
        return out[0], out[1]
    return adv.numpy(), ret.numpy()


# --------------------------------------------------------------------------- torch inputs

def _compute_torch(rewards, values, mask, gamma, lam, backend, chunk_size, carry_dtype, threads, out):
    import torch

    for name, x in (("rewards", rewards), ("values", values)):
        if x.dtype == torch.bool or x.dtype.is_complex:
            raise DataValueError(f"{name} must be a float tensor, got dtype {x.dtype}")
    if mask is not None and mask.dtype.is_complex:
        raise DataValueError(f"mask must be a bool or numeric tensor (nonzero = valid), got dtype {mask.dtype}")
    shape = _check_shapes(rewards, values, mask)
    if values.device != rewards.device or (mask is not None and mask.device != rewards.device):
        raise DataValueError(f"rewards, values and mask must be on one device; got {rewards.device}, {values.device}"
                        + (f", {mask.device}" if mask is not None else ""))
    device = rewards.device
    dtype = torch.float64 if torch.float64 in (rewards.dtype, values.dtype) else torch.float32
    if out is not None:
        _check_out(out, "torch", shape, dtype, device)
    with torch.no_grad():
        rewards = rewards.detach().to(dtype)
        values = values.detach().to(dtype)
        mask = torch.ones(shape, dtype=torch.bool, device=device) if mask is None else mask.detach()
        impl = get_backend(resolve_backend_name(backend, cuda=device.type == "cuda"))
        if impl.array_kind == "torch":
            valid = mask if mask.dtype == torch.bool else mask != 0
            return impl.compute(rewards.contiguous(), values.contiguous(), valid.contiguous(), gamma=gamma,
                                lam=lam, chunk_size=chunk_size, carry_dtype=carry_dtype, threads=threads,
                                out=None if out is None else tuple(out))
        # a numpy backend on tensors: zero-copy views for CPU memory, copies otherwise
        np_out = None
        if out is not None and all(b.device.type == "cpu" and b.is_contiguous() for b in out):
            np_out = (out[0].numpy(), out[1].numpy())
        mask_np = mask.cpu().numpy() if mask.dtype != torch.bfloat16 else (mask != 0).cpu().numpy()
        adv, ret = impl.compute(np.ascontiguousarray(rewards.cpu().numpy()), np.ascontiguousarray(values.cpu().numpy()),
                                np.ascontiguousarray(mask_np), gamma=gamma, lam=lam, chunk_size=chunk_size,
                                carry_dtype=carry_dtype, threads=threads, out=np_out)
        if out is not None:
            if np_out is None:
                out[0].copy_(torch.from_numpy(adv))
                out[1].copy_(torch.from_numpy(ret))
            return out[0], out[1]
        return torch.from_numpy(adv).to(device), torch.from_numpy(ret).to(device)
