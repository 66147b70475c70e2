"""verl's reward functions as they are (issue 49): compute_score(data_source, solution_str, ground_truth,
extra_info=None), its batched form, a dict with a 'score', the row's data_source and extra_info, a reward
that fails on one sample, and a reward pdsr cannot call refused before any engine starts."""

from __future__ import annotations

import asyncio
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pdsr_sdk.dispatch.trajectory import sample_row, trajectory_schema
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import DataConfig, RolloutConfig
from pdsr_sdk.rollout.data import PromptRecord, build_groups, load_prompts, load_tokenizer, prompt_records
from pdsr_sdk.rollout.reward import VerlReward, adapt_reward, math_boxed, resolve_reward

HERE = "test_reward_verl"   # this module, as an import path's module (pytest puts tests/rollout on sys.path)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """A verl reward function: a dict with the score and fields of its own."""
    score = math_boxed(solution_str, ground_truth)
    return {"score": score, "acc": score == 1.0, "source": data_source,
            "split": (extra_info or {}).get("split")}


def compute_score_float(data_source, solution_str, ground_truth):
    """verl's form without extra_info, returning a float."""
    if "boom" in solution_str:
        raise ValueError("cannot score this one")
    return 0.5 if data_source == "openai/gsm8k" else 0.25


def compute_score_batched(data_sources, solution_strs, ground_truths, extra_infos=None):
    return [float(len(s)) for s in solution_strs]


def one_argument(text):
    return 1.0


def needs_more(text, ground_truth, rubric):
    return 1.0


class FakeTokenizer:
    """Decodes a sample's single token id to a response of the test's choosing."""

    def __init__(self, texts: dict[int, str]):
        self.texts = texts

    def decode(self, ids, skip_special_tokens=True):
        return self.texts[ids[0]]


def finished_group(record: PromptRecord, responses: list[str]) -> tuple:
    group = build_groups([record], len(responses), 16)[0]
    for k, s in enumerate(group.samples):
        s.token_ids, s.num_generated, s.finish_reason = [k], 1, "stop"
    return group, FakeTokenizer(dict(enumerate(responses)))


def test_verl_signature_detected_by_its_first_parameter():
    fn = resolve_reward(f"{HERE}:compute_score", True)
    assert isinstance(fn, VerlReward) and not fn.batched and fn.pass_extra_info
    assert resolve_reward(f"{HERE}:compute_score_batched", True).batched
    assert not resolve_reward(f"{HERE}:compute_score_float", True).pass_extra_info
    assert resolve_reward("pdsr_sdk.rollout.reward:math_boxed", True) is math_boxed   # pdsr's own, as it is


@pytest.mark.parametrize("fn", ["one_argument", "needs_more"])
def test_a_reward_pdsr_cannot_call_is_an_error_naming_it_and_the_signatures(fn):
    with pytest.raises(ConfigError) as err:
        resolve_reward(f"{HERE}:{fn}", True)
    message = str(err.value)
    assert fn in message and "fn(response_text, ground_truth, **info)" in message
    assert "compute_score(data_source, solution_str, ground_truth, extra_info=None)" in message


def test_refused_when_the_session_is_made_before_any_engine():
    class NeverStarted:   # an engine the session must not reach
        def __getattr__(self, name):
            raise AssertionError("an engine was used")

    from pdsr_sdk.rollout.session import RolloutSession

    with pytest.raises(ConfigError, match="one_argument"):
        RolloutSession(RolloutConfig(reward=f"{HERE}:one_argument"), engines=[NeverStarted()])


def test_dict_score_its_fields_and_the_rows_data_source_and_extra_info():
    record = PromptRecord("q1", "prompt", [1, 2], "18",
                          reward_info={"data_source": "openai/gsm8k", "extra_info": {"split": "test", "index": 3}})
    group, tok = finished_group(record, ["so \\boxed{18}", "so \\boxed{17}"])
    fn = resolve_reward(f"{HERE}:compute_score", True)
    rows = [sample_row(s, tok, fn) for s in group.samples]
    assert [r["reward"] for r in rows] == [1.0, 0.0] and all(r["reward_error"] is None for r in rows)
    assert json.loads(rows[0]["reward_extra"]) == {"acc": True, "source": "openai/gsm8k", "split": "test"}
    assert json.loads(rows[1]["reward_extra"])["acc"] is False
    table = pa.Table.from_pylist(rows, schema=trajectory_schema())   # the trajectories schema has them
    assert table.column("reward_extra").null_count == 0


