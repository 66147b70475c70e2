"""``pdsr gae --estimator grpo|rloo|reinforce_plus_plus|reinforce_plus_plus_baseline`` on a table of rollouts equals
the SDK's estimator (held to float64 loops and verl's code in test_grpo_whiten.py and test_outcome_verl.py) called
on the same arrays padded to [N, T], broadcast over each valid token as verl does (``adv[:, None] * mask``), 0 on
masked ones; with groups whose rows lie apart in the file and in different blocks of rows; bad input is one error
line naming the flag, column or row."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_checks import failed, invoke
from support import ROOT, requires_vllm
from pdsr_sdk.gae import (grpo_advantages, reinforce_pp_advantages, reinforce_pp_baseline_advantages,
                          rloo_advantages)
from pdsr_sdk.gae.table import row_blocks

BLOCK = 64   # padded cells per block of rows, forced small so that a group's rows fall in different blocks


def rollout_like(seed: int, per_token: bool = False) -> tuple[pa.Table, dict]:
    """Rows as `pdsr rollout` writes them: prompt_id groups of 1-5 samples shuffled through the file, response
    token lists of 0-12 tokens (two of 30), response_mask null (single-turn) or partial or all 0, a float32
    reward per row (one group's all equal) or, with ``per_token``, a list of per-token rewards."""
    rng = np.random.default_rng(seed)
    sizes = [1, 3, 5, 2, 4, 1, 3, 4, 2, 5]
    ids = np.repeat([f"p{g}" for g in range(len(sizes))], sizes)
    ids = ids[rng.permutation(len(ids))]
    n = len(ids)
    lengths = rng.integers(0, 13, n)
    lengths[[4, 17]] = 30
    masks = []
    for i, t in enumerate(lengths):
        if i % 3 == 0:
            masks.append(None)                                   # single-turn: every token valid
        elif i == 7:
            masks.append([0] * int(t))                           # no valid token
        else:
            masks.append((rng.random(t) < 0.75).astype(int).tolist())
    reward = rng.integers(0, 3, n).astype(np.float32) / 2
    reward[ids == "p3"] = 1.0                                    # a group of equal rewards
    columns = {
        "prompt_id": pa.array(ids.tolist()),
        "response_token_ids": pa.array([list(range(t)) for t in lengths], pa.list_(pa.int32())),
        "response_mask": pa.array(masks, pa.list_(pa.int8())),
    }
    if per_token:
        columns["rewards"] = pa.array([rng.standard_normal(t).astype(np.float32).tolist() for t in lengths],
                                      pa.list_(pa.float32()))
    t_max = int(lengths.max())
    mask = np.zeros((n, t_max), dtype=bool)
    for i, m in enumerate(masks):
        mask[i, :lengths[i]] = True if m is None else np.asarray(m, dtype=bool)
    # REINFORCE++ has no token to put a reward on in a row without a valid token (the SDK refuses, the CLI warns)
    reward[~mask.any(axis=1)] = 0.0
    columns.setdefault("reward", pa.array(reward))
    arrays = {"ids": ids, "lengths": lengths, "mask": mask}
    if per_token:
        arrays["token_rewards"] = np.zeros((n, t_max), dtype=np.float32)
        for i, r in enumerate(columns["rewards"].to_pylist()):
            arrays["token_rewards"][i, :len(r)] = r
        arrays["reward"] = np.array([sum(r) for r in columns["rewards"].to_pylist()])   # verl sums them
    else:
        arrays["reward"] = reward
    return pa.table(columns), arrays


def run_cli(tmp_path, monkeypatch, table, *flags):
    monkeypatch.setattr("pdsr_sdk.gae.table.BLOCK_CELLS", BLOCK)
    src, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(table, src)
    result = invoke("gae", "--data", src, "--out", out, "--overwrite", "--quiet", *flags)
    assert result.exit_code == 0, result.output
    return pq.read_table(out), result.output


def assert_rows(got: list, want: np.ndarray, a: dict) -> None:
    """Each output row as long as its response, equal to the padded reference's row, masked tokens exactly 0."""
    for i, row in enumerate(got):
        assert len(row) == a["lengths"][i], i
        np.testing.assert_allclose(row, want[i, :len(row)], rtol=1e-5, atol=1e-6, err_msg=f"row {i}")
        assert not np.any(np.asarray(row)[~a["mask"][i, :len(row)]]), f"row {i}: a masked token is not 0"


@pytest.mark.parametrize("seed", range(1, 6))
def test_groups_lie_apart_and_across_blocks(seed):
    """What the tests below rely on: some group's rows are in two different blocks of rows."""
    _, a = rollout_like(seed)
    blocks = row_blocks(a["lengths"], BLOCK)
    block_of = np.searchsorted([end for _, end in blocks], np.arange(len(a["ids"])), side="right")
    assert len(blocks) > 3
    assert any(len(set(block_of[a["ids"] == g])) > 1 for g in set(a["ids"]))


@pytest.mark.parametrize("flags, kwargs", [
    ((), {}),
    (("--normalize-std", "batch", "--eps", "1e-4"), {"normalize_std": "batch", "eps": 1e-4}),
    (("--normalize-std", "none", "--singleton", "score"), {"normalize_std": False, "singleton": "score"}),
])
def test_grpo_equals_the_sdk_per_token(tmp_path, monkeypatch, flags, kwargs):
    table, a = rollout_like(1)
    out, printed = run_cli(tmp_path, monkeypatch, table, "--estimator", "grpo", *flags)
    want = grpo_advantages(a["reward"], a["ids"], **kwargs)[:, None] * a["mask"]
    assert_rows(out.column("advantages").to_pylist(), want, a)
    assert "returns" not in out.column_names and out.column_names[:-1] == table.column_names
    assert f"{len(a['ids'])} rows" in printed and "estimator grpo" in printed


def test_grpo_sums_a_per_token_rewards_list(tmp_path, monkeypatch):
    table, a = rollout_like(2, per_token=True)
    out, _ = run_cli(tmp_path, monkeypatch, table, "--estimator", "grpo")
    want = grpo_advantages(a["reward"], a["ids"])[:, None] * a["mask"]
    assert_rows(out.column("advantages").to_pylist(), want, a)


@pytest.mark.parametrize("singleton", ["zero", "score"])
def test_rloo_equals_the_sdk_per_token(tmp_path, monkeypatch, singleton):
    table, a = rollout_like(3)
    out, _ = run_cli(tmp_path, monkeypatch, table, "--estimator", "rloo", "--singleton", singleton)
    want = rloo_advantages(a["reward"], a["ids"], singleton=singleton)[:, None] * a["mask"]
    assert_rows(out.column("advantages").to_pylist(), want, a)


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_equals_the_sdk(tmp_path, monkeypatch, gamma, per_token):
    table, a = rollout_like(4, per_token=per_token)
    out, printed = run_cli(tmp_path, monkeypatch, table, "--estimator", "reinforce_plus_plus", "--gamma", gamma,
                           "--backend", "numba")
    rewards = a["token_rewards"] if per_token else a["reward"]
    want_adv, want_ret = reinforce_pp_advantages(rewards, a["mask"], gamma=gamma)
    assert_rows(out.column("advantages").to_pylist(), want_adv, a)
    assert_rows(out.column("returns").to_pylist(), want_ret, a)
    assert "backend numba" in printed


@pytest.mark.parametrize("singleton", ["zero", "score"])
def test_reinforce_pp_baseline_equals_the_sdk(tmp_path, monkeypatch, singleton):
    table, a = rollout_like(5)
    out, _ = run_cli(tmp_path, monkeypatch, table, "--estimator", "reinforce_plus_plus_baseline",
                     "--singleton", singleton)
    want = reinforce_pp_baseline_advantages(a["reward"], a["ids"], a["mask"], singleton=singleton)
    assert_rows(out.column("advantages").to_pylist(), want, a)
    assert "returns" not in out.column_names


def test_reinforce_pp_warns_of_a_reward_no_token_carries(tmp_path, monkeypatch):
    table, a = rollout_like(6)
    reward = a["reward"].copy()
    reward[7] = 1.0          # row 7's mask is all 0
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array(reward))
    _, printed = run_cli(tmp_path, monkeypatch, table, "--estimator", "reinforce_plus_plus")
    assert "1 row(s) have a reward but no valid token to carry it" in printed and "row 7" in printed


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_groups_of_one_sample_are_counted_in_a_warning(tmp_path, monkeypatch, estimator):
    """A lone sample is its own baseline (singleton zero), so a file of prompts sampled once (pdsr rollout --n 1)
    got advantages 0 on every token without a word; the command counts such groups, except with singleton score."""
    table, a = rollout_like(1)
    sizes = np.unique(a["ids"], return_counts=True)[1]
    _, printed = run_cli(tmp_path, monkeypatch, table, "--estimator", estimator)
    lone = int((sizes == 1).sum())
    assert 0 < lone < len(sizes)
    assert f"warning: {lone} of {len(sizes)} groups (prompt_id) hold one sample" in printed
    assert "--singleton" in printed and "--n N" in printed
    _, printed = run_cli(tmp_path, monkeypatch, table, "--estimator", estimator, "--singleton", "score")
    assert "one sample" not in printed
    shared = np.isin(a["ids"], np.unique(a["ids"], return_counts=True)[0][sizes > 1])
    _, printed = run_cli(tmp_path, monkeypatch, table.filter(pa.array(shared)), "--estimator", estimator)
    assert "one sample" not in printed
    alone = table.set_column(0, "prompt_id", pa.array([f"s{i}" for i in range(table.num_rows)]))
    out, printed = run_cli(tmp_path, monkeypatch, alone, "--estimator", estimator)
    assert "warning: every group (prompt_id) holds one sample" in printed
    assert not any(x for row in out.column("advantages").to_pylist() for x in row)


