"""``backend="triton"``: the registry entry of the fused Triton GAE kernel.

A light module (no triton or torch import at module level): the kernels
live in :mod:`pdsr_sdk.gae.triton_kernel`, imported on first use.
"""

from __future__ import annotations

from pdsr_sdk.gae.triton_check import check_device


class TritonGae:
    """``backend="triton"``: one fused chunked-scan kernel over CUDA tensors
    (:func:`pdsr_sdk.gae.triton_kernel.triton_gae`); CPU tensors only under
    Triton's interpreter."""

    array_kind = "torch"

    def warmup(self, dtype: str, carry_dtype: str) -> None:
        """Compile the kernels for this dtype pair on the current CUDA device (no-op without CUDA)."""
        import torch

        if not torch.cuda.is_available():
            return
        from pdsr_sdk.gae.triton_kernel import DEFAULT_BLOCK, triton_gae

        steps = 2 * DEFAULT_BLOCK
        tiny = torch.zeros((1, steps), dtype=getattr(torch, dtype), device="cuda")
        ones = torch.ones((1, steps), dtype=torch.bool, device="cuda")
        triton_gae(tiny, tiny, ones, 1.0, 1.0, carry_dtype=carry_dtype, segments=1)
        triton_gae(tiny, tiny, ones, 1.0, 1.0, carry_dtype=carry_dtype, segments=2)   # + the summary kernel
        torch.cuda.synchronize()

    def compute(self, rewards, values, mask, *, gamma, lam, chunk_size, carry_dtype, threads, out):
        check_device(rewards.device)
        from pdsr_sdk.gae.triton_kernel import triton_gae

        return triton_gae(rewards, values, mask, gamma, lam, carry_dtype=carry_dtype, out=out)
