"""``reward_executor: process``: reward functions run in spawned worker processes and give the scores threads
give; a reward that cannot be sent to a process is an error before any engine starts."""

from __future__ import annotations

import os
import re
import sys

import pytest

from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch

PROMPTS = [{"id": f"q{i}", "prompt": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(4)]


def scored(text, ground_truth, *, prompt_id, sample_index, **info):
    """A reward that says where it ran: the score from the ids, the process in an extra field."""
    return {"score": float(int(prompt_id[1:]) + sample_index) / 10, "pid": os.getpid()}


def config(tiny_model_dir, **kw) -> RolloutConfig:
    kw.setdefault("reward", "test_reward_executor:scored")
    return RolloutConfig(model=str(tiny_model_dir), policy="baseline", batch_size=len(PROMPTS),
                         sampling={"n": 3, "max_tokens": 4},
                         engines=[{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine",
                                   "max_model_len": 256}], **kw)


def rows(tiny_model_dir, **kw) -> list[dict]:
    with RolloutSession(config(tiny_model_dir, **kw)) as session:
        return session.step(PROMPTS).table.to_pylist()


@requires_torch
def test_process_workers_give_the_scores_threads_give(tiny_model_dir):
    threads = rows(tiny_model_dir)
    processes = rows(tiny_model_dir, reward_executor="process", reward_workers=2)
    key = lambda r: (r["prompt_id"], r["sample_index"])  # noqa: E731
    assert [(key(r), r["reward"]) for r in sorted(threads, key=key)] == \
           [(key(r), r["reward"]) for r in sorted(processes, key=key)]
    assert len(processes) == 12 and {r["reward"] for r in processes} != {None}
    pid = lambda r: r["reward_extra"]["pid"]  # noqa: E731   (a struct column: every row has the same keys)
    assert all(pid(r) == os.getpid() for r in threads)
    assert all(pid(r) != os.getpid() for r in processes)


@requires_torch
def test_a_reward_that_cannot_pickle_is_an_error_before_engines_start(tiny_model_dir):
    session = RolloutSession(config(tiny_model_dir, reward_executor="process"),
                             reward=lambda text, ground_truth, **info: 1.0)
    with pytest.raises(ConfigError, match=r"reward_executor 'process'.*cannot be sent to a worker process.*"
                                          r"import path"):
        with session:
            session.step(PROMPTS)
    assert not session.engines   # none was built


@requires_torch
def test_math_verify_with_process_workers_says_it_has_its_own(tiny_model_dir):
    cfg = config(tiny_model_dir, reward_executor="process").model_copy(update={"reward": "math_verify"})
    session = RolloutSession(cfg)
    with pytest.raises(ConfigError, match=r"runs its checks in worker processes already.*reward_executor 'thread'"):
        with session:
            session.step(PROMPTS)
    assert not session.engines


def exits(text, ground_truth, *, prompt_id, sample_index, **info):
    """A reward that runs the model's code, which calls sys.exit() on one sample (unit tests run by exec)."""
    if (prompt_id, sample_index) == ("q1", 0):
        sys.exit(3)
    return 1.0


def dies(text, ground_truth, *, prompt_id, sample_index, **info):
    """A reward whose process ends under it on one sample (the model's code called os._exit)."""
    if (prompt_id, sample_index) == ("q1", 0):
        os._exit(3)
    return 1.0


class FunctionTimedOut(BaseException):
    """func_timeout's exception, a BaseException as it is there (pytest's Failed is one too)."""


def times_out(text, ground_truth, *, prompt_id, sample_index, **info):
    """A reward whose own time limit (func_timeout's, around the model's code) ran out on one sample."""
    if (prompt_id, sample_index) == ("q1", 0):
        raise FunctionTimedOut("the code ran past 3 s")
    return 1.0


@requires_torch
@pytest.mark.parametrize("executor, reward, error", [
    ("thread", "exits", r"SystemExit: the reward called sys\.exit\(3\)"),
    ("process", "exits", r"SystemExit: the reward called sys\.exit\(3\)"),
    ("process", "dies", r"the reward's worker process died while scoring this sample"),
    # before, the run stopped with the exception's traceback, every sample's reward lost
    ("thread", "times_out", r"^FunctionTimedOut: the code ran past 3 s$"),
    ("process", "times_out", r"^FunctionTimedOut: the code ran past 3 s$"),
])
def test_a_reward_that_exits_fails_its_own_sample_only(tiny_model_dir, executor, reward, error):
    cfg = config(tiny_model_dir, reward_executor=executor, reward_workers=2).model_copy(
        update={"reward": f"test_reward_executor:{reward}"})
    with RolloutSession(cfg) as session:
        first = session.step(PROMPTS)
        second = session.step(PROMPTS)   # the session goes on, and so do the workers
    failed = [r for r in first.table.to_pylist() if r["reward_error"] is not None]
    assert [(r["prompt_id"], r["sample_index"], r["reward"]) for r in failed] == [("q1", 0, None)]
    assert re.search(error, failed[0]["reward_error"])
    assert first.summary["reward_errors"] == 1 and second.summary["reward_errors"] == 1
    assert sorted(r["reward"] for r in first.table.to_pylist() if r["reward_error"] is None) == [1.0] * 11


@requires_torch
@pytest.mark.parametrize("executor", ["thread", "process"])
def test_a_reward_given_by_its_file_path_as_verl_takes_it(tiny_model_dir, tmp_path, executor):
    """verl names a reward by file (custom_reward_function.path and .name): path/to/file.py:fn, a folder not
    on sys.path, works on threads and in worker processes."""
    folder = tmp_path / f"rewards_{executor}"
    folder.mkdir()
    stem = f"my_verl_reward_{executor}"
    (folder / f"{stem}.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(ground_truth) + 0.5\n")
    got = rows(tiny_model_dir, reward=f"{folder / stem}.py:compute_score", reward_executor=executor)
    assert sorted({r["reward"] for r in got}) == [0.5, 2.5, 4.5, 6.5] and {r["reward_error"] for r in got} == {None}


def test_a_reward_file_that_is_missing_or_shadows_a_module_is_an_error(tmp_path):
    from pdsr_sdk.rollout.reward import resolve_reward

    with pytest.raises(ConfigError, match=r"no such file: .*absent\.py"):
        resolve_reward(f"{tmp_path / 'absent.py'}:compute_score", True)
    (tmp_path / "json.py").write_text("def compute_score(data_source, solution_str, ground_truth):\n    return 1.0\n")
    with pytest.raises(ConfigError, match=r"a module named 'json' is imported already .*rename json\.py"):
        resolve_reward(f"{tmp_path / 'json.py'}:compute_score", True)
