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

The same CPU path verifies drafts with top-k alone (top_p 1) through ``apply_top_k_only``, which takes ``k.max()``
and fails on an engine step where no request drafted (vLLM runs the rejection sampler over zero drafted tokens
then): ``RuntimeError: max(): Expected reduction dim to be specified for input.numel() == 0``, and the engine
core dies, on the first such step of a run with ``--top-k`` and speculation. :func:`top_k_only_taking_no_rows`
returns zero rows as they are.
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


def top_k_only_taking_no_rows(apply_top_k_only: Any) -> Any:
    """vLLM's ``apply_top_k_only(logits, k)``, returning ``logits`` of zero rows as they are."""
    def apply(logits: Any, k: Any) -> Any:
        if logits.shape[0] == 0:
            return logits
        return apply_top_k_only(logits, k)

    apply.pdsr_wrapped = apply_top_k_only
    return apply


def apply_cpu_sampler_fix() -> bool:
    """Use :func:`expand_kernel_impl` for vLLM's CPU fallback of ``expand_kernel``, and
    :func:`top_k_only_taking_no_rows` for its CPU top-k (in the process that registers the fallbacks: vLLM's
    worker, which loads the plugins first). True if applied."""
    try:
        from vllm.triton_utils import HAS_TRITON
    except Exception:  # noqa: BLE001 - no vLLM here
        return False
    if HAS_TRITON:
        return False   # the Triton kernels run (GPUs, or Triton's CPU backend): nothing to replace
    try:
        from vllm.utils import cpu_triton_utils
    except Exception:  # noqa: BLE001 - not a CPU build
        return False
    if not hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        return False
    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    try:
        from vllm.v1.sample.ops import topk_topp_sampler
    except Exception:  # noqa: BLE001 - a vLLM without it: the expansion is fixed all the same
        return True
    top_k = getattr(topk_topp_sampler, "apply_top_k_only", None)
    if top_k is not None and not hasattr(top_k, "pdsr_wrapped"):
        topk_topp_sampler.apply_top_k_only = top_k_only_taking_no_rows(top_k)
    return True
