"""The trainer's SDK surface (docs/sdk.md): names, prompts a step takes, misuse messages before any engine
starts, a prompt past the session's context, and the README's trainer snippet run as written."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

import pytest

from support import ROOT, requires_torch, requires_vllm
from pdsr_sdk.errors import DataError, RunError


def test_the_trainer_names_come_from_pdsr_sdk():
    import pdsr_sdk
    from pdsr_sdk import PromptRecord, RolloutConfig, RolloutSession, StepResult, load_config
    from pdsr_sdk.rollout.session import RolloutSession as direct

    assert RolloutSession is direct and callable(load_config) and StepResult and PromptRecord
    assert {"RolloutSession", "RolloutConfig", "StepResult", "grpo_advantages", "per_token_logps"} <= set(dir(pdsr_sdk))
    assert RolloutConfig().model is None


def test_the_synchronous_calls_need_the_session_open():
    from pdsr_sdk import RolloutConfig, RolloutSession

    session = RolloutSession(RolloutConfig(policy="baseline"))
    with pytest.raises(RunError, match=r"with RolloutSession\(config\) as session"):
        session.step(["hi"])

    async def inside():
        session.update_weights({})

    with pytest.raises(RunError, match=r"await session\.aupdate_weights"):
        asyncio.run(inside())


def test_waiting_for_an_update_is_for_partial_rollout_only():
    """A step without over_provision ends when its groups are complete: ``wait_for_update`` is refused with
    a ConfigError that says what it is for, before any engine starts."""
    from pdsr_sdk import RolloutConfig, RolloutSession
    from pdsr_sdk.errors import ConfigError

    session = RolloutSession(RolloutConfig(policy="baseline"))
    with pytest.raises(ConfigError, match=r"wait_for_update=True\) is for partial rollout"):
        asyncio.run(session.astep(["hi"], wait_for_update=True))
    assert not session._started


@requires_torch
def test_prompts_a_step_takes(tiny_model_dir):
    from pdsr_sdk.rollout.config import DataConfig
    from pdsr_sdk.rollout.data import PromptRecord, load_tokenizer, prompt_records

    tok = load_tokenizer(tiny_model_dir)
    cfg = DataConfig(system_prompt="Be brief.")
    records = prompt_records(
        ["What is 1 + 1?",
         [{"role": "user", "content": "Hi"}],
         {"prompt": "2 + 2?", "answer": "4"},
         {"id": 7, "messages": [{"role": "user", "content": "3 + 3?"}], "ground_truth": "6"},
         PromptRecord("mine", "x", [1, 2, 3])], cfg, tok, id_prefix="s0-p")
    assert [r.prompt_id for r in records] == ["s0-p0", "s0-p1", "s0-p2", "7", "mine"]
    assert [r.ground_truth for r in records] == [None, None, "4", "6", None]
    assert records[0].text.startswith("<|im_start|>system\nBe "
                                      "brief.<|im_end|>") and records[0].text.endswith("assistant\n")
    assert records[0].token_ids == tok(records[0].text, add_special_tokens=False)["input_ids"]
    with pytest.raises(DataError, match=r"prompts\[1\]: duplicate prompt id 'a'"):
        prompt_records([{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}], cfg, tok)
    with pytest.raises(DataError, match=r"prompts\[0\]: a prompt mapping needs .*'prompt' \(a string or chat "
                                        r"messages\).*got keys \[.text.\]"):
        prompt_records([{"text": "x"}], cfg, tok)
    with pytest.raises(DataError, match=r"prompts\[0\]: a prompt is a string.*got int"):
        prompt_records([3], cfg, tok)
    with pytest.raises(DataError, match=r"prompts\[1\]: a list of ints looks like token ids; give them as a "
                                        r"PromptRecord\(prompt_id, text, token_ids\)"):
        prompt_records(["x", [37, 81]], cfg, tok)


@requires_torch
def test_a_verl_row_is_a_prompt(tiny_model_dir):
    """A row of verl's parquet (as verl's gsm8k preprocessing script writes it: ``prompt`` as chat messages, the
    answer in ``reward_model``), as ``datasets`` or pandas (a numpy array of messages) hands it on, is the same
    prompt as its messages with their ground truth, data_source and extra_info given by name. It was a DataError
    ("needs a non-empty 'prompt' string or 'messages'") while ``pdsr rollout --data`` read the same file."""
    import numpy as np

    from pdsr_sdk.rollout.config import DataConfig
    from pdsr_sdk.rollout.data import load_tokenizer, prompt_records

    tok, cfg = load_tokenizer(tiny_model_dir), DataConfig()
    messages = [{"role": "user", "content": "Natalia sold 48 clips. Output the final answer after \"####\"."}]
    info = {"split": "train", "index": 0}
    row = {"data_source": "openai/gsm8k", "prompt": messages, "ability": "math",
           "reward_model": {"style": "rule", "ground_truth": "72"}, "extra_info": info}
    named = prompt_records([{"messages": messages, "ground_truth": "72", "data_source": "openai/gsm8k",
                             "extra_info": info}], cfg, tok)[0]
    for got in prompt_records([row, {**row, "prompt": np.array(messages, dtype=object)}], cfg, tok):
        assert (got.text, got.token_ids, got.ground_truth, got.reward_info) == \
            (named.text, named.token_ids, "72", named.reward_info)
    assert named.reward_info == {"data_source": "openai/gsm8k", "extra_info": info}
    assert prompt_records([{**row, "ground_truth": "7"}], cfg, tok)[0].ground_truth == "7"   # a name given wins
    with pytest.raises(DataError, match=r"prompts\[0\]: column 'prompt' must be a non-empty list"):
        prompt_records([{**row, "prompt": []}], cfg, tok)


def readme_trainer_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### From a trainer"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_the_readme_trainer_snippet_runs_as_written(tmp_path):
    """Extracted from README.md and run unchanged in a fresh interpreter (spawned engine processes,
    the built-in tiny model since the snippet names none): two steps with a weight update between."""
    script = tmp_path / "trainer.py"
    script.write_text(readme_trainer_snippet())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    lines = [line.split() for line in out.stdout.strip().splitlines()]
    # step, the policy version of its segments, rows (B=4 x N=4), tokens/s
    assert [(line[0], line[1], line[2]) for line in lines] == [("0", "0", "16"), ("1", "1", "16")]
    assert "Traceback" not in out.stderr


@requires_torch
def test_a_prompt_past_the_sessions_context_names_the_setting_that_raises_it(tiny_model_dir):
    """The automatic layout gives a session's engines ``sampling.max_tokens + 1024`` tokens of context
    (docs/sdk.md): a longer prompt is a DataError naming it, the limit and ``engine_defaults.max_model_len``
    (the session goes on); with that set, the same prompt runs (fake engines from the layout)."""
    from pdsr_sdk import RolloutConfig, RolloutSession
    from pdsr_sdk.rollout.data import PromptRecord

    def config(**defaults):
        return RolloutConfig(model=str(tiny_model_dir), policy="baseline", fast=1, heavy=0,
                             sampling={"n": 2, "max_tokens": 16},
                             engine_defaults={"backend": "fakes:LoopEngine", **defaults})

    long = PromptRecord("long", "", [5] * 1100)
    with RolloutSession(config()) as session:
        assert [e.spec.max_model_len for e in session.engines] == [16 + 1024]
        with pytest.raises(DataError, match=r"step 0: prompt 'long': 1100 prompt tokens \+ 16 response tokens "
                                            r"\(sampling.max_tokens\) = 1116 exceed the engines' context of 1040 "
                                            r"tokens \(the session's default, sampling.max_tokens \+ 1024; raise it "
                                            r"with engine_defaults=\{'max_model_len': \.\.\.\}\)"):
            session.step([long])
        assert len(session.step([PromptRecord("short", "", [5] * 1000)]).samples) == 2
    with RolloutSession(config(max_model_len=2048)) as session:
        assert len(session.step([long]).samples) == 2
        with pytest.raises(DataError, match=r"context of 2048 tokens \(engine_defaults.max_model_len\)"):
            session.step([PromptRecord("longer", "", [5] * 2040)])


def test_a_reward_that_is_not_callable_is_an_error_before_any_engine():
    """``reward=3`` used to be taken (a failed signature read as a builtin's) and every sample got a reward error;
    docs/data-rewards.md says a reward pdsr cannot call is an error before any engine starts."""
    from pdsr_sdk import RolloutConfig, RolloutSession
    from pdsr_sdk.errors import ConfigError

    for bad in (3, "pkg.mod:fn"):
        with pytest.raises(ConfigError, match=rf"reward 'reward': {re.escape(repr(bad))} \({type(bad).__name__}\) is "
                                              rf"not callable; give a function: fn\(response_text, ground_truth"):
            RolloutSession(RolloutConfig(policy="baseline"), reward=bad)
