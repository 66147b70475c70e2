"""Rollout pieces without engines: rewards, prompt loading, the resumable writer, segments."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pdsr_sdk.dispatch.segments import next_segment_len
from pdsr_sdk.errors import ConfigError, DataError
from pdsr_sdk.rollout.config import DataConfig
from pdsr_sdk.rollout.data import build_groups, load_prompts, load_tokenizer
from pdsr_sdk.rollout.answers import last_boxed
from pdsr_sdk.rollout.reward import math_boxed, resolve_reward
from pdsr_sdk.rollout.writer import TrajectoryWriter
from workloads import trajectory_rows


@pytest.mark.parametrize("text,expected", [
    ("so \\boxed{42}.", "42"),
    ("first \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\fbox{x+1}", "x+1"),
    ("no box here", None),
    ("unbalanced \\boxed{3", None),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize("response,truth,reward", [
    ("The answer is \\boxed{42}", "42", 1.0),
    ("\\boxed{ 0.50 }", "0.5", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}", 1.0),
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}", 1.0),
    ("\\boxed{1,000}", "1000", 1.0),
    ("\\boxed{41}", "42", 0.0),
    ("42", "42", 0.0),                       # no boxed answer, no reward
    ("\\boxed{18}", "Janet sells ... #### 18", 1.0),   # GSM8K answers
    # a GSM8K-style response (verl's gsm8k prompt asks for "#### N"): its last "####" line when it has no box
    ("9 eggs a day, 9 * 2 = 18.\n#### 18", "Janet sells ... #### 18", 1.0),
    ("#### 17\nno, wait\n#### 1,000.", "1000", 1.0),
    ("#### 17", "18", 0.0),
    ("\\boxed{17} and #### 18", "18", 0.0),   # a boxed answer comes first
    ("#### \nnothing after it", "18", 0.0),
])
def test_math_boxed(response, truth, reward):
    assert math_boxed(response, truth) == reward


def test_reward_resolution():
    assert resolve_reward("auto", has_ground_truth=True) is resolve_reward("math_verify", True)   # the default
    assert resolve_reward("math_boxed", True) is math_boxed   # the fallback
    assert resolve_reward("auto", has_ground_truth=False) is None
    assert resolve_reward("none", True) is None
    assert resolve_reward("pdsr_sdk.rollout.reward:math_boxed", True) is math_boxed   # an import path
    with pytest.raises(ConfigError, match="normalize_answer.*cannot be called"):   # one argument: not a reward
        resolve_reward("pdsr_sdk.rollout.answers:normalize_answer", True)


def test_segment_length_formula():
    assert next_segment_len(8192, 128, 64, 4096) == 64
    assert next_segment_len(8192, 1, 64, 4096) == 4096
    assert next_segment_len(8192, 16, 64, 4096) == 512
    assert next_segment_len(8192, 1000, 64, 4096) == 64


def test_load_prompts_variants(tmp_path, tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    path = tmp_path / "p.jsonl"
    rows = [{"unique_id": "a", "problem": "What is 1+1?", "answer": "2"},
            {"unique_id": "b", "problem": "What is 2+2?", "answer": "4"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = load_prompts(DataConfig(), tok, path=path)
    assert [r.prompt_id for r in recs] == ["a", "b"] and [r.ground_truth for r in recs] == ["2", "4"]
    assert recs[0].text.startswith("<|im_start|>user\nWhat is 1+1?") and recs[0].text.endswith("assistant\n")
    assert recs[0].token_ids == tok(recs[0].text, add_special_tokens=False)["input_ids"]
    plain = load_prompts(DataConfig(apply_chat_template=False, system_prompt="Be brief."), tok, path=path)
    assert plain[0].text == "Be brief.\n\nWhat is 1+1?"

    msgs = tmp_path / "m.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": [{"role": "system", "content": "S"},
                                                       {"role": "user", "content": "Hi"}]}]), msgs)
    m = load_prompts(DataConfig(messages_column="messages"), tok, path=msgs)
    assert m[0].prompt_id == "row-0" and "<|im_start|>system\nS" in m[0].text

    # a CSV: every cell read as written (no number parsing), an empty one missing
    csv = tmp_path / "p.csv"
    csv.write_text('id,problem,answer\n007,"What is 1+1, exactly?",0.50\n8,What is 2+2?,\n')
    c = load_prompts(DataConfig(), tok, path=csv)
    assert [(r.prompt_id, r.ground_truth) for r in c] == [("007", "0.50"), ("8", None)]
    assert c[0].text.startswith("<|im_start|>user\nWhat is 1+1, exactly?")
    # a quoted prompt over several lines, past the reader's first block (about 1 MB): still one row
    import csv as csv_module

    from pdsr_sdk.io.tables import read_table

    big = tmp_path / "big.csv"
    with big.open("w", newline="") as fh:
        writer = csv_module.writer(fh)
        writer.writerow(["problem", "answer"])
        writer.writerows([f"Problem {i}\nits second line, with a comma", str(i)] for i in range(60_000))
    table = read_table(big)
    assert table.num_rows == 60_000 and table.column("problem")[45_000].as_py() == (
        "Problem 45000\nits second line, with a comma")
    array = tmp_path / "p.json"   # a .json file of one array of objects, as a dataset's to_json(lines=False) writes
    array.write_text(json.dumps(rows, indent=1))
    assert ([(r.prompt_id, r.ground_truth) for r in load_prompts(DataConfig(), tok, path=array)]
            == [("a", "2"), ("b", "4")])
    array.write_text(json.dumps([rows[0], "not an object"]))
    with pytest.raises(DataError, match="p.json: item 1 of the array: expected a JSON object, got str"):
        load_prompts(DataConfig(), tok, path=array)
    stream = tmp_path / "data-00000-of-00001.arrow"   # an Arrow IPC stream, as datasets' save_to_disk writes
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(stream), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    assert [r.prompt_id for r in load_prompts(DataConfig(), tok, path=stream)] == ["a", "b"]
    # a folder of shards (a hub dataset's parquet files, or save_to_disk's .arrow files beside its metadata)
    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:1]), shards / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(rows[1:]), shards / "train-00001-of-00002.parquet")
    (shards / "README.md").write_text("a dataset card")
    assert [r.prompt_id for r in load_prompts(DataConfig(), tok, path=shards)] == ["a", "b"]
    saved = tmp_path / "saved"
    saved.mkdir()
    stream.rename(saved / stream.name)
    for name in ("dataset_info.json", "state.json"):
        (saved / name).write_text("{}")
    assert [r.prompt_id for r in load_prompts(DataConfig(), tok, path=saved)] == ["a", "b"]
    (shards / "more.jsonl").write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(DataError, match=r"shards: the folder must hold prompt files of one format .*found 1 jsonl "
                                        r"\(more\.jsonl, \.\.\.\); 2 parquet \(train-00000-of-00002\.parquet, "
                                        r"\.\.\.\)"):
        load_prompts(DataConfig(), tok, path=shards)
    tsv = tmp_path / "p.tsv"
    tsv.write_text("prompt\tlabel\nWhat is 3+3?\t6\n")
    assert [(r.text.split("\n")[1], r.ground_truth) for r in load_prompts(DataConfig(), tok, path=tsv)] == [
        ("What is 3+3?<|im_end|>", "6")]


def test_jsonl_answers_that_mix_numbers_and_strings_are_read_as_strings(tmp_path, tiny_model_dir):
    """Hand-made math data writes a number as a number and a fraction as a string in one column; Arrow wants one
    type per column. Such a column is read as strings (as CSV cells are); any other mix is an error naming the
    line and the column."""
    tok = load_tokenizer(tiny_model_dir)
    path = tmp_path / "p.jsonl"
    rows = [{"question": "What is 9 * 2?", "label": 18}, {"question": "Half of 1?", "label": "\\frac{1}{2}"},
            {"question": "What is 1/4?", "label": 0.25}, {"question": "No label"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = load_prompts(DataConfig(), tok, path=path)
    assert [r.ground_truth for r in recs] == ["18", "\\frac{1}{2}", "0.25", None]
    array = tmp_path / "p.json"
    array.write_text(json.dumps(rows))
    assert [r.ground_truth for r in load_prompts(DataConfig(), tok, path=array)] == ["18", "\\frac{1}{2}", "0.25", None]

    path.write_text(json.dumps({"question": "a", "label": "2"}) + "\n\n" + json.dumps({"question": "b", "label": ["2"]})
                    + "\n")
    with pytest.raises(DataError, match=r"p\.jsonl:3: column 'label' is a list here but a string at .*p\.jsonl:1"):
        load_prompts(DataConfig(), tok, path=path)
    path.write_text(json.dumps({"question": "a", "extra_info": {"index": 1}}) + "\n"
                    + json.dumps({"question": "b", "extra_info": {"index": "x"}}) + "\n")
    with pytest.raises(DataError, match=r"p\.jsonl:2: column 'extra_info' is an object here whose fields do not "
                                        r"match those at .*p\.jsonl:1"):
        load_prompts(DataConfig(), tok, path=path)
    array.write_text(json.dumps([{"question": "a", "label": True}, {"question": "b", "label": "yes"}]))
    with pytest.raises(DataError, match=r"p\.json: item 1 of the array: column 'label' is a string here but a "
                                        r"boolean at .*p\.json: item 0 of the array"):
        load_prompts(DataConfig(), tok, path=array)


def test_load_prompts_errors_name_file_and_row(tmp_path, tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n" + json.dumps({"id": "a", "prompt": "y"}) + "\n")
    with pytest.raises(DataError, match="p.jsonl: row 1: duplicate prompt id 'a' \\(also row 0\\)"):
        load_prompts(DataConfig(), tok, path=path)
    path.write_text(json.dumps({"id": "a", "prompt": ""}) + "\n")
    with pytest.raises(DataError, match="row 0: column 'prompt' must be a non-empty string"):
        load_prompts(DataConfig(), tok, path=path)
    path.write_text(json.dumps({"prompt": "x", "lengths": [3, 0]}) + "\n")
    with pytest.raises(DataError, match="lengths.*positive integers"):
        load_prompts(DataConfig(target_lengths_column="lengths"), tok, path=path, n=2)
    path.write_text("{not json\n")
    with pytest.raises(DataError, match="p.jsonl:1: not valid JSON"):
        load_prompts(DataConfig(), tok, path=path)
    other = tmp_path / "p.txt"   # a name of no known format is read as Parquet, and the error says so
    other.write_text("What is 1+1?\n")
    with pytest.raises(DataError, match=r"p\.txt: cannot read prompt file as parquet \(a \.txt name is read as "
                                        r"Parquet; pdsr reads \.parquet, .*\.csv, \.tsv\)"):
        load_prompts(DataConfig(), tok, path=other)


def test_build_groups_forces_lengths():
    from pdsr_sdk.rollout.data import PromptRecord

    g = build_groups([PromptRecord("a", "a", [1], target_lengths=[5, 7])], 2, 100)[0]
    assert [s.max_tokens for s in g.samples] == [5, 7] and all(s.forced for s in g.samples)
    g = build_groups([PromptRecord("b", "b", [1])], 3, 100)[0]
    assert [s.max_tokens for s in g.samples] == [100] * 3 and not any(s.forced for s in g.samples)


def test_writer_streams_parts_resumes_and_finalizes(tmp_path):
    from pdsr_sdk.dispatch.trajectory import trajectory_schema

    out = tmp_path / "t.parquet"
    w = TrajectoryWriter(out, trajectory_schema(), flush_groups=1)
    w.add_group(trajectory_rows("a"))
    w.add_group(trajectory_rows("b"))
    parts = sorted((tmp_path / "t.parquet.parts").glob("part-*.parquet"))
    assert len(parts) == 2 and not out.exists()       # "crash" here: both groups are on disk
    with pytest.raises(DataError, match="--resume"):
        TrajectoryWriter(out, trajectory_schema())
    w2 = TrajectoryWriter(out, trajectory_schema(), resume=True, flush_groups=1,
                          metadata={"policy": "v2.5"})
    assert w2.finished_prompt_ids() == {"a", "b"}
    w2.add_group(trajectory_rows("c"))
    w2.finalize()
    t = pq.read_table(out)
    assert sorted(set(t.column("prompt_id").to_pylist())) == ["a", "b", "c"] and t.num_rows == 6
    assert t.schema.metadata[b"policy"] == b"v2.5"
    assert not (tmp_path / "t.parquet.parts").exists()
    w3 = TrajectoryWriter(out, trajectory_schema(), resume=True)
    assert w3.finished_prompt_ids() == {"a", "b", "c"}
    w4 = TrajectoryWriter(out, trajectory_schema(), overwrite=True)
    assert out.exists() and w4.finished_prompt_ids() == set()   # the old output goes with the first new group
    w4.add_group(trajectory_rows("d"))
    w4.flush()
    assert not out.exists()
    assert w4.finalize() == out and set(pq.read_table(out).column("prompt_id").to_pylist()) == {"d"}


def test_session_starts_engines_at_once_and_closes_all_when_one_fails(tmp_path):
    import asyncio

    from fakes import StartupEngine

    from pdsr_sdk.config import load_config
    from pdsr_sdk.errors import EngineError
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    def session(fail: bool) -> RolloutSession:
        engines = [{"name": "f0", "pool": "fast", "backend": "fakes:StartupEngine"},
                   {"name": "h0", "pool": "heavy", "backend": "fakes:StartupEngine", "engine_args": {"fail": fail}}]
        cfg = load_config(RolloutConfig, None, {"engines": engines, "model": str(tmp_path)})
        return RolloutSession(cfg)

    StartupEngine.LOG.clear()
    asyncio.run(session(fail=False).start())
    assert StartupEngine.LOG[:2] == [("begin", "f0"), ("begin", "h0")]   # both start before either is ready
    StartupEngine.LOG.clear()
    with pytest.raises(EngineError, match="h0.*failed to start"):
        asyncio.run(session(fail=True).start())
    assert sorted(e for e in StartupEngine.LOG if e[0] == "close") == [("close", "f0"), ("close", "h0")]


@pytest.mark.parametrize("cpu,devices,pools,layout", [
    (False, 8, ("fast", "heavy"), ["fast"] * 6 + ["heavy"] * 2),   # a quarter heavy where the policy needs it
    (False, 3, ("fast", "heavy"), ["fast"] * 2 + ["heavy"]),        # at least one
    (False, 8, (), ["fast"] * 8),                                   # v3, baseline, lpt: every GPU's engine fast
    (True, 2, ("fast", "heavy"), ["fast", "heavy"]),                # the CPU build: the cores split in two
    (True, 2, (), ["fast"]),                                        # one engine on all cores
])
def test_automatic_layout_is_what_docs_rollout_md_says(monkeypatch, cpu, devices, pools, layout):
    """docs/engines.md ("Engines") and docs/ray.md: heavy engines only for a policy that needs a heavy pool."""
    from pdsr_sdk.rollout import layout as layout_module
    from pdsr_sdk.rollout.config import RolloutConfig

    monkeypatch.setattr(layout_module, "available_devices", lambda cpu: list(range(devices)))
    specs = layout_module.engine_layout(RolloutConfig(), required_pools=pools, cpu=cpu, max_model_len=512)
    assert [s.pool for s in specs] == layout
    if cpu:   # the cores are split between the engines, none shared
        assert sorted(d for s in specs for d in s.devices) == list(range(devices))


@pytest.mark.parametrize("gpus,tp,fast,expected", [
    (8, 2, None, [[0, 1], [2, 3], [4, 5], [6, 7]]),   # one engine per tensor-parallel group
    (8, 4, None, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (7, 2, None, [[0, 1], [2, 3], [4, 5]]),           # a GPU left over is not half an engine
    (8, 2, 2, [[0, 1], [2, 3]]),
])
def test_automatic_layout_gives_each_engine_its_tensor_parallel_gpus(monkeypatch, gpus, tp, fast, expected):
    """With engine_defaults.tensor_parallel_size, each automatic engine gets that many GPUs of its own (it got one)."""
    from pdsr_sdk.rollout import layout as layout_module
    from pdsr_sdk.rollout.config import RolloutConfig

    monkeypatch.setattr(layout_module, "available_devices", lambda cpu: list(range(gpus)))
    config = RolloutConfig(engine_defaults={"tensor_parallel_size": tp}, fast=fast)
    specs = layout_module.engine_layout(config, required_pools=(), cpu=False, max_model_len=512)
    assert [s.devices for s in specs] == expected
    assert {s.tensor_parallel_size for s in specs} == {tp}


@pytest.mark.parametrize("gpus,tp,fast,message", [
    (2, 4, None, "engine_defaults.tensor_parallel_size is 4 but only 2 GPU(s) are visible"),
    (8, 2, 5, "fast + heavy = 5 but 4 engine(s) of 2 GPUs fit the 8 visible GPUs"),
    (4, 1, 5, "fast + heavy = 5 but only 4 GPU(s) are visible"),
])
def test_automatic_layout_that_does_not_fit_the_gpus_says_so(monkeypatch, gpus, tp, fast, message):
    from pdsr_sdk.errors import ConfigError
    from pdsr_sdk.rollout import layout as layout_module
    from pdsr_sdk.rollout.config import RolloutConfig

    monkeypatch.setattr(layout_module, "available_devices", lambda cpu: list(range(gpus)))
    config = RolloutConfig(engine_defaults={"tensor_parallel_size": tp}, fast=fast)
    with pytest.raises(ConfigError, match=re.escape(message)):
        layout_module.engine_layout(config, required_pools=(), cpu=False, max_model_len=512)


def test_an_explicit_engine_with_fewer_gpus_than_its_tensor_parallel_size_is_named():
    from pdsr_sdk.errors import ConfigError
    from pdsr_sdk.rollout import layout as layout_module
    from pdsr_sdk.rollout.config import RolloutConfig

    config = RolloutConfig(engines=[{"name": "a", "pool": "fast", "devices": [0, 1], "tensor_parallel_size": 2},
                                    {"name": "b", "pool": "fast", "devices": [2], "tensor_parallel_size": 2}])
    with pytest.raises(ConfigError, match=re.escape("engines[1] ('b'): devices [2] are 1 GPU(s) but "
                                                    "tensor_parallel_size is 2")):
        layout_module.engine_layout(config, required_pools=(), cpu=False, max_model_len=512)
    assert len(layout_module.engine_layout(config.model_copy(update={"engines": config.engines[:1]}),
                                           required_pools=(), cpu=False, max_model_len=512)) == 1
    # on the CPU build devices are cores, any number of them
    assert len(layout_module.engine_layout(config, required_pools=(), cpu=True, max_model_len=512)) == 2
