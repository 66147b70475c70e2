"""The built-in tiny model: a random 4-layer Qwen2 with a byte-level BPE tokenizer.

Built offline in a few seconds (no hub download), deterministic for a given
version, cached under the pdsr cache directory. It lets a fresh machine run
every path (rollout on vLLM, scoring, simulation calibration) end to end.
Its text is random; its lengths are what a random model gives.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

#: bump when the recipe changes so cached copies are rebuilt
TINY_MODEL_VERSION = 2

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def cache_dir() -> Path:
    """pdsr's cache directory: ``$PDSR_CACHE_DIR`` or ``~/.cache/pdsr``."""
    root = os.environ.get("PDSR_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "pdsr"


def default_tiny_model_dir() -> Path:
    """Where the built-in tiny model is built (once, no download): ``<cache_dir()>/models/tiny-qwen2-v<version>``."""
    return cache_dir() / "models" / f"tiny-qwen2-v{TINY_MODEL_VERSION}"


def ensure_tiny_model(path: str | Path | None = None, *, vocab_size: int = 1024) -> Path:
    """Return a directory holding the tiny model, building it there first if needed."""
    target = Path(path) if path is not None else default_tiny_model_dir()
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target and rename, so a crash never leaves half a model.
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-build-", dir=target.parent))
    try:
        build_tiny_model(tmp, vocab_size=vocab_size)
        tmp.chmod(0o755)  # mkdtemp makes it private
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").exists():  # lost a race only if someone else finished
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _training_text() -> list[str]:
    """Local text for the tokenizer: English, arithmetic and LaTeX-ish math."""
    words = ("the a of to and in is that for it as with was on be by this are or from at which "
             "solve find compute answer number value equation sum product prime triangle circle area "
             "let then so therefore since because step first second third final box result").split()
    lines = []
    for i in range(400):
        a, b = (i * 37) % 97 + 1, (i * 53) % 89 + 2
        sentence = " ".join(words[(i * k) % len(words)] for k in range(1, 12))
        lines.append(f"{sentence.capitalize()}. What is {a} + {b}? We get {a} + {b} = {a + b}.")
        lines.append(f"Solve $x^{2} + {a}x = {b}$. Then \\frac{{{a}}}{{{b}}} and \\boxed{{{a * b}}}.")
    return lines


def build_tiny_model(out_dir: str | Path, *, vocab_size: int = 1024, hidden_size: int = 256,
                     num_layers: int = 4, max_positions: int = 8192, seed: int = 0) -> Path:
    """Train a byte-level BPE tokenizer on local text and save a random Qwen2 with it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_training_text(), trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf_tok.chat_template = CHAT_TEMPLATE

    config = Qwen2Config(
        vocab_size=len(hf_tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_positions, eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id, bos_token_id=None, tie_word_embeddings=True,
        # wide init: greedy decoding wanders instead of repeating one token, so
        # continuation tests compare real sequences
        initializer_range=0.1,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out_dir)
    hf_tok.save_pretrained(out_dir)
    return out_dir
