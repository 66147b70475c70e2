"""Checks of a rollout that need no engine, made before any starts: outputs, option conflicts, prompt lengths
against the model's context. (Data columns: :mod:`pdsr_sdk.rollout.data`; the run being resumed:
:mod:`pdsr_sdk.rollout.resume`.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from pdsr_sdk.errors import ConfigError, DataError
from pdsr_sdk.io.output_lock import parts_dir
from pdsr_sdk.io.tables import check_distinct, check_writable
from pdsr_sdk.models.context import POSITION_KEYS, model_context  # noqa: F401 - here before models/context.py
from pdsr_sdk.rollout.resume import check_resume_options
from pdsr_sdk.rollout.writer import existing_files

#: the ``pdsr rollout`` flag of each agent setting that has one (the others are config keys only)
AGENT_FLAGS = {"function": "--agent", "max_turns": "--max-turns", "turn_max_tokens": "--turn-max-tokens",
               "env_timeout_s": "--agent-timeout"}


def check_agent_settings(config) -> None:
    """A ConfigError naming the agent settings (``agent.max_turns``, ...) given a value other than their default
    while ``agent.function`` is unset: a run without an agent would ignore them. (A trainer's ``RolloutSession``
    may take its agent in Python and ``pdsr serve`` runs named samples with these limits: only a rollout run,
    which has no other agent, checks this.)"""
    agent = config.agent
    if agent.function is not None:
        return
    given = [name for name, field in type(agent).model_fields.items()
             if name != "function" and getattr(agent, name) != field.get_default(call_default_factory=True)]
    if given:
        named = [f"agent.{name} ({AGENT_FLAGS[name]})" if name in AGENT_FLAGS else f"agent.{name}"
                 for name in given]
        raise ConfigError(f"{', '.join(named)}: multi-turn settings, and this run is single-turn (agent.function is "
                          f"unset); pass --agent PKG.MOD:FN (or set agent.function in the config) or leave them out")


def summary_path(config) -> Path:
    out = config.output
    return out.summary_path or out.path.with_name(out.path.stem + ".summary.json")


def filtered_path(config) -> Path | None:
    """Where ``pdsr rollout`` writes the groups dynamic sampling filtered out (``filter_groups.write_filtered``):
    ``<output stem>.filtered<suffix>``; None when it does not write them."""
    if config.filter_groups is None or not config.filter_groups.write_filtered:
        return None
    out = config.output.path
    return out.with_name(f"{out.stem}.filtered{out.suffix}")


def check_outputs(config) -> None:
    """Option conflicts, an existing output, and outputs that cannot be written: errors naming the flag."""
    out = config.output
    check_resume_options(config)
    summary = summary_path(config)
    check_distinct(out.path, "--out", [("--summary", summary), ("--data", config.data.path)])
    check_distinct(summary, "--summary", [("--data", config.data.path)])   # the summary would replace the data
    if filtered_path(config) is not None:
        check_distinct(filtered_path(config), "--write-filtered's output", [("--summary", summary),
                                                                           ("--data", config.data.path)])
    check_writable(out.path, "output.path (--out)")
    parts = parts_dir(out.path)
    if parts.exists() and not parts.is_dir():
        raise DataError(f"output.path (--out) {out.path}: {parts} is a file; streaming needs it to be a folder")
    check_writable(summary, "output.summary_path (--summary)")
    for path in (out.path, filtered_path(config)):
        if path is not None and existing_files(path) and not (out.resume or out.overwrite):
            raise DataError(f"{path}: output already exists (or an interrupted run left {path.name}.parts/); "
                            f"pass --resume to continue it or --overwrite to replace it")


def check_model_folder(model: str | Path) -> str:
    """``model`` if it is a local Hugging Face model folder (one with a config.json); else a DataError naming it, which
    says what to do with a hub id (pdsr loads local folders only: vLLM would look the id up on the hub while pdsr's
    tokenizer would not, so an id fails either way, deep in an engine's start-up when offline)."""
    path = Path(model)
    if (path / "config.json").is_file():
        return str(path)
    what = ("does not exist" if not path.exists() else "is a file, not a model directory" if path.is_file()
            else "is not a model directory (no config.json in it)")
    hint = ""
    # ORG/NAME may be a hub id; not where ORG is a folder here (a typo in models/smollm2-135m-instruct, say)
    if not path.exists() and len(path.parts) == 2 and not str(model).startswith((".", "/", "~")) \
            and not path.parent.is_dir():
        hint = (f"; if it is a Hugging Face hub id: pdsr loads local folders only, so download it first "
                f"(huggingface-cli download {model} --local-dir DIR) and pass DIR")
    raise DataError(f"model (--model) {str(model)!r} {what}; pass a local Hugging Face model folder{hint}")


#: engine backends that load the model folder themselves (vLLM's): the folder and its tokenizer are checked for them
MODEL_BACKENDS = ("vllm", "ray")


def check_engine_model(config, specs: list, model_dir: str, tokenizer: Callable[[], Any]) -> list:
    """Before a session builds vLLM engines: ``model_dir`` is a model folder, and ``tokenizer()`` loads its tokenizer
    (so a hub id or a folder without tokenizer files is named now, not in an engine's start-up or at the first
    prompt); a stop token id outside its vocabulary is an error; an engine's max_model_len above the model's context is
    an error naming the key that set it, or, the default's, lowered to that context (vLLM refuses either at start-up).
    Returns ``specs`` so lowered. Engines of other backends (your own: a remote server's model name) are left to
    themselves."""
    if not any(s.backend in MODEL_BACKENDS for s in specs):
        return specs
    check_model_folder(model_dir)
    vocab = model_vocab(tokenizer(), model_dir)
    outside = [t for t in config.sampling.stop_token_ids if t >= vocab]
    if outside:   # vLLM takes it and never meets it: a response meant to end there runs to max_tokens
        raise ConfigError(f"sampling.stop_token_ids: {outside[0]} is not a token of the model (its ids are 0 to "
                          f"{vocab - 1}), so it would never end a response")
    limit, source = model_context(model_dir)
    if limit is None or os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").lower() in ("1", "true"):
        return specs
    out = []
    for i, spec in enumerate(specs):
        if spec.backend in MODEL_BACKENDS and spec.max_model_len > limit:
            key = (f"engines[{i}].max_model_len" if config.engines else "engine_defaults.max_model_len"
                   if "max_model_len" in config.engine_defaults else None)
            if key is not None:
                raise ConfigError(f"{key}: {spec.max_model_len} is above the model's context of {limit} tokens "
                                  f"({source}), which vLLM refuses; lower it (or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, "
                                  f"vLLM's override, for a model that extrapolates)")
            spec = spec.model_copy(update={"max_model_len": limit})
        out.append(spec)
    return out


def context_limit(config, model_dir: str, engines: list | None = None) -> tuple[int | None, str]:
    """The most tokens (prompt + response) a request may have on this run's engines, and its source."""
    limits = []
    if engines is not None:   # already started: their own limits
        limits = [(e.spec.max_model_len, f"max_model_len of engine {e.spec.name!r}") for e in engines
                  if getattr(e, "spec", None) is not None]
        return min(limits, default=(None, ""))
    if config.engines:
        limits = [(s.max_model_len, f"engines[{i}].max_model_len") for i, s in enumerate(config.engines)]
    elif isinstance(config.engine_defaults.get("max_model_len"), int):
        limits = [(config.engine_defaults["max_model_len"], "engine_defaults.max_model_len")]
    limit, source = model_context(model_dir)
    if limit is not None:
        limits.append((limit, source))
    return min(limits, default=(None, ""))


def split_long_prompts(records: list, config, limit: int | None, source: str, data_path,
                       total: int | None = None) -> tuple[list, list]:
    """(records that fit, records skipped by ``data.skip_long``); a prompt whose tokens plus its response
    budget exceed ``limit`` is an error naming its row unless ``data.skip_long``. ``total``: the data's prompts in
    all (``records`` may leave out those a resume finds done); when every one is too long, skipping them would run
    nothing, which is an error naming the shortest."""
    if limit is None:
        return records, []
    max_tokens = config.sampling.max_tokens
    if max_tokens + 1 > limit and not any(r.target_lengths for r in records):
        raise ConfigError(f"sampling.max_tokens (--max-tokens) is {max_tokens} but the context is {limit} tokens "
                          f"({source}): no prompt fits; lower --max-tokens below {limit}")

    def budget(r) -> int:
        return max(r.target_lengths) if r.target_lengths else max_tokens

    long = [r for r in records if len(r.token_ids) + budget(r) > limit]
    if long and len(long) == (total if total is not None else len(records)):
        r = min(long, key=lambda r: len(r.token_ids) + budget(r))
        raise DataError(f"{data_path}: every prompt ({len(long)}) with its response exceeds the context of {limit} "
                        f"tokens ({source}), so data.skip_long (--skip-long) would leave nothing to run; the shortest, "
                        f"row {r.row} (prompt id {r.prompt_id!r}), has {len(r.token_ids)} prompt tokens + {budget(r)}. "
                        f"Lower --max-tokens")
    if long and not config.data.skip_long:
        r = long[0]
        what = "forced response tokens (--target-lengths-column)" if r.target_lengths else "--max-tokens"
        raise DataError(f"{data_path}: row {r.row} (prompt id {r.prompt_id!r}): {len(r.token_ids)} prompt tokens + "
                        f"{budget(r)} {what} = {len(r.token_ids) + budget(r)} exceed the context of {limit} tokens "
                        f"({source}); {len(long)} row(s) in all. Pass data.skip_long (--skip-long) to skip them, "
                        f"or lower --max-tokens")
    skipped = {id(r) for r in long}
    return [r for r in records if id(r) not in skipped], long


#: a session's engines get ``sampling.max_tokens`` plus this many tokens of context (their max_model_len) unless
#: the config sets one (``engine_defaults.max_model_len``, ``engines[i].max_model_len``): room for the prompt
SESSION_PROMPT_ROOM = 1024


def model_vocab_size(model_dir: str | Path) -> int | None:
    """The model's vocabulary size from its config.json (``vocab_size``, also under ``text_config``); None if it
    names none."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for where in (cfg, cfg.get("text_config") or {}):
        if isinstance(where.get("vocab_size"), int) and where["vocab_size"] > 0:
            return where["vocab_size"]
    return None


def model_vocab(tokenizer, model_dir: str | Path) -> int:
    """The ids a model takes: the larger of its tokenizer's size and its config's vocabulary, as vLLM takes it."""
    return max(len(tokenizer), model_vocab_size(model_dir) or 0)


def session_context(config, engines: list, given: bool) -> tuple[int | None, str]:
    """The longest context (prompt + response) a session's engines take, and what sets it, said as the setting
    that raises it (for the error naming a prompt too long)."""
    specs = [(e.spec.max_model_len, e.spec.name) for e in engines if getattr(e, "spec", None) is not None
             and isinstance(getattr(e.spec, "max_model_len", None), int)]
    if not specs:
        return None, ""
    limit, name = min(specs)
    if given:
        return limit, (f"the max_model_len of engine {name!r} (engines passed to the session: start them with a "
                       "longer one)")
    if config.engines:
        i = next(i for i, s in enumerate(config.engines) if s.name == name)
        return limit, f"engines[{i}].max_model_len"
    if isinstance(config.engine_defaults.get("max_model_len"), int):
        return limit, "engine_defaults.max_model_len"
    return limit, (f"the session's default, sampling.max_tokens + {SESSION_PROMPT_ROOM}; raise it with "
                   f"engine_defaults={{'max_model_len': ...}}")


def prompt_limits(config, tokenizer, model_dir: str, engines: list, given: bool) -> tuple[int, int | None, str]:
    """What :func:`check_prompt_ids` checks a session's prompts against: (vocabulary size: the larger of the
    tokenizer's and the model's, as vLLM takes it; context limit; what sets the limit)."""
    return (model_vocab(tokenizer, model_dir), *session_context(config, engines, given))


def check_prompt_ids(records: list, *, vocab: int | None, limit: int | None, source: str, max_tokens: int,
                     where: str) -> None:
    """Every record's token ids are a non-empty list of ints in ``[0, vocab)`` whose count plus the response budget
    (``max_tokens``, or its forced lengths) fits ``limit``: a DataError naming the prompt id otherwise, before
    anything reaches an engine (which would refuse it)."""
    for r in records:
        ids, at = r.token_ids, f"{where}: prompt {r.prompt_id!r}"
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__") or not len(ids):
            raise DataError(f"{at}: token_ids must be a non-empty list of token ids; got {ids!r:.80}")
        if not all(type(t) is int for t in ids):   # the common case costs one pass; numpy ints etc. are checked here
            bad = next((t for t in ids if isinstance(t, bool) or not hasattr(t, "__index__")), None)
            if bad is not None:
                raise DataError(f"{at}: token_ids must be ints; got {bad!r:.40} ({type(bad).__name__})")
        low, high = min(ids), max(ids)
        if low < 0 or (vocab is not None and high >= vocab):
            raise DataError(f"{at}: token id {int(low if low < 0 else high)} is out of the vocabulary (ids 0 to "
                            f"{vocab - 1 if vocab else '...'})")
        budget = max(r.target_lengths) if r.target_lengths else max_tokens
        if limit is not None and len(ids) + budget > limit:
            raise DataError(f"{at}: {len(ids)} prompt tokens + {budget} response tokens (sampling.max_tokens) = "
                            f"{len(ids) + budget} exceed the engines' context of {limit} tokens ({source}); shorten "
                            f"the prompt or lower sampling.max_tokens")
