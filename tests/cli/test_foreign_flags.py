"""Another tool's name for a pdsr setting, typed as a flag (``pdsr rollout --num-generations 8``), is answered with
pdsr's flag and config key (pdsr_cli/foreign_flags.py); every row's flag and key exist on its commands; a plain
typo still gets click's own message."""

from __future__ import annotations

import importlib.util
import re

import click
import pytest

from cli_checks import failed, invoke
from pdsr_cli.foreign_flags import FOREIGN_NAMES, foreign_answer
from pdsr_cli.main import cli
from pdsr_sdk.config import load_config
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.gae.config import GaeConfig
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.scoring.config import ScoreConfig
from pdsr_sdk.sim.config import SimulateConfig
from support import ROOT

CONFIGS = {"rollout": RolloutConfig, "serve": RolloutConfig, "simulate": SimulateConfig, "gae": GaeConfig,
           "score": ScoreConfig}


@pytest.mark.parametrize("args, answer", [
    (["rollout", "--num-generations", "8"], "TRL's num_generations is pdsr's --n (sampling.n)"),
    (["rollout", "--num_generations=8"], "TRL's num_generations is pdsr's --n (sampling.n)"),
    (["gae", "--estimator", "grpo", "--scale-rewards", "batch"],
     "TRL's scale_rewards is pdsr's --normalize-std (normalize_std)"),
    (["rollout", "--rollout.n_samples_per_prompt", "8"],
     "OpenRLHF's --rollout.n_samples_per_prompt is pdsr's --n (sampling.n)"),
    (["gae", "--algo.advantage.estimator", "group_norm"],
     "OpenRLHF's --algo.advantage.estimator is pdsr's --estimator (estimator)"),
    (["gae", "--adv_estimator", "grpo"], "verl's algorithm.adv_estimator is pdsr's --estimator (estimator)"),
    (["rollout", "--max-assistant-turns", "3"],
     "verl's actor_rollout_ref.rollout.multi_turn.max_assistant_turns is pdsr's --max-turns (agent.max_turns)"),
    (["simulate", "--partial-rollout"], "slime's --partial-rollout is pdsr's --steps (steps)"),
    (["rollout", "--over_sampling_batch_size", "64"], "slime's --over-sampling-batch-size is pdsr's --over-provision"),
    (["rollout", "--max_head_offpolicyness", "2"], "AReaL's max_head_offpolicyness is pdsr's --max-staleness"),
    (["serve", "--max-model-len", "4096"],
     "vLLM's --max-model-len is pdsr's config key engine_defaults.max_model_len, set in the --config file (no flag)"),
    (["rollout", "--gpu-memory-utilization", "0.5"], "vLLM's --gpu-memory-utilization is pdsr's config key "
                                                     "engine_defaults.gpu_memory_utilization"),
    (["serve", "--tool-call-parser", "hermes"], "vLLM's --tool-call-parser is pdsr's --tool-parser"),
    (["score", "--backend", "vllm", "--max-model-len", "4096"],
     "vLLM's --max-model-len is pdsr's --vllm-max-model-len (vllm_max_model_len)"),
    (["rollout", "--served-model-name", "x"], "vLLM's --served-model-name: pdsr has none"),
])
def test_another_tools_name_gets_pdsrs(args, answer):
    option = next(a.split("=")[0] for a in args if a.startswith("--") and a not in ("--estimator", "--backend"))
    out = failed(invoke(*args), f"No such option '{option}': {answer}")
    assert "Did you mean" not in out   # click's close spellings (--no-segments for --num-generations) left out


@pytest.mark.parametrize("args, message", [
    (["rollout", "--tempreature", "1"], "No such option '--tempreature'. Did you mean '--temperature'?"),
    (["rollout", "--top_p", "1"], "No such option '--top_p'."),              # pdsr's own flag: click's "Did you mean"
    (["rollout", "--scale-rewards", "batch"], "No such option '--scale-rewards'."),   # pdsr gae's, not rollout's
    (["serve", "--num-generations", "8"], "No such option '--num-generations'."),     # serve has no --n
    (["--num-generations", "8"], "No such option '--num-generations'."),              # pdsr itself
])
def test_other_unknown_options_get_clicks_message(args, message):
    out = failed(invoke(*args), message)
    assert "pdsr's" not in out and "'s " not in out.split("Error: ")[-1]


def _command(path: str) -> click.Command:
    with click.Context(cli) as ctx:
        command = cli.get_command(ctx, path)
    assert command is not None, path
    return command


def _key_unknown(model, key: str) -> bool:
    try:
        load_config(model, None, {key: "__probe__"})
    except ConfigError as exc:
        return f"{key}: unknown config key" in str(exc)
    return False


def test_the_key_check_finds_an_unknown_key():
    assert _key_unknown(RolloutConfig, "sampling.num_generations")
    assert _key_unknown(RolloutConfig, "engine_defaults.max_model_length")
    assert not _key_unknown(RolloutConfig, "engine_defaults.max_model_len")


