"""A reward function that cannot be loaded (``--reward`` or ``reward`` in a --config file), and an agent function
given in a --config file, are errors naming where they were given: the key and flag, and the --config file when the
flag was not given, as pdsr's config errors name it; before the data is read or any engine starts. (They were
``error: cannot import module ...``, with no word of the flag or file.)"""

from __future__ import annotations

import sys

import pytest

from cli_checks import failed, invoke
from pdsr_sdk.errors import ConfigError


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    (tmp_path / "pdsr_rw_pkg").mkdir()
    (tmp_path / "pdsr_rw_pkg" / "__init__.py").write_text("")
    (tmp_path / "pdsr_rw_pkg" / "rewards.py").write_text(
        "def one_argument(text):\n    return 1.0\n\nNOT_A_FUNCTION = 3\n")
    (tmp_path / "pdsr_rw_pkg" / "broken.py").write_text("def compute_score(:\n    pass\n")
    (tmp_path / "pdsr_rw_pkg" / "raising.py").write_text("import os\nTOKEN = os.environ['PDSR_RW_NO_SUCH_VAR']\n")
    (tmp_path / "pdsr_rw_file.py").write_text("import math\n\ndef other(text, ground_truth):\n    return 0.0\n")
    (tmp_path / "pdsr_rw_raising_file.py").write_text("import pdsr_rw_no_such_pkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("pdsr_rw_pkg", "pdsr_rw_pkg.rewards", "pdsr_rw_pkg.broken", "pdsr_rw_pkg.raising", "pdsr_rw_file",
                 "pdsr_rw_raising_file"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


CASES = [
    ("pdsr_rw_pkg.nomod:fn", "cannot import module 'pdsr_rw_pkg.nomod' (from 'pdsr_rw_pkg.nomod:fn')"),
    ("pdsr_rw_pkg.rewards:nope", "module 'pdsr_rw_pkg.rewards' has no attribute 'nope' (from "
                                 "'pdsr_rw_pkg.rewards:nope'); a reward function named by import path"),
    ("pdsr_rw_pkg.rewards:NOT_A_FUNCTION", "'pdsr_rw_pkg.rewards:NOT_A_FUNCTION': 3 (int) is not callable"),
    ("pdsr_rw_pkg.rewards:one_argument", "'pdsr_rw_pkg.rewards:one_argument' (pdsr_rw_pkg.rewards:one_argument(text)) "
                                         "cannot be called with any signature pdsr knows"),
    ("{tmp}/absent.py:compute_score", "'{tmp}/absent.py:compute_score': no such file: {tmp}/absent.py"),
    # verl's custom_reward_function.path and .name: the file, and what it defines (not a word of import paths)
    ("{tmp}/pdsr_rw_file.py:compute_score", "'{tmp}/pdsr_rw_file.py:compute_score': {tmp}/pdsr_rw_file.py has no "
                                            "'compute_score' (its functions: other)"),
    # the module's own code fails: its file and line, not a traceback through importlib
    ("pdsr_rw_pkg.broken:compute_score", "cannot import module 'pdsr_rw_pkg.broken' (from "
                                         "'pdsr_rw_pkg.broken:compute_score'): invalid syntax "
                                         "({tmp}/pdsr_rw_pkg/broken.py, line 1)"),
    # a file whose import fails: named as given (not as the module attribute pdsr imports it by)
    ("{tmp}/pdsr_rw_raising_file.py:compute_score", "cannot import module 'pdsr_rw_raising_file' (from "
                                                    "'{tmp}/pdsr_rw_raising_file.py:compute_score'): No module named "
                                                    "'pdsr_rw_no_such_pkg'"),
    ("pdsr_rw_pkg.raising:fn", "cannot import module 'pdsr_rw_pkg.raising' (from 'pdsr_rw_pkg.raising:fn'): its code "
                               "raised KeyError: 'PDSR_RW_NO_SUCH_VAR' ({tmp}/pdsr_rw_pkg/raising.py, line 2)"),
]


def _run(tmp_path, prompts, *args):
    out = tmp_path / "r.parquet"
    result = invoke("rollout", *args, "--data", prompts, "--out", out)
    assert not out.exists()
    return result


@pytest.mark.parametrize("given, says", CASES, ids=[c[0].split(":")[-1] for c in CASES])
def test_a_bad_reward_flag_names_the_flag_and_key(user_pkg, tmp_path, prompts, no_engines, given, says):
    given, says = given.format(tmp=tmp_path), says.format(tmp=tmp_path)
    out = failed(_run(tmp_path, prompts, "--reward", given), f"error: reward (--reward): {says}")
    assert out.count("reward (--reward)") == 1 and "pdsr: data:" not in out   # before the data is read
    assert "Traceback" not in out


@pytest.mark.parametrize("given, says", CASES, ids=[c[0].split(":")[-1] for c in CASES])
def test_a_bad_reward_in_a_config_file_names_the_file(user_pkg, tmp_path, prompts, no_engines, given, says):
    given, says = given.format(tmp=tmp_path), says.format(tmp=tmp_path)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"reward: '{given}'\n")
    failed(_run(tmp_path, prompts, "--config", cfg), f"error: {cfg}: reward (--reward): {says}")


