"""--resume reads the groups a multi-step run carried between steps (``<out>.parts/_carry.parquet``) for the
columns it restores only: the prompts' token ids and text, as heavy there as in the trajectories, are not read, and
the groups come back as from the whole file; a carry file of another run is not read at all."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from pdsr_sdk.dispatch.trajectory import carry_schema, trajectory_schema
from pdsr_sdk.errors import DataError
from pdsr_sdk.rollout.data import PromptRecord
from pdsr_sdk.rollout.resume import carried_groups, read_resume_state
from pdsr_sdk.rollout.writer import TrajectoryWriter, carry_file
from workloads import trajectory_rows

HEAVY = ("prompt_token_ids", "prompt_text")


def _segment(start: int, tokens: int) -> dict:
    return {"pool": "fast", "engine": "e1", "start_token": start, "num_tokens": tokens, "policy_version": 0,
            "submit_time_s": 0.5, "first_token_time_s": 0.75, "end_time_s": 1.5, "end_reason": "segment",
            "drafted_tokens": None, "accepted_tokens": None}


def _carry_rows(pid: str) -> list[dict]:
    """A group of 2 in flight: sample 0 finished, sample 1 part-way, both with a long prompt."""
    rows = []
    for i, row in enumerate(trajectory_rows(pid, 2)):
        n = 3 + 4 * i
        row.update(prompt_token_ids=list(range(20_000)), prompt_text="w" * 50_000, prompt_length=20_000,
                   response_token_ids=list(range(100 + i, 100 + i + n)), response_logprobs=[-0.25 * i] * n,
                   response_length=n, segments=[_segment(0, n)], num_segments=1, routed_to="fast", moves=i,
                   steals=1, first_token_time_s=0.75, launch_step=1,
                   finish_reason="stop" if i == 0 else None, finish_time_s=2.0 if i == 0 else None,
                   submit_time_s=0.5 if i == 0 else None, stop_reason="</a>" if i == 0 else None)
        rows.append(row)
    return rows


def _run(tmp_path, carry_run_id: str = "r1"):
    """q0 consumed in step 0; q1 and (as the run stopped between its two writes) q0 again carried."""
    out = tmp_path / "run.parquet"
    writer = TrajectoryWriter(out, trajectory_schema(), flush_groups=1, metadata={"run_id": "r1"})
    writer.add_group(trajectory_rows("q0", 2))
    writer.flush()
    carry = TrajectoryWriter(out, trajectory_schema(), resume=True, metadata={"run_id": carry_run_id})
    carry.write_carry(_carry_rows("q1") + _carry_rows("q0"), carry_schema())
    return out


def _samples(rows: list[dict]) -> list[dict]:
    records = [PromptRecord(pid, "p", [1]) for pid in ("q0", "q1")]
    out = []
    for group, step in carried_groups(rows, records, 2, 64, "carry"):
        for s in group.samples:
            out.append({"prompt_id": group.prompt_id, "step": step, **{k: getattr(s, k) for k in (
                "token_ids", "logprobs", "num_generated", "segments", "finish_reason", "stop_reason", "is_probe",
                "routed_to", "moves", "restarts", "retries", "steals", "wasted_tokens", "submit_time_s",
                "first_token_time_s", "finish_time_s")}})
    return out


def test_carried_groups_are_restored_without_reading_the_prompts(tmp_path, monkeypatch):
    out = _run(tmp_path)
    whole = [r for r in pq.read_table(carry_file(out)).to_pylist() if r["prompt_id"] != "q0"]
    asked: list = []
    read_table = pq.read_table

    def recording(source, *args, columns=None, **kwargs):
        asked.append((str(source), columns))
        return read_table(source, *args, columns=columns, **kwargs)

    monkeypatch.setattr(pq, "read_table", recording)
    state = read_resume_state(out, {}, tmp_path / "summary.json")
    assert state.done_ids == {"q0"}
    got = _samples(state.carried)
    assert got == _samples(whole)
    assert [s["prompt_id"] for s in got] == ["q1", "q1"] and got[1]["token_ids"] == [101, 102, 103, 104, 105, 106, 107]
    assert got[1]["segments"][0].num_tokens == 7 and got[0]["stop_reason"] == "</a>"
    carry_reads = [columns for source, columns in asked if source == str(carry_file(out))]
    assert len(carry_reads) == 1 and carry_reads[0] is not None
    assert not set(HEAVY) & set(carry_reads[0])


def test_a_carry_file_of_another_run_is_not_read(tmp_path, monkeypatch):
    out = _run(tmp_path, carry_run_id="r0")
    read_table = pq.read_table

    def recording(source, *args, **kwargs):
        if str(source) == str(carry_file(out)):
            raise AssertionError("the carry file of another run was read")
        return read_table(source, *args, **kwargs)

    monkeypatch.setattr(pq, "read_table", recording)
    assert read_resume_state(out, {}, tmp_path / "summary.json").carried == []


def test_an_unreadable_carry_file_is_named(tmp_path):
    out = _run(tmp_path)
    carry_file(out).write_bytes(b"not parquet")
    with pytest.raises(DataError, match=r"_carry\.parquet: cannot read the groups the run carried between steps"):
        read_resume_state(out, {}, tmp_path / "summary.json")