def test_a_reward_that_raises_fails_only_its_sample():
    record = PromptRecord("q1", "prompt", [1], "1", reward_info={"data_source": "openai/gsm8k"})
    group, tok = finished_group(record, ["fine", "boom", "fine too"])
    fn = resolve_reward(f"{HERE}:compute_score_float", True)
    rows = [sample_row(s, tok, fn) for s in group.samples]
    assert [r["reward"] for r in rows] == [0.5, None, 0.5]
    assert rows[1]["reward_error"] == "ValueError: cannot score this one" and rows[0]["reward_error"] is None


def test_batched_verl_reward():
    group, tok = finished_group(PromptRecord("q1", "prompt", [1], "1"), ["abc", "abcdef"])
    fn = resolve_reward(f"{HERE}:compute_score_batched", True)
    assert [sample_row(s, tok, fn)["reward"] for s in group.samples] == [3.0, 6.0]


def test_pdsr_rewards_get_the_rows_columns_too():
    seen = {}

    def reward(text, ground_truth, **info):
        seen.update(info)
        return 1.0

    record = PromptRecord("q1", "prompt", [1], "1", reward_info={"data_source": "math"})
    group, tok = finished_group(record, ["x"])
    assert sample_row(group.samples[0], tok, adapt_reward(reward, "r"))["reward"] == 1.0
    assert seen["data_source"] == "math" and seen["prompt_id"] == "q1"


def test_verl_layout_parquet_keeps_data_source_and_extra_info(tmp_path, tiny_model_dir):
    path = tmp_path / "verl.parquet"
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 9+9?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": "18"},
             "extra_info": {"split": "test", "index": i}} for i in range(2)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    records = load_prompts(DataConfig(), load_tokenizer(tiny_model_dir), path=path)
    assert [r.ground_truth for r in records] == ["18", "18"]
    assert records[1].reward_info == {"data_source": "openai/gsm8k", "extra_info": {"split": "test", "index": 1}}
    group, tok = finished_group(records[1], ["\\boxed{18}"])
    row = sample_row(group.samples[0], tok, resolve_reward(f"{HERE}:compute_score", True))
    assert row["reward"] == 1.0 and json.loads(row["reward_extra"])["split"] == "test"


def test_data_source_names_the_rows_without_one(tmp_path, tiny_model_dir):
    """Raw MATH-500 / GSM8K files have no data_source, which verl's default_compute_score dispatches on:
    data.data_source (--data-source) fills it in, where the row has none or null, and nowhere else."""
    path = tmp_path / "mixed.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "What is 9+9?", "answer": "18", "data_source": None},
                                         {"prompt": "What is 1+1?", "answer": "2", "data_source": "mine"}]), path)
    tok = load_tokenizer(tiny_model_dir)
    got = load_prompts(DataConfig(data_source="openai/gsm8k"), tok, path=path)
    assert [r.reward_info for r in got] == [{"data_source": "openai/gsm8k"}, {"data_source": "mine"}]
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps({"prompt": "What is 9+9?", "answer": "18"}) + "\n")
    assert load_prompts(DataConfig(), tok, path=raw)[0].reward_info is None
    record = load_prompts(DataConfig(data_source="openai/gsm8k"), tok, path=raw)[0]
    assert record.reward_info == {"data_source": "openai/gsm8k"}
    group, tok2 = finished_group(record, ["\\boxed{18}"])
    row = sample_row(group.samples[0], tok2, resolve_reward(f"{HERE}:compute_score", True))
    assert row["reward"] == 1.0 and json.loads(row["reward_extra"])["source"] == "openai/gsm8k"
    recs = prompt_records([{"prompt": "hi"}, {"prompt": "hi", "data_source": "d"}],
                          DataConfig(data_source="x"), tok)
    assert [r.reward_info for r in recs] == [{"data_source": "x"}, {"data_source": "d"}]