def test_the_flag_over_a_file_is_named_as_the_flag(user_pkg, tmp_path, prompts, no_engines):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("reward: math_boxed\nagent:\n  function: pdsr_rw_pkg.nomod:run\n")
    out = failed(_run(tmp_path, prompts, "--config", cfg, "--reward", "pdsr_rw_pkg.nomod:fn"),
                 "error: reward (--reward): cannot import module 'pdsr_rw_pkg.nomod'")
    assert str(cfg) not in out
    # the reward is fine, the file's agent is not
    failed(_run(tmp_path, prompts, "--config", cfg),
           f"error: {cfg}: agent.function (--agent): cannot import module 'pdsr_rw_pkg.nomod' (from "
           "'pdsr_rw_pkg.nomod:run')")
    out = failed(_run(tmp_path, prompts, "--config", cfg, "--agent", "pdsr_rw_pkg.rewards:one_argument"),
                 "error: agent.function (--agent): 'pdsr_rw_pkg.rewards:one_argument' must be an `async def")
    assert str(cfg) not in out


def test_the_sdk_names_the_key_and_flag_or_what_it_is_told(user_pkg):
    from pdsr_sdk.rollout.reward import load_reward, resolve_reward

    with pytest.raises(ConfigError, match=r"^reward \(--reward\): cannot import module 'pdsr_rw_pkg\.nomod'"):
        resolve_reward("pdsr_rw_pkg.nomod:fn", True)
    with pytest.raises(ConfigError, match=r"^RolloutSession\(reward\): 'pdsr_rw_pkg\.rewards:one_argument' "):
        load_reward("pdsr_rw_pkg.rewards:one_argument", where="RolloutSession(reward)")
    assert load_reward("pdsr_sdk.rollout.reward:math_boxed").__name__ == "math_boxed"


@pytest.mark.parametrize("key, text", [("reward", "reward: pdsr_rw_pkg.nomod:fn\n"),
                                       ("agent.function", "agent:\n  function: pdsr_rw_pkg.nomod:fn\n")])
def test_pdsr_serve_names_the_file_and_key_without_a_flag_it_lacks(user_pkg, tmp_path, no_engines, key, text):
    # serve has no --reward or --agent: its reward and agent come from the --config file alone
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(text)
    out = failed(invoke("serve", "--config", cfg, "--port", "0"),
                 f"error: {cfg}: {key}: cannot import module 'pdsr_rw_pkg.nomod' (from 'pdsr_rw_pkg.nomod:fn')")
    assert "--reward" not in out and "--agent" not in out
