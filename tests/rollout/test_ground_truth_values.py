"""A ground truth that is no plain value (Search-R1's ``{"target": [...]}`` struct, a list of acceptable answers)
reaches a custom reward, pdsr's or verl's, and an agent as pyarrow reads it from the file (``.as_py()``: a dict, a
list), is kept in the trajectories as its JSON text, survives a resume, and is refused, naming its file, row and
column, before any engine starts when the reward is a built-in that compares text."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_checks import failed, invoke
from support import requires_torch

HERE = "test_ground_truth_values"   # this module as an import path (pytest puts tests/rollout on sys.path)
#: prompt id -> the ground truth a reward (or agent) of this module was given, as it was given
RECEIVED: dict = {}


def record(response_text, ground_truth, prompt_id, **info):
    """pdsr's signature: keeps what it got; the score is the number of acceptable answers."""
    RECEIVED[prompt_id] = ground_truth
    return _score(ground_truth)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's signature: the prompt's id comes through extra_info, as in a verl file."""
    RECEIVED[extra_info["id"]] = ground_truth
    return _score(ground_truth)


def _score(truth):
    target = truth["target"] if isinstance(truth, dict) else truth
    return float(len(target)) if isinstance(target, list) else 0.0


SEARCH_R1 = [["Paris", "paris, france"], ["Lyon"], ["Nice", "nice", "Nizza"]]


def search_r1_file(tmp_path, n=3):
    """verl's layout as Search-R1 writes it: reward_model.ground_truth is a struct {target: list<string>}."""
    rows = [{"id": f"q{i}", "data_source": "nq", "prompt": [{"role": "user", "content": f"Where is place {i}?"}],
             "reward_model": {"style": "rule", "ground_truth": {"target": SEARCH_R1[i % 3]}},
             "extra_info": {"id": f"q{i}", "split": "train"}} for i in range(n)]
    path = tmp_path / "search_r1.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def list_file(tmp_path):
    """A list of acceptable answers per row, the first row without one (null)."""
    path = tmp_path / "answers.parquet"
    pq.write_table(pa.table({"id": ["a0", "a1", "a2"], "prompt": ["One?", "Two?", "Three?"],
                             "answer": pa.array([None, ["2", "two"], ["3"]], pa.list_(pa.string()))}), path)
    return path


def file_truths(path, column):
    """The independent reference: each row's ground truth as pyarrow reads it from the file."""
    table = pq.read_table(path)
    ids = table.column("id").to_pylist()
    head, *rest = column.split(".")
    values = []
    for i in range(table.num_rows):
        value = table.column(head)[i]
        for part in rest:
            value = value[part]
        values.append(value.as_py())
    return dict(zip(ids, values))


