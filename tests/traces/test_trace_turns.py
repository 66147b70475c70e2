"""Traces of turns (multi-turn samples): the JSONL key, its checks, the synthetic multi-turn member, and old traces
read as before."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.errors import DataError
from pdsr_sdk.traces import LengthTrace, read_trace, synth_trace, workload, write_trace_jsonl
from pdsr_sdk.traces.trace import SampleTurns

LINE = {"prompt_id": "g", "prompt_len": 5, "lengths": [30, 7],
        "turns": [[[10, 4, 0.5], [16, 0, 0.0]], None]}


def _write(path: Path, lines: list) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_turns_round_trip_and_old_traces_read_as_before(tmp_path):
    path = _write(tmp_path / "t.jsonl", [LINE, {"prompt_id": "h", "prompt_len": 2, "lengths": [3],
                                                "turns": [[[1, 1, 2.0], [1, 0, 0.25]]]}])
    trace = read_trace(path)
    assert trace.multi_turn
    assert trace.turns.of(0) == [(10, 4, 0.5), (16, 0, 0.0)]
    assert trace.turns.of(1) is None   # a single-turn sample in a trace of turns
    assert trace.turns.of(2) == [(1, 1, 2.0), (1, 0, 0.25)]
    again = read_trace(write_trace_jsonl(trace, tmp_path / "again.jsonl"))
    assert [again.turns.of(i) for i in range(3)] == [trace.turns.of(i) for i in range(3)]
    assert trace.group(0)["turns"] == LINE["turns"]
    old = read_trace(_write(tmp_path / "old.jsonl", [{"prompt_id": "g", "prompt_len": 5, "lengths": [30, 7]}]))
    assert old.turns is None and not old.multi_turn


@pytest.mark.parametrize("turns, needle", [
    ([[[10, 4, 0.5], [15, 0, 0.0]], None],
     "turns[0] adds up to 29 tokens (sampled + environment) but lengths[] says 30"),
    ([[[0, 4, 0.5], [26, 0, 0.0]], None], "turns[0] turn 0 is [0, 4, 0.5]; expected [sampled, env_tokens, env_s]"),
    ([[[10, 4, -1], [16, 0, 0.0]], None], "turns[0] turn 0 is [10, 4, -1]"),
    ([[[10, 4.5, 1], [16, 0, 0.0]], None], "turns[0] turn 0 is [10, 4.5, 1]"),
    ([[[10, 4], [16, 0, 0.0]], None], "turns[0] turn 0 is [10, 4]"),
    ([[], None], "turns[0] is []; expected null (a single-turn sample) or a non-empty list"),
    ([[[30, 0, 0.0]]], "turns has 1 entries but lengths has 2"),
    ("x", "turns must be a list"),
])
def test_bad_turns_name_the_line_and_sample(tmp_path, turns, needle):
    path = _write(tmp_path / "bad.jsonl", [{"prompt_id": "a", "prompt_len": 1, "lengths": [1], "turns": [None]},
                                           dict(LINE, turns=turns)])
    with pytest.raises(DataError) as info:
        read_trace(path)
    assert f"{path}:2: " in str(info.value) and needle in str(info.value)


def test_turns_given_for_every_group_or_none(tmp_path):
    path = _write(tmp_path / "t.jsonl", [LINE, {"prompt_id": "h", "prompt_len": 1, "lengths": [4]}])
    with pytest.raises(DataError, match=r"t.jsonl:2: this line lacks 'turns' but line 1 has it"):
        read_trace(path)


def test_length_trace_checks_turns_against_lengths():
    turns = SampleTurns.from_lists([[(2, 1, 0.5), (3, 0, 0.0)], None])
    LengthTrace.from_matrix(np.array([[6, 9]]), turns=turns)
    with pytest.raises(DataError, match=r"group 0 \('p0'\) sample 0: its turns add up to 6 tokens"):
        LengthTrace.from_matrix(np.array([[7, 9]]), turns=turns)
    with pytest.raises(DataError, match="turns has 2 entries, expected one per sample \\(3\\)"):
        LengthTrace.from_matrix(np.array([[6, 9, 1]]), turns=turns)
    # the bad number as it is, not numpy's repr (np.int64(0))
    with pytest.raises(DataError, match=r"sample 0, turn 0: sampled is 0; expected >= 1$"):
        LengthTrace.from_matrix(np.array([[5, 9]]), turns=SampleTurns.from_lists([[(0, 5, 0.1)], None]))


def test_synth_turns_follow_the_model():
    cfg = dict(groups=256, n=8, seed=5, turns_min=1, turns_max=8, env_tokens_min=16, env_tokens_max=256,
               env_delay_min_s=0.1, env_delay_max_s=5.0)
    trace = synth_trace(**cfg)
    single = synth_trace(**{**cfg, "turns_max": 1})
    assert single.turns is None
    t = trace.turns
    counts = np.diff(t.offsets)
    assert counts.min() >= 1 and counts.max() == 8 and 3.5 < counts.mean() < 5.5
    last = t.offsets[1:] - 1
    between = np.ones(t.sampled.size, dtype=bool)
    between[last] = False
    # after the last turn the environment adds nothing; between turns its tokens and delays lie in their ranges
    assert (t.env_tokens[last] == 0).all() and (t.env_s[last] == 0).all()
    assert t.env_tokens[between].min() >= 16 and t.env_tokens[between].max() <= 256
    assert t.env_s[between].min() >= 0.1 and t.env_s[between].max() <= 5.0
    # log-uniform: the median delay is the geometric mean of the range
    assert np.median(t.env_s[between]) == pytest.approx(np.sqrt(0.1 * 5.0), rel=0.1)
    # the sampled tokens are the single-turn trace's lengths (the same draws come first), cut into turns
    sampled = np.add.reduceat(t.sampled, t.offsets[:-1])
    np.testing.assert_array_equal(sampled, np.maximum(single.lengths, 1))
    np.testing.assert_array_equal(trace.lengths, sampled + np.add.reduceat(t.env_tokens, t.offsets[:-1]))
    # turns cluster by prompt: the spread between prompts' mean counts exceeds what independent draws give
    per_group = counts.reshape(256, 8).mean(axis=1)
    assert per_group.std() > 2 * counts.std() / np.sqrt(8)
    again = synth_trace(**cfg)
    np.testing.assert_array_equal(again.turns.env_s, t.env_s)


def test_multi_turn_member_and_cli(tmp_path):
    member = workload("multi-turn")
    assert member.config().turns_max == 8 and member.config().env_delay_max_s == 5.0
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(cli, ["trace", "synth", "--family", "multi-turn", "--groups", "8", "--seed", "101",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "turns per sample" in result.output
    trace = read_trace(out)
    direct = member.trace(groups=8, seed=101)
    np.testing.assert_array_equal(trace.turns.sampled, direct.turns.sampled)
    np.testing.assert_allclose(trace.turns.env_s, direct.turns.env_s)
