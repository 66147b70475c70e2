"""The output's merge streams: the merged file holds what one in-memory concatenation of the files gives (the
reference below: every row, in order, ``reward_extra`` a struct where every row allows), in row groups of
``batch_rows`` however the files were split, and no file is read whole but its ``reward_extra`` column."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pdsr_sdk.dispatch.trajectory import reward_extra_json, reward_extra_struct, trajectory_schema
from pdsr_sdk.rollout import writer as writer_mod
from pdsr_sdk.rollout.writer import merge_files
from workloads import trajectory_rows


def reference(files, schema, folder) -> pa.Table:
    """The merge as one table in memory (what the writer did before it streamed), written and read back."""
    tables = [reward_extra_json(pq.read_table(f)).cast(schema) for f in files]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    pq.write_table(reward_extra_struct(table.replace_schema_metadata(schema.metadata)), folder / "reference.parquet")
    return pq.read_table(folder / "reference.parquet")


def write_parts(folder, sizes, extra):
    files = []
    for k, size in enumerate(sizes):
        rows = [r for g in range(size) for r in trajectory_rows(f"p{k}-{g}", n=3)]
        for i, r in enumerate(rows):
            r["reward_extra"] = extra(k, i)
            r["response_token_ids"] = list(range(i % 7))
        files.append(folder / f"part-{k:06d}.parquet")
        pq.write_table(pa.Table.from_pylist(rows, schema=trajectory_schema()), files[-1])
    return files


EXTRAS = {
    "struct": lambda k, i: None if i % 5 == 0 else json.dumps({"acc": i % 2 == 0, "pred": str(i)}),
    "text": lambda k, i: json.dumps({"acc": True} if (k + i) % 4 else {"pred": "x"}),   # keys differ between rows
    "none": lambda k, i: None,
}


@pytest.mark.parametrize("extra", sorted(EXTRAS))
@pytest.mark.parametrize("sizes, batch_rows", [([3, 1, 4, 1, 5], 4), ([2, 2], 6), ([7], 1024), ([0, 2], 5)])
def test_the_streamed_merge_equals_the_merge_in_memory(tmp_path, monkeypatch, extra, sizes, batch_rows):
    files = write_parts(tmp_path, sizes, EXTRAS[extra])
    schema = trajectory_schema().with_metadata({b"k": b"v"})
    expected = reference(files, schema, tmp_path)
    read_table = pq.read_table

    def only_reward_extra(path, columns=None, **kw):
        assert columns == ["reward_extra"], f"read whole: {path}"
        return read_table(path, columns=columns, **kw)

    monkeypatch.setattr(pq, "read_table", only_reward_extra)
    out = tmp_path / "out.parquet"
    merge_files(files, schema, out, batch_rows=batch_rows)
    monkeypatch.undo()
    got = pq.read_table(out)
    assert got.equals(expected, check_metadata=True)
    assert pa.types.is_struct(got.schema.field("reward_extra").type) is (extra == "struct")
    groups = [pq.ParquetFile(out).metadata.row_group(i).num_rows for i in range(pq.ParquetFile(out).num_row_groups)]
    rows = got.num_rows
    assert groups == ([batch_rows] * (rows // batch_rows) + ([rows % batch_rows] if rows % batch_rows else []) or [0])
    again = tmp_path / "again.parquet"   # a merged file merged once more (a resume with nothing left): the same file
    merge_files([out], schema, again, batch_rows=batch_rows)
    assert again.read_bytes() == out.read_bytes()


def test_the_writer_merges_a_resumed_runs_file_with_its_new_parts(tmp_path):
    out = tmp_path / "run.parquet"
    first = writer_mod.TrajectoryWriter(out, trajectory_schema(), flush_groups=1)
    for pid in ("a", "b"):
        first.add_group([dict(r, reward_extra=json.dumps({"acc": True})) for r in trajectory_rows(pid)])
    first.finalize()
    second = writer_mod.TrajectoryWriter(out, trajectory_schema(), resume=True, flush_groups=1)
    second.add_group([dict(r, reward_extra=json.dumps({"acc": False})) for r in trajectory_rows("c")])
    files = [out, second.parts_dir / "part-000002.parquet"]   # the merged file, then the new group's part
    expected = reference(files, second.schema.with_metadata({writer_mod.MERGED_KEY: b"3"}), tmp_path)
    second.finalize()
    assert pq.read_table(out).equals(expected, check_metadata=True)
    assert pq.read_table(out).column("reward_extra").to_pylist() == [{"acc": True}] * 4 + [{"acc": False}] * 2