@pytest.fixture()
def small(tmp_path):
    table, _ = rollout_like(7)
    path = tmp_path / "in.parquet"
    pq.write_table(table, path)
    return table, path, tmp_path / "out.parquet"


@pytest.mark.parametrize("flags, needles", [
    (("--estimator", "grpo", "--values-column", "values"), ["values_column (--values-column)", "'grpo'"]),
    (("--estimator", "rloo", "--lam", 0.9), ["lam (--lam)", "'rloo'"]),
    (("--estimator", "grpo", "--whiten"), ["whiten (--whiten)", "'grpo'"]),
    (("--estimator", "rloo", "--normalize-std", "batch"), ["normalize_std (--normalize-std)", "'rloo'"]),
    (("--singleton", "score"), ["singleton (--singleton)", "'gae'"]),
    (("--estimator", "grpo", "--group-column", "uid"), ["no column 'uid'", "--group-column", "prompt_id"]),
    (("--estimator", "rloo", "--tokens-column", "reward"), ["'reward' (--tokens-column)", "a list per row"]),
    ((), ["no column 'values' (--values-column", "--estimator grpo"]),
    (("--estimator", "grpo", "--rewards-column", "score"), ["no column 'score' (--rewards-column"]),
])
def test_bad_settings_name_the_flag(small, flags, needles):
    _, path, out = small
    output = failed(invoke("gae", "--data", path, "--out", out, *flags), *needles)
    assert len(output.strip().splitlines()) <= 2     # "invalid config:" and its one line, or one error line
    assert not out.exists()