def test_sdk_prompts_carry_data_source_and_extra_info(tiny_model_dir):
    recs = prompt_records([{"prompt": "hi", "answer": "1", "data_source": "d", "extra_info": {"k": 1}}, "plain"],
                          DataConfig(), load_tokenizer(tiny_model_dir))
    assert recs[0].reward_info == {"data_source": "d", "extra_info": {"k": 1}} and recs[1].reward_info is None


def test_dapo_overlong_shaping():
    from pdsr_sdk.rollout.reward import OverlongShaping, config_reward

    shaped = OverlongShaping(lambda text, truth, **info: 1.0, max_tokens=100, buffer=20, penalty=1.0)
    assert [shaped("t", "1", response_length=n) for n in (50, 90, 100)] == [
        {"score": 1.0, "overlong_reward": 0.0, "overlong": False}, {"score": 0.5, "overlong_reward": -0.5,
                                                                    "overlong": True},
        # the amount logged for a float reward too, as verl's DAPO does
        {"score": 0.0, "overlong_reward": -1.0, "overlong": True}]
    verl = OverlongShaping(resolve_reward(f"{HERE}:compute_score", True), max_tokens=100, buffer=20, penalty=0.5)
    got = verl("\\boxed{1}", "1", response_length=100)
    assert got["score"] == 0.5 and got["overlong_reward"] == -0.5 and got["acc"] is True

    cfg = RolloutConfig(reward=f"{HERE}:compute_score_float", overlong_buffer=4, sampling={"max_tokens": 16})
    fn = config_reward(cfg, True)
    group, tok = finished_group(PromptRecord("q1", "prompt", [1], "1", reward_info={"data_source": "x"}), ["a", "b"])
    group.samples[0].num_generated, group.samples[1].num_generated = 12, 14   # 2 of 4 buffer tokens: -0.5
    assert [sample_row(s, tok, fn)["reward"] for s in group.samples] == [0.25, -0.25]
    assert config_reward(RolloutConfig(reward=f"{HERE}:compute_score_float"), True).__class__ is VerlReward
    mv = config_reward(RolloutConfig(overlong_buffer=4, sampling={"max_tokens": 16}), True)
    assert mv.stats is resolve_reward("math_verify", True).stats   # math_verify's timeouts still counted
    with pytest.raises(ConfigError, match="overlong_buffer"):
        RolloutConfig(overlong_buffer=17, sampling={"max_tokens": 16})
    with pytest.raises(ConfigError, match="overlong_buffer shapes the scores of a reward function.*reward is 'none'"):
        RolloutConfig(overlong_buffer=4, reward="none", sampling={"max_tokens": 16})   # it would shape nothing


def extra_table(extras: list) -> pa.Table:
    """A trajectories table whose rows carry ``extras`` (each None or a dict) as reward_extra JSON text."""
    rows = [{"prompt_id": f"p{i}", "sample_index": 0, "reward_extra": None if e is None else json.dumps(e)}
            for i, e in enumerate(extras)]
    schema = trajectory_schema()
    return pa.Table.from_pylist(rows, schema=pa.schema([schema.field(n) for n in rows[0]]))


@pytest.mark.parametrize("extras, struct", [
    ([{"acc": True, "pred": "18"}, {"acc": False, "pred": "17"}], True),   # verl's: the same keys every row
    ([{"acc": True, "pred": "18"}, None, {"pred": "7", "acc": True}], True),   # a failed row; another key order
    ([{"acc": True}, {"acc": True, "pred": "1"}], False),   # keys differ
    ([{"n": 1}, {"n": "one"}], False),   # a key both number and text
    ([None, None], False),   # no reward returned a dict
    ([{}, {}], False),   # nothing to make fields of
])
def test_reward_extra_is_a_struct_where_every_row_has_the_same_keys(extras, struct):
    from pdsr_sdk.dispatch.trajectory import reward_extra_json, reward_extra_struct

    table = extra_table(extras)
    out = reward_extra_struct(table)
    assert pa.types.is_struct(out.schema.field("reward_extra").type) is struct
    got = out.column("reward_extra").to_pylist()
    if struct:
        assert got == [None if e is None else {k: e[k] for k in extras[0]} for e in extras]
        assert out.schema.field("reward_extra").metadata == table.schema.field("reward_extra").metadata
        back = reward_extra_json(out)
        assert [None if v is None else json.loads(v) for v in back.column("reward_extra").to_pylist()] == extras
        assert back.schema.field("reward_extra").type == pa.string()
    else:
        assert out.equals(table)