@pytest.mark.parametrize("row", FOREIGN_NAMES, ids=lambda r: f"{r.tool}:{r.name}")
def test_every_rows_flag_and_key_exist_on_its_commands(row):
    assert row.commands and (row.flag or row.key or row.note)
    for name in row.commands:
        command = _command(name)
        flags = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
        if row.flag:
            assert row.flag in flags, (row, name)
        if row.key:
            assert not _key_unknown(CONFIGS[name], row.key), (row, name)
        assert foreign_answer(name, row.name, flags) is not None, (row, name)   # not shadowed by a flag of its own


def test_every_flag_a_rows_note_names_exists():
    # "pdsr serve --model-name" names serve's flag; any other, the row's commands'
    named = 0
    for row in FOREIGN_NAMES:
        for m in re.finditer(r"(?:pdsr ([a-z]+(?: [a-z]+)?) )?(--[a-z][a-z-]*)", row.note):
            for name in [m[1]] if m[1] else row.commands:
                command = _command(name)
                assert m[2] in {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}, (row, name)
                named += 1
    assert named > 20


@pytest.mark.parametrize("args, answer", [
    (["rollout", "--engines", "8"], "pdsr's engines is a config key, set in the --config file (no flag); it lists "
                                    "the engines one by one (docs/configuration.md); their number in the automatic "
                                    "layout is fast (--fast) and heavy (--heavy)"),
    (["serve", "--num-engines", "2"], "OpenRLHF's --vllm.num_engines is pdsr's --fast (fast)"),   # not serve's row
    (["rollout", "--vllm_num_engines", "4"], "OpenRLHF's --vllm_num_engines is pdsr's --fast (fast); with --heavy"),
    (["rollout", "--vllm_tensor_parallel_size", "2"],
     "TRL's vllm_tensor_parallel_size is pdsr's config key engine_defaults.tensor_parallel_size"),   # OpenRLHF's too
    (["serve", "--rollout-num-gpus", "8"], "slime's --rollout-num-gpus is pdsr's --fast (fast); engines, not GPUs: "
                                           "with --heavy, the engines of each pool; by default one engine per visible "
                                           "GPU, or per engine_defaults.tensor_parallel_size GPUs where it is set"),
    (["rollout", "--rollout-num-gpus-per-engine", "2"],
     "slime's --rollout-num-gpus-per-engine is pdsr's config key engine_defaults.tensor_parallel_size"),
    (["serve", "--tensor-model-parallel-size", "2"], "verl's actor_rollout_ref.rollout.tensor_model_parallel_size is "
                                                     "pdsr's config key engine_defaults.tensor_parallel_size"),
])
def test_guesses_at_the_number_of_engines_are_answered(args, answer):
    out = failed(invoke(*args), f"No such option '{args[1]}': {answer}")
    assert "Did you mean" not in out


def test_every_row_is_a_name_the_docs_map():
    docs = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    for row in FOREIGN_NAMES:
        words = row.name.lstrip("-")
        spellings = {words, words.replace("-", "_")} | {words.split(".", i)[-1] for i in range(1, words.count(".") + 1)}
        assert any(re.search(rf"`[^`]*\b{re.escape(s)}\b[^`]*`", docs) for s in spellings), row


def test_an_exact_name_wins_over_a_names_end():
    flags = {p for p in ("--n", "--max-tokens")}
    said = foreign_answer("rollout", "--tensor_parallel_size", flags)
    assert said is not None and said.startswith("vLLM's --tensor-parallel-size") and "OpenRLHF" not in said
    assert foreign_answer("rollout", "--n-samples-per-prompt", flags).startswith("OpenRLHF's")   # the end of a name
    assert foreign_answer("rollout", "--len", flags) is None    # one word: no match on verl's overlong_buffer.len
    assert foreign_answer("rollout", "--max_tokens", flags) is None   # pdsr's own, spelled with underscores


@pytest.mark.parametrize("args, answer", [
    (["rollout", "-tp", "2"], "No such option '-tp': vLLM's -tp is pdsr's config key "
                              "engine_defaults.tensor_parallel_size"),
    (["serve", "-tp=2"], "No such option '-tp': vLLM's -tp is pdsr's config key engine_defaults.tensor_parallel_size"),
    (["rollout", "-pp", "2"], "No such option '-pp': vLLM's -pp: pdsr has none (an engine's GPUs are its "
                              "tensor_parallel_size; more GPUs run more engines"),
    (["serve", "--data-parallel-size", "2"], "vLLM's --data-parallel-size: pdsr has none"),
    (["rollout", "--enforce-eager"], "vLLM's --enforce-eager is pdsr's config key "
                                     "engine_defaults.engine_args.enforce_eager"),
    (["serve", "--max-num-batched-tokens", "8192"], "engine_defaults.engine_args.max_num_batched_tokens"),
    (["rollout", "--tokenizer", "x"], "vLLM's --tokenizer is pdsr's config key tokenizer"),
    (["serve", "--seed", "3"], "vLLM's --seed is pdsr's config key seed"),
    (["rollout", "--enable-prefix-caching"], "vLLM's --enable-prefix-caching: pdsr has none (prefix caching is "
                                             "always on"),
])
def test_vllms_engine_flags_are_answered(args, answer):   # -tp: click reads -t, then p
    failed(invoke(*args), answer)


