"""Other tools' names for pdsr's settings, so that an unknown option a TRL, OpenRLHF, verl, slime, AReaL or vLLM
user types out of habit (``pdsr rollout --num-generations 8``) is answered with pdsr's flag and config key.

The rows are the mapping tables of docs/rollout.md (Coming from TRL or OpenRLHF), docs/scoring-gae.md (verl,
TRL, OpenRLHF), docs/partial-rollout.md (slime, verl, AReaL), docs/agents.md (verl's multi-turn keys) and
docs/configuration.md (vLLM's engine settings, pdsr score's); tests/cli/test_foreign_flags.py checks every row's
flag and key against its commands."""

from __future__ import annotations

from dataclasses import dataclass

import click

ROLLOUT = ("rollout",)
ENGINES = ("rollout", "serve")            # commands whose config lays out vLLM engines (RolloutConfig)
STEPS = ("rollout", "simulate")           # commands with the multi-step flags (common.step_stream_options)
GAE = ("gae",)
SCORE = ("score",)
ENGINE_NOTE = "each engine's setting, in engine_defaults or an engines entry (docs/configuration.md)"


@dataclass(frozen=True)
class ForeignName:
    tool: str                    # whose name it is
    name: str                    # their spelling, as their docs write it
    commands: tuple[str, ...]    # the pdsr commands this answer holds for
    flag: str | None             # pdsr's flag on those commands; None: there is none
    key: str | None              # pdsr's config key; None: not a config key
    note: str = ""               # what differs, or where it is instead

    def answer(self) -> str:
        theirs = f"{self.tool}'s {self.name}"
        if self.flag:
            said = f"{theirs} is pdsr's {self.flag}" + (f" ({self.key})" if self.key else "")
        elif self.key:
            said = f"{theirs} is pdsr's config key {self.key}, set in the --config file (no flag)"
        else:
            return f"{theirs}: pdsr has none ({self.note})"
        return f"{said}; {self.note}" if self.note else said


def _rows(tool: str, commands: tuple[str, ...], *rows: tuple) -> list[ForeignName]:
    return [ForeignName(tool, name, commands, *rest) for name, *rest in rows]


