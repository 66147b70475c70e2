"""The rollout's tokenizer: a Hugging Face tokenizer from a local folder, with errors that say what the folder lacks."""

from __future__ import annotations

from pathlib import Path

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.paths import user_path

__all__ = ["load_tokenizer"]


def load_tokenizer(path: str | Path, setting: str | None = None):
    """A Hugging Face tokenizer from a local directory, with a clear error when it is not one; ``setting`` (a flag,
    such as ``--tokenizer``) is what the user set to it, named in the errors (default: the rollout's tokenizer)."""
    path = user_path(path)
    where = f"{setting} {path}" if setting else str(path)
    setting = setting or "tokenizer (RolloutConfig.tokenizer)"
    if path.is_file():
        raise DataError(f"{where}: is a file; expected a model or tokenizer folder (with tokenizer.json, ...)")
    if not path.is_dir():
        raise DataError(f"{where}: model/tokenizer directory does not exist")
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - transformers raises many types
        if not any((path / name).is_file() for name in ("config.json", "tokenizer_config.json", "tokenizer.json")):
            # transformers' own words here are a paragraph about slow tokenizers and sentencepiece
            raise DataError(f"{where}: not a model or tokenizer folder (no config.json, tokenizer_config.json or "
                            f"tokenizer.json in it)") from None
        raise DataError(f"{where}: cannot load a tokenizer: {exc}") from None
    if not tokenizer.encode("a b", add_special_tokens=False):
        # transformers builds an empty tokenizer from config.json alone (no tokenizer.json, tokenizer.model or vocab
        # files): every prompt would tokenize to nothing
        raise DataError(f"{where}: no tokenizer files in it (tokenizer.json, tokenizer.model, vocab.json, ...): the "
                        f"tokenizer read from it has {len(tokenizer)} token(s) and encodes text to nothing; copy the "
                        f"model's tokenizer files there, or set {setting} to a folder "
                        f"that has them")
    return tokenizer
