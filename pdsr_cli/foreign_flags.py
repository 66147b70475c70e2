"""Other tools' names for pdsr's settings, so that an unknown option a TRL, OpenRLHF, verl, slime, AReaL or vLLM
user types out of habit (``pdsr rollout --num-generations 8``, ``-tp 2``), an unknown key of their config file
(``actor_rollout_ref.rollout.n: 8``) and a Hydra-style ``key=value`` argument are answered with pdsr's flag and
config key.

The rows are the mapping tables of docs/coming-from.md (Coming from TRL or OpenRLHF, Coming from verl or vLLM),
docs/scoring-gae.md (verl, TRL, OpenRLHF), docs/partial-rollout.md (slime, verl, AReaL), docs/agents.md (verl's
multi-turn keys) and docs/configuration.md (vLLM's engine settings, pdsr score's); tests/cli/test_foreign_flags.py
and test_foreign_keys.py check every row's flag and key against its commands. pdsr_cli/key_value.py answers
Hydra's key=value arguments with these rows."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import click

ROLLOUT = ("rollout",)
ENGINES = ("rollout", "serve")            # commands whose config lays out vLLM engines (RolloutConfig)
STEPS = ("rollout", "simulate")           # commands with the multi-step flags (stream_options.step_stream_options)
GAE = ("gae",)
SCORE = ("score",)
ENGINE_NOTE = "each engine's setting, in engine_defaults or an engines entry (docs/configuration.md)"
ARGS_NOTE = "vLLM's engine argument, passed through in engine_defaults or an engines entry (docs/configuration.md)"
SLEEP_NOTE = "vLLM's engine argument (GPU builds), then session.sleep() / wake() (docs/sdk-weights.md)"
ALWAYS_VLLM = "always vLLM, in engine processes of their own (--fast, --heavy)"
TABLE = "docs/coming-from.md#coming-from-trl-or-openrlhf"
TRL_GAE = "docs/scoring-gae.md#coming-from-trl"
OPENRLHF_GAE = "docs/scoring-gae.md#coming-from-openrlhf"
WEIGHTED = "one that calls each and returns their weighted sum, " + TABLE
ENGINES_NOTE = ("an engine's GPUs are its tensor_parallel_size; more GPUs run more engines, each a vLLM instance "
                "(--fast, --heavy)")


@dataclass(frozen=True)
class ForeignName:
    tool: str                    # whose name it is
    name: str                    # their spelling, as their docs write it
    commands: tuple[str, ...]    # the pdsr commands this answer holds for
    flag: str | None             # pdsr's flag on those commands; None: there is none
    key: str | None              # pdsr's config key; None: not a config key
    note: str = ""               # what differs, or where it is instead

    def answer(self) -> str:
        if self.tool == "pdsr":   # pdsr's own config key, typed as the flag it does not have
            return f"pdsr's {self.name} is a config key, set in the --config file (no flag); {self.note}"
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
           ("chat_template_kwargs", None, "data.chat_template_kwargs"),
           ("num_generations_eval", "--n", "sampling.n", "an evaluation is a run of its own, or session.step(n=...)"),
           ("reward_funcs", "--reward", "reward", "one function; several, weighted: " + WEIGHTED),
           ("reward_weights", "--reward", "reward", "one function; several, weighted: " + WEIGHTED),
           ("generation_kwargs", None, None, "no pass-through; the vLLM keys it takes: --stop, --stop-token-id, "
            "--presence-penalty, --frequency-penalty, --ignore-eos and --seed"),
           ("vllm_structured_outputs_regex", None, None, "no structured outputs")),
    *_rows("TRL", ENGINES,
           ("vllm_tensor_parallel_size", None, "engine_defaults.tensor_parallel_size", ENGINE_NOTE),
           ("vllm_gpu_memory_utilization", None, "engine_defaults.gpu_memory_utilization", ENGINE_NOTE),
           ("vllm_max_model_length", None, "engine_defaults.max_model_len", ENGINE_NOTE),
           ("vllm_enable_sleep_mode", None, "engine_defaults.engine_args.enable_sleep_mode", SLEEP_NOTE),
           ("use_vllm", None, None, ALWAYS_VLLM),
           ("vllm_mode", None, None, ALWAYS_VLLM)),
    *_rows("TRL", GAE,
           ("scale_rewards", "--normalize-std", "normalize_std",
            "group, batch or none with --estimator grpo, and --eps 1e-4 for TRL's std"),
           ("multi_objective_aggregation", None, None, "sum_then_normalize: one reward function returning the "
            "weighted sum; normalize_then_sum: grpo_advantages of each part, " + TRL_GAE),
           ("mask_truncated_completions", None, None, "the trainer's loss mask: response_mask 0 where finish_reasons "
            "is 'length', after the advantages, " + TRL_GAE),
           ("epsilon", None, None, "the PPO clip of the trainer's loss, not pdsr's --eps, which is added to the "
            "std (TRL's 1e-4)"),
           *((name, None, None, "the trainer's loss; it changes no advantage, " + TRL_GAE) for name in (
               "loss_type", "epsilon_high", "delta", "importance_sampling_level", "top_entropy_quantile",
               "entropy_coef", "off_policy_mask_threshold")),
           ("beta", None, None, "the trainer's loss (KL to the reference); the reference's log-probs: pdsr score"),
           ("num_iterations", None, None, "the trainer's: its updates per generated batch"),
           ("steps_per_generation", None, None, "the trainer's: its updates per generated batch")),
    *_rows("OpenRLHF", ROLLOUT,
           ("--rollout.n_samples_per_prompt", "--n", "sampling.n"),
           ("--rollout.batch_size", "--batch-size", "batch_size"),
           ("--rollout.max_new_tokens", "--max-tokens", "sampling.max_tokens"),
           ("--rollout.temperature", "--temperature", "sampling.temperature"),
           ("--rollout.top_p", "--top-p", "sampling.top_p"),
           ("--train.agent_func_path", "--agent", "agent.function", "with --max-turns (docs/agents.md)"),
           ("--reward.remote_url", "--reward", "reward",
            "FILE.py:fn, fn scoring one sample (docs/coming-from.md#coming-from-trl-or-openrlhf)"),
           ("--algo.dynamic_filtering_enable", "--filter-groups", "filter_groups.kind",
            "--filter-groups zero-variance"),
           ("--algo.dynamic_filtering_range", "--filter-groups", "filter_groups.kind",
            "zero-variance is the range (0, 1) of 0/1 scores; another range: a group_filter, " + TABLE),
           ("--eval.n_samples_per_prompt", "--n", "sampling.n", "an evaluation is a run of its own, or "
            "session.step(n=...)"),
           ("--reward.overlong_buffer_len", "--overlong-buffer", "overlong_buffer"),
           ("--reward.overlong_penalty_factor", "--overlong-penalty", "overlong_penalty"),
           ("--train.partial_rollout_enable", "--steps", "steps", "with --max-staleness and --over-provision"),
           ("--train.async_enable", "--steps", "steps", "with --max-staleness and --over-provision"),
           ("--rollout.vllm_generate_batch_size", "--over-provision", "over_provision",
            "with --steps, about G / B - 1 for G")),
    *_rows("OpenRLHF", ENGINES,
           ("--vllm.num_engines", "--fast", "fast", "with --heavy, the engines of each pool"),
           ("--vllm_num_engines", "--fast", "fast", "with --heavy, the engines of each pool"),   # before April 2026
           ("--vllm.tensor_parallel_size", None, "engine_defaults.tensor_parallel_size", ENGINE_NOTE),
           ("--vllm.gpu_memory_utilization", None, "engine_defaults.gpu_memory_utilization", ENGINE_NOTE),
           ("--data.max_len", None, "engine_defaults.max_model_len", ENGINE_NOTE),
           ("--vllm.enable_prefix_caching", None, None, "prefix caching is always on"),
           ("--vllm.enable_sleep", None, "engine_defaults.engine_args.enable_sleep_mode", SLEEP_NOTE)),
    *_rows("OpenRLHF", GAE,
           ("--algo.advantage.estimator", "--estimator", "estimator", "docs/scoring-gae.md#coming-from-openrlhf"),
           ("--advantage_estimator", "--estimator", "estimator", "docs/scoring-gae.md#coming-from-openrlhf"),
           ("--algo.advantage.gamma", "--gamma", "gamma"),
           *((name, None, None, "the trainer's loss; it changes no advantage, " + OPENRLHF_GAE) for name in (
               "--actor.eps_clip", "--actor.eps_clip_low_high", "--actor.dual_clip", "--actor.policy_loss_type",
               "--critic.value_clip", "--actor.entropy_coef", "--algo.kl.use_loss", "--algo.kl.estimator",
               "--algo.kl.target")),
           ("--algo.kl.init_coef", None, None, "KL in the reward: per-token rewards into reinforce_pp_advantages or "
            "compute_gae from Python, " + OPENRLHF_GAE),
           *((name, None, None, "a line of numpy around grpo_advantages from Python, " + OPENRLHF_GAE) for name in (
               "--algo.advantage.no_std_norm", "--reward.clip_range", "--reward.stop_properly_penalty_coef"))),
    *_rows("verl", ROLLOUT,
           ("actor_rollout_ref.rollout.n", "--n", "sampling.n"),
           ("actor_rollout_ref.rollout.temperature", "--temperature", "sampling.temperature"),
           ("actor_rollout_ref.rollout.top_p", "--top-p", "sampling.top_p"),
           ("actor_rollout_ref.rollout.top_k", "--top-k", "sampling.top_k", "verl's -1 (off) is 0"),
           ("actor_rollout_ref.rollout.ignore_eos", "--ignore-eos", "sampling.ignore_eos"),
           ("actor_rollout_ref.model.path", "--model", "model"),
           ("data.train_batch_size", "--batch-size", "batch_size"),
           ("data.max_response_length", "--max-tokens", "sampling.max_tokens"),
           ("data.prompt_key", "--prompt-column", "data.prompt_column"),
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
    *_rows("verl", ENGINES,
           ("actor_rollout_ref.rollout.tensor_model_parallel_size", None, "engine_defaults.tensor_parallel_size",
            ENGINE_NOTE),
           ("actor_rollout_ref.rollout.gpu_memory_utilization", None, "engine_defaults.gpu_memory_utilization",
            ENGINE_NOTE),
           ("actor_rollout_ref.rollout.max_num_seqs", None, "engine_defaults.max_num_seqs", ENGINE_NOTE),
           ("actor_rollout_ref.rollout.max_model_len", None, "engine_defaults.max_model_len", ENGINE_NOTE),
           ("actor_rollout_ref.rollout.enforce_eager", None, "engine_defaults.engine_args.enforce_eager", ARGS_NOTE),
           ("actor_rollout_ref.rollout.max_num_batched_tokens", None,
            "engine_defaults.engine_args.max_num_batched_tokens", ARGS_NOTE),
           ("actor_rollout_ref.rollout.engine_kwargs.vllm", None, "engine_defaults.engine_args", ARGS_NOTE)),
    *_rows("verl", ("serve",),
           ("actor_rollout_ref.rollout.multi_turn.format", "--tool-parser", None)),
    *_rows("verl", STEPS,
           ("async_training.partial_rollout", "--steps", "steps", "with --kv-on-update recompute"),
           ("async_training.staleness_threshold", "--over-provision", "over_provision",
            "about the same t, in samples (docs/partial-rollout.md)"),
           ("async_training.trigger_parameter_sync_step", "--step-groups", "step_groups",
            "the weights change at every step's end: k trainer steps a sync are one step of k x B groups")),
    *_rows("verl", GAE,
           ("algorithm.adv_estimator", "--estimator", "estimator"),
           ("algorithm.norm_adv_by_std_in_grpo", "--normalize-std", "normalize_std", "False is --normalize-std none"),
           ("algorithm.gamma", "--gamma", "gamma")),
    *_rows("slime", STEPS,
           ("--partial-rollout", "--steps", "steps", "with --over-provision"),
           ("--over-sampling-batch-size", "--over-provision", "over_provision", "about O / B - 1 for O"),
           ("--dynamic-sampling-filter-path", "--filter-groups", "filter_groups.kind",
            "--filter-groups zero-variance")),
    *_rows("slime", ROLLOUT,
           ("--mask-offpolicy-in-partial-rollout", None, None,
            "the loss mask is the trainer's: token_versions_of_rows, docs/partial-rollout.md")),
    *_rows("slime", ENGINES,
           ("--rollout-num-gpus", "--fast", "fast", "engines, not GPUs: with --heavy, the engines of each pool; by "
            "default one engine per visible GPU, or per engine_defaults.tensor_parallel_size GPUs where it is set "
            "(docs/engines.md)"),
           ("--rollout-num-gpus-per-engine", None, "engine_defaults.tensor_parallel_size", ENGINE_NOTE)),
    *_rows("pdsr", ENGINES,
           ("engines", None, "engines", "it lists the engines one by one (docs/configuration.md); their number in "
            "the automatic layout is fast (--fast) and heavy (--heavy)")),
    *_rows("AReaL", STEPS,
           ("max_head_offpolicyness", "--max-staleness", "max_staleness",
            "pdsr bounds each consumed token's age in versions, where AReaL bounds how many rollouts start "
            "(docs/partial-rollout.md, Coming from AReaL)")),
    *_rows("vLLM", ENGINES,
           ("--max-model-len", None, "engine_defaults.max_model_len",
            "each engine's context, by default what the prompts need (docs/configuration.md)"),
           ("--gpu-memory-utilization", None, "engine_defaults.gpu_memory_utilization", ENGINE_NOTE),
           ("--tensor-parallel-size", None, "engine_defaults.tensor_parallel_size", ENGINE_NOTE),
           ("--max-num-seqs", None, "engine_defaults.max_num_seqs", ENGINE_NOTE),
           ("--dtype", None, "engine_defaults.dtype", ENGINE_NOTE),
           ("--speculative-config", "--speculative", "speculative", "with --num-speculative-tokens"),
           ("-tp", None, "engine_defaults.tensor_parallel_size", ENGINE_NOTE),
           ("--tokenizer", None, "tokenizer", "the run's tokenizer, if not the model's"),
           ("--enforce-eager", None, "engine_defaults.engine_args.enforce_eager", ARGS_NOTE + "; on by pdsr on CPUs"),
           ("--max-num-batched-tokens", None, "engine_defaults.engine_args.max_num_batched_tokens", ARGS_NOTE),
           ("--kv-cache-dtype", None, "engine_defaults.engine_args.kv_cache_dtype", ARGS_NOTE),
           ("--quantization", None, "engine_defaults.engine_args.quantization", ARGS_NOTE),
           ("--enable-chunked-prefill", None, "engine_defaults.engine_args.enable_chunked_prefill", ARGS_NOTE),
           ("--enable-prefix-caching", None, None,
            "prefix caching is always on (a continued segment resubmits its tokens)"),
           ("--pipeline-parallel-size", None, None, ENGINES_NOTE),
           ("-pp", None, None, ENGINES_NOTE),
           ("--data-parallel-size", None, None, ENGINES_NOTE),
           ("-dp", None, None, ENGINES_NOTE)),
    *_rows("vLLM", SCORE,
           ("--max-model-len", "--vllm-max-model-len", "vllm_max_model_len", "with --backend vllm")),
    *_rows("verl", SCORE,
           ("log_prob_max_token_len_per_gpu", "--max-tokens-per-mb", "max_tokens_per_micro_batch",
            "a token quota per micro-batch, 16,384 by default as verl's")),
    *_rows("vLLM", ROLLOUT,
           ("--served-model-name", None, None, "a rollout serves nothing, pdsr serve --model-name names its model")),
    *_rows("vLLM", ("serve",),
           ("--seed", None, "seed", "the engines' seed"),
           ("--tool-call-parser", "--tool-parser", None),
           ("--enable-auto-tool-choice", None, None, "auto is the only tool choice; --tool-parser parses the calls")),
]


def _spelling(name: str) -> str:
    """One spelling of a name: no leading dashes, dashes as underscores (``--num-generations`` =
    ``num_generations``)."""
    return name.lstrip("-").replace("-", "_").lower()


def _rows_named(command: str, typed: str) -> list[ForeignName]:
    """``command``'s rows named ``typed`` (one spelling), or else, ``typed`` of two words or more, whose name ends
    with it after a dot (``max_assistant_turns`` for verl's ``...multi_turn.max_assistant_turns``; not ``len``)."""
    rows = [r for r in FOREIGN_NAMES if command in r.commands]
    return [r for r in rows if _spelling(r.name) == typed] or \
        [r for r in rows if ("_" in typed or "." in typed) and _spelling(r.name).endswith("." + typed)]


def rows_answer(rows: list[ForeignName]) -> str | None:
    return ". ".join(dict.fromkeys(r.answer() for r in rows)) or None


def foreign_answer(command: str, option: str, flags: set[str]) -> str | None:
    """What ``option``, unknown to ``command`` (``rollout``, ``trace synth``), is in pdsr, or None: the rows
    :func:`_rows_named` finds. None where it is one of ``flags`` (the command's own) spelled with underscores:
    click's "Did you mean" says that."""
    typed = _spelling(option)
    if not typed or "--" + typed.replace("_", "-") in flags:
        return None
    return rows_answer(_rows_named(command, typed))


def key_rows(command: str, key: str) -> list[ForeignName]:
    """The rows of a dotted config key as written (``actor_rollout_ref.rollout.n``): those named it, or else those
    :func:`_rows_named` finds for it or its end after a dot, of two words or more (``sampling.num_generations``:
    TRL's ``num_generations``), where they all name one pdsr setting (an end is not enough to choose between two)."""
    parts = _spelling(key).split(".")
    for i in range(len(parts)):
        tail = ".".join(parts[i:])
        if i and "_" not in tail and "." not in tail:   # one word (n, len, dtype) of a longer key: too loose
            return []
        found = _rows_named(command, tail)
        if i == 0 and found and all(_spelling(r.name) == tail for r in found):
            return found
        if found:
            return found if len({(r.flag, r.key) for r in found}) == 1 else []
    return []


def key_hint(command: str) -> Callable[[str], str | None]:
    """The SDK's unknown-key hint (:func:`pdsr_sdk.config.base.unknown_key_hints`) for ``command``'s config."""
    return lambda key: rows_answer(key_rows(command, key))


@contextlib.contextmanager
def foreign_key_hints() -> Iterator[None]:
    """While the running command runs, an unknown config key that is another tool's name for one of its settings (in
    the --config file, nested or dotted, or in --set) is answered with pdsr's flag and key."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        yield
        return
    from pdsr_sdk.config.base import unknown_key_hints

    with unknown_key_hints(key_hint(command_name(ctx))):
        yield


def command_name(ctx: click.Context) -> str:
    """The command ``ctx`` runs, without ``pdsr`` (``rollout``, ``trace synth``)."""
    names, node = [], ctx
    while node.parent is not None:
        names.append(node.info_name or "")
        node = node.parent
    return " ".join(reversed(names))


def with_foreign_answer(exc: click.NoSuchOption, argv: list[str]) -> click.NoSuchOption:
    """``exc`` with pdsr's name for its option in place of click's close spellings, where a row answers it.
    ``argv``: the command line, for vLLM's ``-tp 2``, which click reads as ``-t`` with ``p`` after it."""
    ctx = exc.ctx
    if ctx is None or ctx.parent is None:   # pdsr's own options (pdsr --version)
        return exc
    option = exc.option_name
    if len(option) == 2 and option[0] == "-":
        option = next((word for word in (a.split("=")[0] for a in argv)
                       if word.startswith(option) and len(word) > 2 and not word.startswith("--")), option)
    flags = {opt for p in ctx.command.params for opt in (*p.opts, *p.secondary_opts)}
    said = foreign_answer(command_name(ctx), option, flags)
    if said is None:
        return exc
    return click.NoSuchOption(option, f"No such option '{option}': {said}", ctx=ctx)