def test_a_key_of_another_estimator_in_the_config_file_is_named(small):
    _, path, out = small
    cfg = path.parent / "gae.yaml"
    cfg.write_text("estimator: reinforce_plus_plus_baseline\nlam: 0.9\n")
    failed(invoke("gae", "--config", cfg, "--data", path, "--out", out), "gae.yaml", "lam (--lam)",
           "'reinforce_plus_plus_baseline'")


def test_a_null_reward_names_the_row_and_its_error(small):
    table, path, out = small
    reward = table.column("reward").to_pylist()
    reward[5] = reward[9] = None
    errors = [None] * len(reward)
    errors[5] = "Traceback (most recent call last):\n  ...\nZeroDivisionError: division by zero"
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array(reward, pa.float32()))
    pq.write_table(table.append_column("reward_error", pa.array(errors, pa.string())), path)
    failed(invoke("gae", "--data", path, "--out", out, "--estimator", "grpo"),
           "'reward' row 5 is null (2 null row(s)); its reward_error: ZeroDivisionError: division by zero")
    assert not out.exists()


def test_a_null_group_id_names_the_row(small):
    table, path, out = small
    ids = table.column("prompt_id").to_pylist()
    ids[3] = None
    pq.write_table(table.set_column(0, "prompt_id", pa.array(ids, pa.string())), path)
    failed(invoke("gae", "--data", path, "--out", out, "--estimator", "rloo"),
           "'prompt_id' (--group-column) row 3 is null")



