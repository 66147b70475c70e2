"""A run resumed from a file an older pdsr wrote, without a column added since (stop_reason): the merged file has
the column, null in the older rows, and the new rows' values."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from pdsr_sdk.dispatch.trajectory import trajectory_schema
from pdsr_sdk.rollout.writer import TrajectoryWriter


def _row(prompt_id, stop_reason):
    row = {f.name: None for f in trajectory_schema()}
    row.update(prompt_id=prompt_id, sample_index=0, group_size=1, batch_index=0, is_probe=False,
               prompt_token_ids=[1, 2], response_token_ids=[3, 151645], prompt_text="p", response_text="r",
               response_logprobs=[-0.5, -0.25], finish_reason="stop", stop_reason=stop_reason, prompt_length=2,
               response_length=2, segments=[], num_segments=0, moves=0, restarts=0, retries=0, steals=0,
               wasted_tokens=0, submit_time_s=0.0, finish_time_s=1.0, policy_versions=[0])
    return row


def test_an_older_file_without_stop_reason_is_merged_with_it_null(tmp_path):
    schema = trajectory_schema()
    old = pa.Table.from_pylist([_row("q0", None)], schema=schema).drop_columns(["stop_reason"])
    path = tmp_path / "run.parquet"
    pq.write_table(old, path)
    writer = TrajectoryWriter(path, schema, resume=True)
    writer.add_group([_row("q1", "151645")])
    merged = pq.read_table(writer.finalize())
    assert merged.schema.field("stop_reason").type == pa.string()
    assert merged.column("prompt_id").to_pylist() == ["q0", "q1"]
    assert merged.column("stop_reason").to_pylist() == [None, "151645"]
    assert merged.column("response_logprobs").to_pylist() == [[-0.5, -0.25]] * 2