def test_the_finished_file_has_the_struct_and_a_resumed_run_merges_it(tmp_path):
    from pdsr_sdk.rollout.writer import TrajectoryWriter

    schema = pa.schema([trajectory_schema().field(n) for n in ("prompt_id", "sample_index", "reward_extra")])
    row = lambda pid, acc: {"prompt_id": pid, "sample_index": 0, "reward_extra": json.dumps({"acc": acc})}  # noqa: E731
    out = tmp_path / "run.parquet"
    first = TrajectoryWriter(out, schema)
    first.add_group([row("a", True)])
    first.flush()
    assert pq.read_table(next(iter((tmp_path / "run.parquet.parts").glob("part-*")))).schema.field(
        "reward_extra").type == pa.string()   # parts stream JSON text
    first.finalize()
    assert pq.read_table(out).column("reward_extra").to_pylist() == [{"acc": True}]
    resumed = TrajectoryWriter(out, schema, resume=True)
    assert resumed.finished_prompt_ids() == {"a"}
    resumed.add_group([row("b", False)])
    resumed.finalize()
    assert pq.read_table(out).column("reward_extra").to_pylist() == [{"acc": True}, {"acc": False}]


async def compute_score_async(data_source, solution_str, ground_truth, extra_info=None):
    """verl's reward loop awaits an async compute_score; this one also records the loop it ran on."""
    await asyncio.sleep(0)
    LOOPS.append(asyncio.get_running_loop())
    return {"score": math_boxed(solution_str, ground_truth), "source": data_source}


async def compute_score_async_batched(data_sources, solution_strs, ground_truths, extra_infos=None):
    await asyncio.sleep(0)
    return [float(len(s)) for s in solution_strs]


LOOPS: list = []


def test_an_async_reward_is_awaited_in_every_form():
    record = PromptRecord("q1", "prompt", [1], "18", reward_info={"data_source": "openai/gsm8k"})
    group, tok = finished_group(record, ["\\boxed{18}", "\\boxed{17}"])
    LOOPS.clear()
    rows = [sample_row(s, tok, resolve_reward(f"{HERE}:compute_score_async", True)) for s in group.samples]
    assert [(r["reward"], r["reward_error"]) for r in rows] == [(1.0, None), (0.0, None)]
    assert json.loads(rows[0]["reward_extra"]) == {"source": "openai/gsm8k"}
    assert len(LOOPS) == 2 and LOOPS[0] is LOOPS[1]   # one loop per thread, kept: a client bound to it still works
    batched = resolve_reward(f"{HERE}:compute_score_async_batched", True)
    assert [sample_row(s, tok, batched)["reward"] for s in group.samples] == [10.0, 10.0]

    async def pdsr_style(text, ground_truth, **info):
        return float(info["sample_index"])

    async def pdsr_style_named(text, ground_truth, sample_index):
        return float(sample_index) + 0.5

    assert [sample_row(s, tok, adapt_reward(pdsr_style, "r"))["reward"] for s in group.samples] == [0.0, 1.0]
    assert [sample_row(s, tok, adapt_reward(pdsr_style_named, "r"))["reward"] for s in group.samples] == [0.5, 1.5]
    from pdsr_sdk.rollout.reward import OverlongShaping

    shaped = OverlongShaping(adapt_reward(pdsr_style_named, "r"), max_tokens=10, buffer=4, penalty=1.0)
    assert shaped("t", "1", sample_index=1, response_length=8)["score"] == 1.0   # 1.5, less 2 of 4 buffer tokens

    async def on_a_loop():   # called from a thread that runs a loop (sample_row inside a session's loop)
        return sample_row(group.samples[0], tok, adapt_reward(pdsr_style, "r"))["reward"]
    assert asyncio.run(on_a_loop()) == 0.0


