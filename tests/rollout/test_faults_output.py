"""A ``pdsr rollout`` whose output breaks mid-run: the output folder deleted, a write refused by the kernel for a
file size limit (RLIMIT_FSIZE, what a full disk looks like to the writer). The run stops with an error naming the
file, never merges what is left as if it were the whole run, and ``--resume`` then completes it with every group
once. Fake engines (fakes:LoopEngine, no vLLM): the behaviour is the writer's."""

from __future__ import annotations

import resource
import shutil

import pyarrow.parquet as pq
import pytest

from cli_checks import fake_rollout, invoke, write_jsonl
from pdsr_sdk.rollout import writer as writer_mod


@pytest.fixture()
def run(tmp_path, tiny_model_dir):
    """``pdsr rollout`` on a fake engine over 5 prompts in batches of 2, a part file per group."""
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"id": f"q{i}", "prompt": f"What is {i}+1?"} for i in range(5)])
    return [*fake_rollout(tmp_path, tiny_model_dir, flush_groups=1), "--data", prompts, "--batch-size", 2]


def keys(path):
    return sorted((r["prompt_id"], r["sample_index"]) for r in pq.read_table(path).to_pylist())


WHOLE = sorted((f"q{i}", s) for i in range(5) for s in range(2))


def test_an_output_folder_deleted_mid_run_stops_it_and_resume_runs_the_lost_groups(tmp_path, run, monkeypatch):
    """The folder is deleted after two groups were written: before, the next write made it again and the merge
    presented the 3 groups written after as the run's 5. Now the next write stops the run naming the part file
    that went, nothing is merged, and --resume runs all 5 groups, each once."""
    out = tmp_path / "runs" / "o.parquet"
    flush = writer_mod.TrajectoryWriter.flush

    def flush_then_delete(self):
        flush(self)
        if self.groups_on_disk == 2 and out.parent.exists():
            shutil.rmtree(out.parent)

    monkeypatch.setattr(writer_mod.TrajectoryWriter, "flush", flush_then_delete)
    r = invoke(*run, "--out", out)
    monkeypatch.undo()
    assert r.exit_code == 2, r.output
    assert f"error: {out.parent / 'o.parquet.parts' / 'part-000000.parquet'} and 1 more: removed while the run " \
           f"was writing {out}" in r.output and "Rerun with --resume" in r.output
    assert "Traceback" not in r.output and not out.exists()

    again = invoke(*run, "--out", out, "--resume")
    assert again.exit_code == 0, again.output
    assert keys(out) == WHOLE


def _file_size_limit_from(monkeypatch, nth: int, limit: int = 1024) -> list:
    """The output's Parquet writes from the ``nth`` (1-based) on run under a file size limit of ``limit`` bytes: the
    kernel refuses them (EFBIG; Python ignores SIGXFSZ) as a full disk would, until the test undoes it. Returns the
    files it was asked to write."""
    asked = []

    def limiting(write):   # a part file's write, or the merge's (its last argument before the keywords: the path)
        def limited(*args, **kwargs):
            asked.append(args[-1])
            if len(asked) < nth:
                return write(*args, **kwargs)
            soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
            try:
                return write(*args, **kwargs)
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        return limited

    monkeypatch.setattr(writer_mod, "write_table_atomic", limiting(writer_mod.write_table_atomic))
    monkeypatch.setattr(writer_mod, "merge_files", limiting(writer_mod.merge_files))
    return asked


def test_a_part_the_disk_refuses_stops_the_run_naming_it_and_saying_what_is_kept(tmp_path, run, monkeypatch):
    """The third group's part cannot be written: before, pyarrow's OSError (naming no file) came out as a traceback,
    twice. Now one error names the part file, says that the 2 groups before it are on disk and how to go on; no
    half-written file is left; --resume runs the other 3."""
    out = tmp_path / "o.parquet"
    asked = _file_size_limit_from(monkeypatch, 3)
    r = invoke(*run, "--out", out)
    monkeypatch.undo()
    part = tmp_path / "o.parquet.parts" / "part-000002.parquet"
    assert r.exit_code == 2, r.output
    assert asked[2] == part
    assert f"error: {part}: cannot write it (File too large)" in r.output
    assert f"2 finished groups of this run are on disk in {part.parent}/; rerun with --resume" in r.output
    assert "Traceback" not in r.output and not out.exists()
    assert sorted(p.name for p in part.parent.iterdir()) == ["part-000000.parquet", "part-000001.parquet"]
    assert not list(tmp_path.glob(".*.tmp")) and not list(part.parent.glob(".*.tmp"))

    again = invoke(*run, "--out", out, "--resume")
    assert again.exit_code == 0, again.output
    assert "(2 groups from before" in again.output and keys(out) == WHOLE


def test_a_merge_the_disk_refuses_leaves_the_parts_and_resume_merges_them(tmp_path, run, monkeypatch):
    """Every group is in its part; the merged output cannot be written (a file size limit below its size): an error
    naming the output, no output file, the parts kept; once space is there, --resume runs nothing and merges."""
    out = tmp_path / "o.parquet"
    asked = _file_size_limit_from(monkeypatch, 6)   # 5 parts, then the merge
    r = invoke(*run, "--out", out)
    monkeypatch.undo()
    assert r.exit_code == 2, r.output
    assert asked[5] == out and f"error: {out}: cannot write it (File too large)" in r.output
    assert "Traceback" not in r.output and not out.exists()
    assert len(list((tmp_path / "o.parquet.parts").glob("part-*.parquet"))) == 5

    again = invoke(*run, "--out", out, "--resume")
    assert again.exit_code == 0, again.output
    assert "nothing left to run" in again.output and keys(out) == WHOLE
    assert not (tmp_path / "o.parquet.parts").exists()
