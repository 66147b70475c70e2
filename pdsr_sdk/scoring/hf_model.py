"""Loading a Hugging Face causal LM for scoring, and splitting it into decoder and lm_head.

Finding the head: ``get_output_embeddings()`` (tied embeddings share the
weight, so this is the same call) and ``get_decoder()`` / ``.model``. The
split is checked once per call against the model's own logits on a few
tokens; if no head/decoder is found, or the check fails (models that post-
process logits: soft-capping, logit scales), scoring falls back to the
model's full logits and says so in the stats (``head``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pdsr_sdk.errors import ConfigValueError, DataError
from pdsr_sdk.scoring.checkpoint import DTYPES as _DTYPES, check_model_dir

__all__ = ["resolve_device", "load_model", "model_vocab_size", "model_device", "Parts", "find_parts", "last_hidden"]


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigValueError(f"device: {device!r} requested but torch sees no CUDA device (use 'cpu' or 'auto')")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ConfigValueError(f"device: expected 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    return device


@contextlib.contextmanager
def _quiet_transformers():
    """transformers draws a weight-loading bar on stderr; the SDK never prints."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def load_model(model_dir: str | Path, device: str = "auto", dtype: str = "auto"):
    """Load a local Hugging Face causal LM for scoring (eval mode, on ``device``)."""
    import torch

    path = check_model_dir(model_dir)
    if dtype not in _DTYPES:
        raise ConfigValueError(f"dtype: expected one of {', '.join(_DTYPES)}, got {dtype!r}")
    device = resolve_device(device)
    from transformers import AutoModelForCausalLM

    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    try:
        with _quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types
        raise DataError(f"{path}: cannot load a causal LM from this directory: {exc}") from None
    return model.to(device).eval()


def model_vocab_size(model) -> int:
    """Rows of the input embedding (ids must index it) and of the output head, whichever is smaller."""
    sizes = []
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if emb is not None and hasattr(emb, "weight"):
        sizes.append(int(emb.weight.shape[0]))
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and hasattr(head, "weight"):
        sizes.append(int(head.weight.shape[0]))
    if not sizes:
        sizes.append(int(model.config.vocab_size))
    return min(sizes)


def model_device(model) -> Any:
    return next(model.parameters()).device


@dataclass
class Parts:
    """How hidden states become logits: ``decoder`` + ``head`` (chunked), or the whole model (full logits)."""

    decoder: Any
    head: Any
    description: str

    @property
    def chunked(self) -> bool:
        return self.head is not None


def find_parts(model, probe_ids: np.ndarray) -> Parts:
    """Split ``model`` into decoder and lm_head, verified on ``probe_ids`` (a short real sequence)."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    decoder = None
    if hasattr(model, "get_decoder"):
        try:
            decoder = model.get_decoder()
        except Exception:  # noqa: BLE001 - some models raise instead of returning None
            decoder = None
    if decoder is None:
        decoder = getattr(model, "model", None)
    if head is None or decoder is None or decoder is model:
        return Parts(None, None, "full logits (no separate decoder and lm_head found)")
    ids = torch.as_tensor(probe_ids[None, :], device=model_device(model))
    with torch.inference_mode():
        expected = model(input_ids=ids, use_cache=False).logits
        got = head(last_hidden(decoder(input_ids=ids, use_cache=False, return_dict=True)))
    if got.shape != expected.shape:
        return Parts(None, None, f"full logits (lm_head gives shape {tuple(got.shape)}, model {tuple(expected.shape)})")
    eps = torch.finfo(expected.dtype).eps
    scale = float(expected.float().abs().max()) + 1.0
    err = float((got.float() - expected.float()).abs().max())
    if not err <= 16 * eps * scale:
        return Parts(None, None, f"full logits (decoder + lm_head differ from the model's logits by {err:.3g}: "
                                 f"the model post-processes its logits)")
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    return Parts(decoder, head, "chunked lm_head" + (" (tied embeddings)" if tied else ""))


def last_hidden(out) -> Any:
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
