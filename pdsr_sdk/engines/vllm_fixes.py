"""Fixes to the installed vLLM, applied in its processes by pdsr's plugin (see vllm_plugin.py).

vLLM 0.32's CPU build replaces the rejection sampler's Triton ``expand_kernel`` (which spreads each
request's temperature, top-k and top-p over its drafted tokens) by ``_expand_kernel_impl`` in
``vllm/utils/cpu_triton_utils.py``. That one hands int64 copies of its tensors to a C++ kernel: for the
float32 temperature and top-p the kernel fills a copy (of values already cut to integers) and the real
output, made with ``new_empty``, keeps whatever memory it had. So with speculative decoding and random
sampling each drafted position is verified, and sampled, at an arbitrary temperature: tokens the model
gives e^-19 come out, and the log-probs reported are NaN, 0 or -log(vocab) (tests/engines/
test_speculative_vllm.py found it). Greedy requests never reach it. :func:`expand_kernel_impl` is the
same expansion in torch, for every dtype.
"""

from __future__ import annotations

from typing import Any


def expand_kernel_impl(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any,
                       MAX_NUM_TOKENS: Any = None) -> None:   # noqa: N803 - the kernel's argument name
    """``output[start_i:end_i] = input_val[i]`` (``replace_to`` where it equals ``replace_from``), with
    ``end_i = cu_num_tokens[i]``: what vLLM's ``expand_kernel`` does, in ``output``'s own dtype."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    if ends.numel() == 0:
        return
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = input_val.clone()
    values[input_val == replace_from] = replace_to
    output[:int(ends[-1])] = values.repeat_interleave(counts).to(output.dtype)


def apply_cpu_sampler_fix() -> bool:
    """Use :func:`expand_kernel_impl` for vLLM's CPU fallback of ``expand_kernel`` (in the process that
    registers the fallbacks: vLLM's worker, which loads the plugins first). True if applied."""
    try:
        from vllm.triton_utils import HAS_TRITON
    except Exception:  # noqa: BLE001 - no vLLM here
        return False
    if HAS_TRITON:
        return False   # the Triton kernel runs (GPUs, or Triton's CPU backend): nothing to replace
    try:
        from vllm.utils import cpu_triton_utils
    except Exception:  # noqa: BLE001 - not a CPU build
        return False
    if not hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        return False
    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    return True