@pytest.mark.parametrize("result, error", [
    (None, "the reward returned None as its score"), ({"score": None, "acc": False}, "returned None as its score"),
    (float("nan"), "the reward returned nan as its score; a score is a finite number"),
    ({"score": float("inf")}, "returned inf as its score"), (float("-inf"), "returned -inf as its score"),
    ("0.5", "the reward returned '0.5' (str) as its score; a score is a number"),
    ({"score": "abc", "acc": False}, "the reward returned 'abc' (str) as its score"),
    # before: "TypeError: float() argument must be a string or a real number, not 'list'", naming no reward
    ([1.0], "the reward returned [1.0] (list) as its score; a score is a number"),
    ((1.0, {"acc": True}), "the reward returned (1.0, {'acc': True}) (tuple) as its score"),
    ({"score": [0.5]}, "the reward returned [0.5] (list) as its score"),
])
def test_a_score_that_is_none_or_not_finite_is_that_samples_error(result, error):
    from pdsr_sdk.rollout.reward import OverlongShaping

    def reward(data_source, solution_str, ground_truth, extra_info=None):
        return result if solution_str == "bad" else 1.0

    group, tok = finished_group(PromptRecord("q1", "prompt", [1], "1"), ["good", "bad"])
    for fn in (adapt_reward(reward, "r"), OverlongShaping(adapt_reward(reward, "r"), max_tokens=4, buffer=2,
                                                          penalty=1.0)):
        rows = [sample_row(s, tok, fn) for s in group.samples]
        assert rows[0]["reward"] == 1.0 and rows[0]["reward_error"] is None
        assert rows[1]["reward"] is None and error in rows[1]["reward_error"]


def test_overlong_shaping_keeps_the_score_the_zero_variance_filter_compares():
    """DAPO filters on accuracy (its metric 'acc'), not on the shaped reward: a group all wrong whose responses
    ran into the overlong buffer by different amounts has unequal rewards, and is filtered all the same."""
    from pdsr_sdk.rollout.reward_runner import RewardRunner
    from pdsr_sdk.rollout.session import RolloutSession

    class NeverStarted:
        def __getattr__(self, name):
            raise AssertionError("an engine was used")

    def judge(responses, lengths):
        record = PromptRecord("q1", "prompt", [1], "18", reward_info={"data_source": "openai/gsm8k"})
        group, tok = finished_group(record, responses)
        for s, n in zip(group.samples, lengths):
            s.num_generated = n
        session = RolloutSession(RolloutConfig(reward=f"{HERE}:compute_score", overlong_buffer=4,
                                               sampling={"max_tokens": 16, "n": len(responses)},
                                               filter_groups={"kind": "zero-variance"}), engines=[NeverStarted()])

        async def run():
            session.rewards = RewardRunner(session.reward_for, tok)
            scored = await session.rewards.wait(group.samples)
            return scored, session.group_filter(group, [sc.reward for sc in scored])
        scored, passed = asyncio.run(run())
        session.rewards.close()
        rows = [sample_row(s, tok, session.reward_for(group)) for s in group.samples]   # scored after the step
        assert [r["reward"] for r in rows] == [sc.reward for sc in scored]
        assert [json.loads(r["reward_extra"]) for r in rows] == [json.loads(sc.extra) for sc in scored]
        return scored, passed

    scored, passed = judge(["\\boxed{17}", "\\boxed{16}"], [10, 14])   # all wrong, one 2 tokens into the buffer
    assert [sc.reward for sc in scored] == [0.0, -0.5] and not passed
    assert [sc.score for sc in scored] == [0.0, 0.0] and json.loads(scored[1].extra)["overlong_reward"] == -0.5
    scored, passed = judge(["\\boxed{18}", "\\boxed{16}"], [14, 10])   # one right: signal, shaped or not
    assert [sc.reward for sc in scored] == [0.5, 0.0] and passed