FOREIGN_NAMES: list[ForeignName] = [
    *_rows("TRL", ROLLOUT,
           ("num_generations", "--n", "sampling.n"),
           ("generation_batch_size", "--batch-size", "batch_size",
            "in prompts, TRL's generation_batch_size / num_generations"),
           ("max_completion_length", "--max-tokens", "sampling.max_tokens"),
           ("max_tool_calling_iterations", "--max-turns", "agent.max_turns", "with --agent (docs/agents.md)"),
           ("chat_template_kwargs", None, "data.chat_template_kwargs")),
    *_rows("TRL", ENGINES,
           ("vllm_tensor_parallel_size", None, "engine_defaults.tensor_parallel_size", ENGINE_NOTE),
           ("vllm_gpu_memory_utilization", None, "engine_defaults.gpu_memory_utilization", ENGINE_NOTE),
           ("vllm_max_model_length", None, "engine_defaults.max_model_len", ENGINE_NOTE)),
    *_rows("TRL", GAE,
           ("scale_rewards", "--normalize-std", "normalize_std",
            "group, batch or none with --estimator grpo, and --eps 1e-4 for TRL's std")),
    *_rows("OpenRLHF", ROLLOUT,
           ("--rollout.n_samples_per_prompt", "--n", "sampling.n"),
           ("--rollout.batch_size", "--batch-size", "batch_size"),
           ("--rollout.max_new_tokens", "--max-tokens", "sampling.max_tokens"),
           ("--rollout.temperature", "--temperature", "sampling.temperature"),
           ("--rollout.top_p", "--top-p", "sampling.top_p"),
           ("--vllm.num_engines", "--fast", "fast", "with --heavy, the engines of each pool"),
           ("--train.agent_func_path", "--agent", "agent.function", "with --max-turns (docs/agents.md)"),
           ("--reward.remote_url", "--reward", "reward",
            "FILE.py:fn, fn scoring one sample (docs/rollout.md#coming-from-trl-or-openrlhf)"),
           ("--algo.dynamic_filtering_enable", "--filter-groups", "filter_groups.kind", "--filter-groups zero-variance"),
           ("--reward.overlong_buffer_len", "--overlong-buffer", "overlong_buffer"),
           ("--reward.overlong_penalty_factor", "--overlong-penalty", "overlong_penalty"),
           ("--train.partial_rollout_enable", "--steps", "steps", "with --max-staleness and --over-provision"),
           ("--train.async_enable", "--steps", "steps", "with --max-staleness and --over-provision"),
           ("--rollout.vllm_generate_batch_size", "--over-provision", "over_provision",
            "with --steps, about G / B - 1 for G")),
    *_rows("OpenRLHF", ENGINES,
           ("--vllm.tensor_parallel_size", None, "engine_defaults.tensor_parallel_size", ENGINE_NOTE),
           ("--vllm.gpu_memory_utilization", None, "engine_defaults.gpu_memory_utilization", ENGINE_NOTE),
           ("--data.max_len", None, "engine_defaults.max_model_len", ENGINE_NOTE),
           ("--vllm.enable_prefix_caching", None, None, "prefix caching is always on")),
    *_rows("OpenRLHF", GAE,
           ("--algo.advantage.estimator", "--estimator", "estimator", "docs/scoring-gae.md#coming-from-openrlhf"),
           ("--advantage_estimator", "--estimator", "estimator", "docs/scoring-gae.md#coming-from-openrlhf"),
           ("--algo.advantage.gamma", "--gamma", "gamma")),
    *_rows("verl", ROLLOUT,
           ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", "--max-turns", "agent.max_turns"),
           ("actor_rollout_ref.rollout.multi_turn.max_user_turns", None, "agent.max_env_turns"),
           ("actor_rollout_ref.rollout.multi_turn.max_tool_response_length", None, "agent.max_tool_response_chars"),
           ("actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side", None,
            "agent.tool_response_truncate_side"),
           ("actor_rollout_ref.rollout.response_length", "--max-tokens", "sampling.max_tokens"),
           ("data.apply_chat_template_kwargs", None, "data.chat_template_kwargs"),
           ("data.train_files", "--data", "data.path", "a file, a folder or a glob pattern of shards"),
           ("data.filter_overlong_prompts", "--skip-long", "data.skip_long"),
           ("overlong_buffer.len", "--overlong-buffer", "overlong_buffer")),
    *_rows("verl", ("serve",),
           ("actor_rollout_ref.rollout.multi_turn.format", "--tool-parser", None)),
    *_rows("verl", STEPS,
           ("async_training.partial_rollout", "--steps", "steps", "with --kv-on-update recompute"),
           ("async_training.staleness_threshold", "--over-provision", "over_provision",
            "about the same t, in samples (docs/partial-rollout.md)")),
    *_rows("verl", GAE,
           ("algorithm.adv_estimator", "--estimator", "estimator"),
           ("algorithm.norm_adv_by_std_in_grpo", "--normalize-std", "normalize_std", "False is --normalize-std none"),
           ("algorithm.gamma", "--gamma", "gamma")),
    *_rows("slime", STEPS,
           ("--partial-rollout", "--steps", "steps", "with --over-provision"),
           ("--over-sampling-batch-size", "--over-provision", "over_provision", "about O / B - 1 for O"),
           ("--dynamic-sampling-filter-path", "--filter-groups", "filter_groups.kind", "--filter-groups zero-variance")),
    *_rows("slime", ROLLOUT,
           ("--mask-offpolicy-in-partial-rollout", None, None,
            "the loss mask is the trainer's: token_versions_of_rows, docs/partial-rollout.md")),
    *_rows("AReaL", STEPS,
           ("max_head_offpolicyness", "--max-staleness", "max_staleness",
            "a bound on each token's age in versions (docs/partial-rollout.md)")),
    *_rows("vLLM", ENGINES,
           ("--max-model-len", None, "engine_defaults.max_model_len",
            "each engine's context, by default what the prompts need (docs/configuration.md)"),
           ("--gpu-memory-utilization", None, "engine_defaults.gpu_memory_utilization", ENGINE_NOTE),
           ("--tensor-parallel-size", None, "engine_defaults.tensor_parallel_size", ENGINE_NOTE),
           ("--max-num-seqs", None, "engine_defaults.max_num_seqs", ENGINE_NOTE),
           ("--dtype", None, "engine_defaults.dtype", ENGINE_NOTE),
           ("--speculative-config", "--speculative", "speculative", "with --num-speculative-tokens")),
    *_rows("vLLM", SCORE,
           ("--max-model-len", "--vllm-max-model-len", "vllm_max_model_len", "with --backend vllm")),
    *_rows("verl", SCORE,
           ("log_prob_max_token_len_per_gpu", "--max-tokens-per-mb", "max_tokens_per_micro_batch",
            "a token quota per micro-batch, 16,384 by default as verl's")),
    *_rows("vLLM", ROLLOUT,
           ("--served-model-name", None, None, "a rollout serves nothing, pdsr serve --model-name names its model")),
    *_rows("vLLM", ("serve",),
           ("--tool-call-parser", "--tool-parser", None),
           ("--enable-auto-tool-choice", None, None, "auto is the only tool choice; --tool-parser parses the calls")),
]


def _spelling(name: str) -> str:
    """One spelling of a name: no leading dashes, dashes as underscores (``--num-generations`` = ``num_generations``)."""
    return name.lstrip("-").replace("-", "_").lower()


def foreign_answer(command: str, option: str, flags: set[str]) -> str | None:
    """What ``option``, unknown to ``command`` (``rollout``, ``trace synth``), is in pdsr, or None. It matches a
    row's name in either spelling, or, a name of two words or more, the row name's end after a dot
    (``--max_assistant_turns`` for verl's ``...multi_turn.max_assistant_turns``; not ``--len``). None where it is one of ``flags`` (the command's own) spelled with
    underscores: click's "Did you mean" says that."""
    typed = _spelling(option)
    if not typed or "--" + typed.replace("_", "-") in flags:
        return None
    rows = [r for r in FOREIGN_NAMES if command in r.commands]
    found = [r for r in rows if _spelling(r.name) == typed] or \
        [r for r in rows if ("_" in typed or "." in typed) and _spelling(r.name).endswith("." + typed)]
    answers = list(dict.fromkeys(r.answer() for r in found))
    return ". ".join(answers) or None


def with_foreign_answer(exc: click.NoSuchOption) -> click.NoSuchOption:
    """``exc`` with pdsr's name for its option in place of click's close spellings, where a row answers it."""
    ctx = exc.ctx
    if ctx is None or ctx.parent is None:   # pdsr's own options (pdsr --version)
        return exc
    names, node = [], ctx
    while node.parent is not None:
        names.append(node.info_name or "")
        node = node.parent
    flags = {opt for p in ctx.command.params for opt in (*p.opts, *p.secondary_opts)}
    said = foreign_answer(" ".join(reversed(names)), exc.option_name, flags)
    if said is None:
        return exc
    return click.NoSuchOption(exc.option_name, f"No such option '{exc.option_name}': {said}", ctx=ctx)