@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_a_dictionary_encoded_group_column_groups_by_its_values(tmp_path, monkeypatch, estimator):
    """A group column of text ids written from a pandas category (or any dictionary-encoded Arrow column) reads back
    as dictionary<string>; it was refused ('must hold a number or text id per row, got dictionary<...>'). Its values
    are the ids: the advantages are those of the same column plain."""
    table, _ = rollout_like(5)
    plain, _ = run_cli(tmp_path, monkeypatch, table, "--estimator", estimator)
    encoded = table.set_column(0, "prompt_id", table.column("prompt_id").dictionary_encode())
    got, _ = run_cli(tmp_path, monkeypatch, encoded, "--estimator", estimator)
    assert pa.types.is_dictionary(got.schema.field("prompt_id").type)   # the input's column kept as it was
    assert got.column("advantages").to_pylist() == plain.column("advantages").to_pylist()

#: a reward that spreads within a group (the tiny random model never answers right): by the response's length
REWARD = "def score(text, ground_truth, **info):\n    return (len(text) % 5) / 4\n"


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_grpo_on_a_real_rollout(tiny_model_dir, tmp_path):
    """`pdsr rollout` on the tiny model (4 prompts, 3 samples each, 8 tokens), then `pdsr gae --estimator grpo` on
    its file as it is: each sample's group advantage on every token of its response."""
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i}+1?",
                                                                 "answer": str(i + 1)}) + "\n" for i in range(4)))
    (tmp_path / "length_reward.py").write_text(REWARD)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "pdsr_cli", "rollout", "--policy", "baseline", "--model",
                           str(tiny_model_dir), "--data", "prompts.jsonl", "--n", "3", "--batch-size", "2",
                           "--max-tokens", "8", "--reward", "length_reward.py:score", "--out", "rollout.parquet",
                           "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = invoke("gae", "--data", tmp_path / "rollout.parquet", "--out", tmp_path / "adv.parquet",
                    "--estimator", "grpo", "--quiet")
    assert result.exit_code == 0, result.output
    rows = pq.read_table(tmp_path / "adv.parquet").to_pylist()
    assert len(rows) == 12 and len({r["prompt_id"] for r in rows}) == 4
    reward = np.array([r["reward"] for r in rows], dtype=np.float32)
    assert np.ptp(reward) > 0
    want = grpo_advantages(reward, [r["prompt_id"] for r in rows])
    for r, w in zip(rows, want):
        assert r["response_mask"] is None and len(r["advantages"]) == len(r["response_token_ids"]) > 0
        np.testing.assert_allclose(r["advantages"], np.full(len(r["advantages"]), w), rtol=1e-6, atol=1e-7)
