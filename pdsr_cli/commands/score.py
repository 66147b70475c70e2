"""``pdsr score``: per-token log-probs of completions under a model, micro-batched, written back as a column."""

from __future__ import annotations

import re
from pathlib import Path

import click

from pdsr_cli.common import (build_config_replacing, cli_progress, config_option, echo_status, handle_errors,
                             quiet_option, UserPathType)
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.scoring.config import ScoreConfig, score_flag

#: the default shown for a key whose default (None) means a rule
RULE_DEFAULTS = {"pack": "unpacked (the rule above)"}


def _help(name: str) -> str:
    """A flag's help: the config field's description, with each key it names in backticks (`mbs`) shown as its
    flag (--mbs), and its default (one source of truth)."""
    field = ScoreConfig.model_fields[name]
    text = re.sub(r"`([a-z_]+)`", lambda m: _flag(m.group(1)) if m.group(1) in ScoreConfig.model_fields
                  else m.group(0), field.description or "")
    if field.is_required():
        return f"{text} [required: flag or config]"
    if field.default is None:
        return f"{text} [default: {RULE_DEFAULTS[name]}]" if name in RULE_DEFAULTS else text
    default = field.default if not isinstance(field.default, bool) else str(field.default).lower()
    return f"{text} [default: {default}]"


def _flag(key: str) -> str:
    return score_flag(key)


@click.command("score")
@click.option("--model", type=UserPathType(path_type=Path), default=None, help=_help("model"))
@click.option("--data", type=UserPathType(path_type=Path), default=None, help=_help("data"))
@click.option("--out", type=UserPathType(dir_okay=False, path_type=Path), default=None, help=_help("out"))
@click.option("--overwrite", is_flag=True, default=None, help=_help("overwrite"))
@click.option("--resume", is_flag=True, default=None, help=_help("resume"))
@click.option("--block-tokens", type=int, default=None, help=_help("block_tokens"))
@click.option("--mbs", type=int, default=None, help=_help("mbs"))
@click.option("--max-tokens-per-mb", "max_tokens_per_micro_batch", type=int, default=None,
              help=_help("max_tokens_per_micro_batch"))
@click.option("--backend", default=None, help=_help("backend"))
@click.option("--column", default=None, help=_help("column"))
@click.option("--device", default=None, help=_help("device"))
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default=None,
              help=_help("dtype"))
@click.option("--prompt-column", default=None, help=_help("prompt_column"))
@click.option("--response-column", default=None, help=_help("response_column"))
@click.option("--entropy/--no-entropy", default=None, help=_help("entropy"))
@click.option("--temperature", type=float, default=None, help=_help("temperature"))
@click.option("--length-bucket", type=int, default=None, help=_help("length_bucket"))
@click.option("--row-chunk", type=int, default=None, help=_help("row_chunk"))
@click.option("--token-grouping", type=click.Choice(["length", "none"]), default=None, help=_help("token_grouping"))
@click.option("--max-padding-fraction", type=float, default=None, help=_help("max_padding_fraction"))
@click.option("--attention-mask/--no-attention-mask", default=None, help=_help("attention_mask"))
@click.option("--pack/--no-pack", default=None, help=_help("pack"))
@click.option("--packed-attention", type=click.Choice(["varlen", "model"]), default=None,
              help=_help("packed_attention"))
@click.option("--pad-id", type=int, default=None, help=_help("pad_id"))
@click.option("--vllm-max-model-len", type=int, default=None, help=_help("vllm_max_model_len"))
@click.option("--vllm-kv-cache-gib", type=float, default=None, help=_help("vllm_kv_cache_gib"))
@quiet_option
@config_option
@handle_errors
def command(config_path: Path | None, quiet: bool, **flags) -> None:
    """Score each response's tokens: log p(token | prompt, earlier response tokens).

    Reads a Parquet file with list columns of prompt and response token ids
    (what `pdsr rollout` writes), computes the per-token log-probs under the
    model (fp32 log-softmax, logits / temperature) and writes the input plus a
    list<float32> column. Micro-batching: --mbs N (fixed size; the last
    micro-batch is padded to N rows) or --max-tokens-per-mb N (token quota,
    balanced, original order restored), else a token quota of 16,384
    (verl's default; raised to the longest row); either flag replaces the
    other mode set in --config. --pack: each micro-batch is one
    row of concatenated samples (no padding; attention stays inside each
    sample), N real tokens with --max-tokens-per-mb N.

    Rows are read, scored and written in blocks (--block-tokens), so memory
    holds a block, not the file; the finished blocks of an interrupted run
    stay in <out>.parts/ and --resume continues from them.

    \b
    Example:
      pdsr score --model ./my-model --data traj.parquet --max-tokens-per-mb 8192 --out scored.parquet
      pdsr score --model ./my-model --data traj.parquet --max-tokens-per-mb 16384 --pack --out scored.parquet
      pdsr score --model ./my-model --data traj.parquet --max-tokens-per-mb 8192 --out scored.parquet --resume
    """
    from pdsr_cli.quiet import output_mode
    from pdsr_sdk.scoring.file_run import score_file

    mbs, quota = flags["mbs"], flags["max_tokens_per_micro_batch"]
    if mbs is not None and quota is not None:
        raise ConfigError(f"--mbs ({mbs}) and --max-tokens-per-mb ({quota}) are exclusive: give a fixed "
                          f"micro-batch size or a token quota, not both")
    # a mode flag replaces the other mode if the config file set it
    replaced = ("max_tokens_per_micro_batch",) if mbs is not None else ("mbs",) if quota is not None else ()
    cfg = build_config_replacing(ScoreConfig, config_path, flags, drop_from_file=replaced,
                                 required={"data": "--data", "out": "--out"})
    if cfg.model is None:
        echo_status("model: none given (--model), using the built-in tiny random model")
    with output_mode(quiet):
        path, stats = score_file(cfg, progress=cli_progress(quiet))
    extra = f" and '{cfg.column}_entropy'" if cfg.entropy else ""
    kept = f" ({stats.resumed_samples} of them scored before the resume)" if stats.resumed_samples else ""
    if not stats.samples and stats.resumed_samples:
        click.echo(f"nothing left to score: {path} has all {stats.resumed_samples} rows, column '{cfg.column}'{extra}")
        return
    at = (f" at temperature {stats.temperature:g} (the rollout's, recorded in --data)"
          if stats.rollout_temperature is not None and "temperature" not in cfg.model_fields_set else "")
    click.echo(f"wrote {path}: {stats.samples + stats.resumed_samples} rows{kept}, column '{cfg.column}'{extra}{at} "
               f"({stats.backend}, {stats.head})")
    click.echo(stats.summary())
    _warn_other_temperature(stats)


def _warn_other_temperature(stats) -> None:
    rollout = stats.rollout_temperature
    if rollout is not None and stats.temperature != rollout:
        click.echo(f"warning: temperature (--temperature) is {stats.temperature:g}, but the rollout in --data "
                   f"sampled at {rollout:g}: its response_logprobs are of logits / {rollout:g}, as verl's old and "
                   f"reference log-probs are", err=True)
