"""Rewards on real vLLM engines (the session's shared fp32 pair, tests/conftest.py): verl's ``compute_score`` given
by file, as verl's ``custom_reward_function.path`` gives it, on a verl-layout parquet, run in worker processes
(``reward_executor: process``) and shaped by DAPO's overlong buffer. The reference is the rule written here, applied
to each row's own decoded response and data row; the unit tests of the same paths run on fake engines
(tests/rollout/test_reward_verl.py, test_reward_executor.py, test_dapo_semantics.py)."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from real_rollout import by_key, rollout
from support import requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s

#: forced response lengths per prompt (ignore_eos), either side of the overlong buffer's start (MAX - BUFFER)
LENGTHS = {"v0": [5, 20], "v1": [16, 32], "v2": [9, 27]}
MAX, BUFFER, PENALTY = 32, 16, 0.5

REWARD_FILE = '''import os


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": (len(solution_str) % 5) / 4, "source": data_source, "truth": ground_truth,
            "index": extra_info["index"], "pid": os.getpid()}
'''


def write_verl_parquet(path):
    """verl's layout: chat messages, ``reward_model.ground_truth``, ``data_source``, ``extra_info``."""
    rows = [{"data_source": f"src-{i}", "prompt": [{"role": "user", "content": f"What is {i} + {i * 3}?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(4 * i)},
             "extra_info": {"split": "test", "index": 10 + i}, "id": pid, "lengths": lengths}
            for i, (pid, lengths) in enumerate(LENGTHS.items())]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_a_verl_reward_file_scores_real_responses_in_worker_processes_with_overlong_shaping(
        engine_loop, engines, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    data = write_verl_parquet(tmp_path / "verl.parquet")
    (tmp_path / "verl_reward_on_engines.py").write_text(REWARD_FILE)
    summary, rows = rollout(
        engine_loop, engines, tiny_model_dir, tmp_path, data, "baseline", batch_size=3,
        **{"sampling.n": 2, "sampling.max_tokens": MAX, "reward": f"{tmp_path}/verl_reward_on_engines.py:compute_score",
           "reward_executor": "process", "overlong_buffer": BUFFER, "overlong_penalty": PENALTY})
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    got = by_key(rows)
    assert set(got) == {(p, k) for p in LENGTHS for k in range(2)}
    assert summary.stats["reward_errors"] == 0 and summary.rewarded_samples == 6
    for (pid, k), r in got.items():
        i = int(pid[1:])
        length = LENGTHS[pid][k]
        assert r["response_length"] == length and r["reward_error"] is None
        text = tok.decode(r["response_token_ids"], skip_special_tokens=True)
        assert r["response_text"] == text
        # DAPO's shaping, from verl's formula: nothing up to MAX - BUFFER tokens, PENALTY at MAX
        shaped = min(-(length - (MAX - BUFFER)) / BUFFER * PENALTY, 0.0)
        assert r["reward"] == pytest.approx((len(text) % 5) / 4 + shaped)
        extra = r["reward_extra"]
        assert (extra["source"], extra["truth"], extra["index"]) == (f"src-{i}", str(4 * i), 10 + i)
        assert extra["overlong_reward"] == pytest.approx(shaped) and extra["overlong"] == (shaped < 0)
        assert extra["pid"] != os.getpid()   # scored in a worker process, not in the run's