@pytest.fixture()
def fake_run(tmp_path, tiny_model_dir):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({
        "model": str(tiny_model_dir), "policy": "baseline", "sampling": {"n": 2, "max_tokens": 8},
        "engines": [{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine", "max_model_len": 256}]}))
    RECEIVED.clear()
    return ["rollout", "--quiet", "--config", cfg]


@pytest.fixture()
def no_engines(monkeypatch):
    from pdsr_sdk.rollout.session import RolloutSession

    async def refuse(self, **_):
        raise AssertionError("engines started before the input was checked")

    monkeypatch.setattr(RolloutSession, "start", refuse)


def plain(value):
    """Whether ``value`` is made of plain Python containers only (no numpy array, no pyarrow scalar)."""
    if isinstance(value, dict):
        return type(value) is dict and all(plain(v) for v in value.values())
    if isinstance(value, list):
        return type(value) is list and all(plain(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


@pytest.mark.parametrize("reward", ["record", "compute_score"])
def test_a_struct_ground_truth_reaches_the_reward_as_pyarrow_reads_it(tmp_path, fake_run, reward):
    data, out = search_r1_file(tmp_path), tmp_path / "o.parquet"
    r = invoke(*fake_run, "--data", data, "--out", out, "--reward", f"{HERE}:{reward}")
    assert r.exit_code == 0, r.output
    want = file_truths(data, "reward_model.ground_truth")
    assert RECEIVED == want and all(type(v) is dict and plain(v) for v in RECEIVED.values())
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 6 and pq.read_table(out).schema.field("ground_truth").type == pa.string()
    for row in rows:
        assert json.loads(row["ground_truth"]) == want[row["prompt_id"]]
        assert row["reward"] == len(want[row["prompt_id"]]["target"]) and row["reward_error"] is None


def test_a_list_ground_truth_and_a_missing_one(tmp_path, fake_run):
    data, out = list_file(tmp_path), tmp_path / "o.parquet"
    r = invoke(*fake_run, "--data", data, "--out", out, "--reward", f"{HERE}:record")
    assert r.exit_code == 0, r.output
    want = file_truths(data, "answer")
    assert RECEIVED == want and want["a0"] is None and type(RECEIVED["a1"]) is list
    got = {row["prompt_id"]: row["ground_truth"] for row in pq.read_table(out).to_pylist()}
    assert got == {"a0": None, "a1": json.dumps(["2", "two"]), "a2": json.dumps(["3"])}


def test_a_resumed_run_reads_them_again(tmp_path, fake_run):
    data, out = search_r1_file(tmp_path, n=4), tmp_path / "o.parquet"
    run = [*fake_run, "--data", data, "--out", out, "--reward", f"{HERE}:record", "--batch-size", 2]
    assert invoke(*run, "--num-batches", 1).exit_code == 0
    assert sorted(RECEIVED) == ["q0", "q1"]
    RECEIVED.clear()
    r = invoke(*run, "--resume")
    assert r.exit_code == 0, r.output
    want = file_truths(data, "reward_model.ground_truth")
    assert RECEIVED == {k: want[k] for k in ("q2", "q3")}
    rows = pq.read_table(out).to_pylist()
    assert sorted({row["prompt_id"] for row in rows}) == ["q0", "q1", "q2", "q3"]
    assert all(json.loads(row["ground_truth"]) == want[row["prompt_id"]] for row in rows)


@pytest.mark.parametrize("reward", [None, "math_verify", "math_boxed"])
def test_a_text_reward_refuses_them_before_engines_start(tmp_path, fake_run, no_engines, reward):
    out = tmp_path / "o.parquet"
    flags = ["--reward", reward] if reward else []   # none: auto, math_verify for data with a ground truth
    msg = failed(invoke(*fake_run, "--data", search_r1_file(tmp_path), "--out", out, *flags),
                 "search_r1.parquet: row 0: column 'reward_model.ground_truth' (data.ground_truth_column, "
                 "--ground-truth-column) is struct<target: list<element: string>>, {'target': ['Paris', ",
                 f"the {reward or 'math_verify'} reward compares the answer as text", "--reward pkg.mod:fn")
    assert "dotted path" not in msg   # no text field to name instead
    failed(invoke(*fake_run, "--data", list_file(tmp_path), "--out", out, *flags),
           "answers.parquet: row 1: column 'answer'", "is list<element: string>, ['2', 'two']")
    # the whole reward_model column: its ground_truth field is no text either, and style is no answer
    msg = failed(invoke(*fake_run, "--data", search_r1_file(tmp_path), "--out", out, "--ground-truth-column",
                        "reward_model", *flags), "row 0: column 'reward_model'", "is struct<style: string, ")
    assert "dotted path" not in msg
    assert not out.exists()


def sdk_config(tiny_model_dir, **kw):
    from pdsr_sdk import RolloutConfig

    return RolloutConfig(model=str(tiny_model_dir), batch_size=3, sampling={"n": 2, "max_tokens": 8},
                         engines=[{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine"}], **kw)


PYTHON_PROMPTS = [{"id": "d", "prompt": "Where?", "ground_truth": {"target": ["Paris", "paris"]}},
                  {"id": "l", "prompt": "Which?", "answer": ["b", "c", "d"]},
                  {"id": "n", "prompt": "How many?", "ground_truth": 7}]


@requires_torch
def test_the_sdk_takes_the_same_values(tmp_path, tiny_model_dir):
    """From Python: a prompt mapping's dict or list ground truth as it is (a number as text, as from a file), a
    PromptRecord's as it is; session.load_prompts with a reward function keeps a file's struct; an agent sees
    what the reward sees."""
    from pdsr_sdk import PromptRecord, RolloutSession
    from pdsr_sdk.rollout.reward import adapt_reward

    RECEIVED.clear()
    seen = {}

    async def agent(ctx):
        seen[ctx.prompt_id] = ctx.ground_truth
        await ctx.generate()
        return None   # the reward function scores it

    with RolloutSession(sdk_config(tiny_model_dir), reward=record) as session:
        out = session.step(PYTHON_PROMPTS)
        assert RECEIVED == {"d": {"target": ["Paris", "paris"]}, "l": ["b", "c", "d"], "n": "7"}
        assert dict(zip(out.table.column("prompt_id").to_pylist(), out.table.column("ground_truth").to_pylist())) \
            == {"d": json.dumps({"target": ["Paris", "paris"]}), "l": json.dumps(["b", "c", "d"]), "n": "7"}
        assert out.table.column("reward").to_pylist() == [2.0, 2.0, 3.0, 3.0, 0.0, 0.0]
        RECEIVED.clear()
        records = session.load_prompts(search_r1_file(tmp_path))
        want = file_truths(tmp_path / "search_r1.parquet", "reward_model.ground_truth")
        assert {r.prompt_id: r.ground_truth for r in records} == want
        session.step([PromptRecord("rec", "Where?", [5, 6, 7], ground_truth=("x", "y"))], agent=agent)
        session.step(records, agent=agent)
        assert RECEIVED == seen == {"rec": ("x", "y"), **want}
    assert adapt_reward(record, "record") is record


@requires_torch
def test_the_sdks_text_rewards_refuse_them(tmp_path, tiny_model_dir):
    """A built-in text reward: session.load_prompts refuses a struct column as pdsr rollout does, and a Python
    prompt's dict stops the step with an error naming the prompt (no silent score of 0)."""
    from pdsr_sdk import RolloutSession
    from pdsr_sdk.errors import DataError

    with RolloutSession(sdk_config(tiny_model_dir, reward="math_verify")) as session:
        with pytest.raises(DataError, match=r"search_r1.parquet: row 0: column 'reward_model.ground_truth'"):
            session.load_prompts(search_r1_file(tmp_path))
        with pytest.raises(DataError, match=r"prompt 'd': the math_verify reward compares the answer as text and "
                                            r"needs a string or number ground truth; this one is a dict"):
            session.step(PYTHON_PROMPTS)


def test_the_column_text_of_values_a_trainer_passes():
    """The trajectories' ground_truth of values from Python: numpy's arrays and scalars as their lists and numbers
    (numpy's own tolist is the reference), a tuple as a list, text and numbers as before."""
    import numpy as np

    from pdsr_sdk.dispatch.trajectory import truth_text

    array = np.arange(6).reshape(2, 3)
    assert json.loads(truth_text({"cases": array, "n": np.int64(4)})) == {"cases": array.tolist(), "n": 4}
    assert json.loads(truth_text(("a", 1.5))) == ["a", 1.5]
    assert [truth_text(v) for v in ("18", 18, 0.5, None)] == ["18", "18", "0.5", None]