def test_a_short_flag_no_row_names_keeps_clicks_message():
    out = failed(invoke("rollout", "-xz", "2"), "No such option")
    assert "pdsr's" not in out and "has none" not in out


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM's AsyncEngineArgs needs vLLM")
def test_every_engine_args_answer_is_an_argument_vllm_takes():
    from pdsr_sdk.engines.config import EngineSpec
    from pdsr_sdk.engines.vllm_args import check_engine_args

    prefix = "engine_defaults.engine_args."
    keys = {r.key[len(prefix):] for r in FOREIGN_NAMES if r.key and r.key.startswith(prefix)}
    assert {"enforce_eager", "max_num_batched_tokens", "kv_cache_dtype"} <= keys
    check_engine_args(EngineSpec(name="e", pool="fast", engine_args=dict.fromkeys(keys, 1)))   # raises on one it lacks


def _coming_from_names() -> list[str]:
    """The other tools' names in docs/coming-from.md's tables (their columns, not pdsr's last one)."""
    names = []
    for line in (ROOT / "docs" / "coming-from.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or cells[0] in ("TRL", "verl") or cells[0].startswith("---"):
            continue
        for cell in cells[:-1]:
            while cell != (cell := re.sub(r"\([^()]*\)", "", cell)):   # asides: values, what they count
                pass
            names += [m.split(" ")[0] for m in re.findall(r"`([^`]+)`", cell)]
    return names


def test_every_name_coming_from_maps_is_answered():
    # the page says the CLI answers its tables' names typed as flags: each is a row, or pdsr's own flag
    flags = {opt for p in _command("rollout").params for opt in (*p.opts, *p.secondary_opts)}
    names = _coming_from_names()
    assert {"num_generations", "use_vllm", "--vllm.enable_sleep", "-tp", "engine_kwargs.vllm"} <= set(names)
    unanswered = [n for n in names if "--" + n.lstrip("-").replace("_", "-") not in flags
                  and not any(foreign_answer(c, n, flags) for c in ("rollout", "serve"))]
    assert not unanswered


def _trl_advantage_names() -> list[str]:
    """TRL's names in the first column of docs/scoring-gae.md's "Coming from TRL" table (values left out)."""
    text = (ROOT / "docs" / "scoring-gae.md").read_text()
    section = text.split("### Coming from TRL", 1)[1].split("\n### ", 1)[0]
    names = []
    for line in section.splitlines():
        cell = line.strip().strip("|").split("|")[0].strip()
        if not line.startswith("| ") or cell in ("TRL", "") or cell.startswith("---"):
            continue
        while cell != (cell := re.sub(r"\([^()]*\)", "", cell)):   # asides: values, defaults
            pass
        names += [m.split("=")[0] for m in re.findall(r"`([^`]+)`", cell) if re.match(r"[a-z][a-z_]*(=|$)", m)]
    return names


def test_every_trl_name_the_advantage_page_maps_is_answered():
    # TRL's loss settings were unanswered on pdsr gae, and click's guess for --epsilon (TRL's PPO clip) was --eps,
    # the std's epsilon: a TRL user following it would have set the advantages' eps to 0.2
    names = _trl_advantage_names()
    assert {"scale_rewards", "loss_type", "epsilon", "beta", "mask_truncated_completions"} <= set(names)
    flags = {opt for p in _command("gae").params for opt in (*p.opts, *p.secondary_opts)}
    assert not [n for n in names if not any(foreign_answer(c, n, flags) for c in ("gae", "rollout"))]
    out = failed(invoke("gae", "--estimator", "grpo", "--epsilon", "0.2"), "No such option '--epsilon': TRL's epsilon: "
                 "pdsr has none (the PPO clip of the trainer's loss, not pdsr's --eps")
    assert "Did you mean" not in out


def test_every_openrlhf_flag_the_advantage_page_maps_is_answered():
    # OpenRLHF's loss flags were unanswered, and click's guess for --eps-clip (OpenRLHF's PPO clip, --eps_clip before
    # April 2026) was --eps, the std's epsilon
    text = (ROOT / "docs" / "scoring-gae.md").read_text()
    section = text.split("### Coming from OpenRLHF", 1)[1].split("\n## ", 1)[0]
    names = {m.split(" ")[0] for m in re.findall(r"`(--[^`]+)`", section)}
    assert {"--actor.eps_clip", "--algo.kl.init_coef", "--reward.clip_range"} <= names
    flags = {c: {opt for p in _command(c).params for opt in (*p.opts, *p.secondary_opts)} for c in ("gae", "rollout")}
    assert not [n for n in names if n not in flags["gae"] | flags["rollout"]
                and not any(foreign_answer(c, n, flags[c]) for c in ("gae", "rollout"))]
    out = failed(invoke("gae", "--estimator", "grpo", "--eps-clip", "0.2"),
                 "No such option '--eps-clip': OpenRLHF's --actor.eps_clip: pdsr has none (the trainer's loss")
    assert "Did you mean" not in out
