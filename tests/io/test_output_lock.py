"""``output_lock``, which ``pdsr rollout`` and ``pdsr score`` hold on their output while they write it: a second run
on the same output is refused naming the path, the running one's command and process id."""

from __future__ import annotations

import fcntl
import os

import pytest

import pdsr_sdk.io.output_lock as lock_module
from pdsr_sdk.errors import DataError
from pdsr_sdk.io.output_lock import output_lock


def test_the_output_lock_holds_in_a_new_folder_and_leaves_no_empty_one(tmp_path):
    """Two runs into a folder that does not exist yet are kept apart too; a run that wrote nothing there leaves
    no folder behind, one that wrote keeps it."""
    out = tmp_path / "new" / "deeper" / "o.parquet"
    with output_lock(out, "pdsr rollout"):
        assert (out.parent / "o.parquet.lock").exists()
        with pytest.raises(DataError, match="another pdsr rollout is writing this output"):
            with output_lock(out, "pdsr rollout"):
                pass
    assert not (tmp_path / "new").exists()
    with output_lock(out, "pdsr rollout"):
        out.write_bytes(b"x")
    assert out.exists() and not (out.parent / "o.parquet.lock").exists()


def test_the_output_lock_is_not_taken_on_a_lock_file_its_run_just_removed(tmp_path, monkeypatch):
    """A run that ends unlinks its lock file; one that opened the file just before must not lock the unlinked file
    (a third run would then lock a new one beside it): it locks the file on disk, so a third run is refused."""
    out = tmp_path / "o.parquet"
    lock = tmp_path / "o.parquet.lock"
    real_open, opened = os.open, []

    def open_then_lose(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        if str(path) == str(lock) and not opened:
            opened.append(fd)
            os.unlink(lock)   # the run holding it ends between this open and the flock
        return fd

    monkeypatch.setattr(lock_module.os, "open", open_then_lose)
    with output_lock(out, "pdsr rollout"):
        monkeypatch.setattr(lock_module.os, "open", real_open)
        assert opened and lock.exists()
        assert lock.read_text() == f"{os.getpid()} pdsr rollout"
        with pytest.raises(DataError, match=r"o\.parquet: another pdsr rollout is writing this output"):
            with output_lock(out, "pdsr rollout"):
                pass
    assert not lock.exists()


def test_the_refusal_names_the_path_and_the_running_command_and_process(tmp_path):
    out = tmp_path / "scored.parquet"
    with output_lock(out, "pdsr score"):
        with pytest.raises(DataError) as caught:
            with output_lock(out, "pdsr rollout"):
                pass
    assert str(caught.value).startswith(f"{out}: another pdsr score is writing this output (process {os.getpid()}, "
                                        f"holding scored.parquet.lock)")
    (tmp_path / "scored.parquet.lock").write_text("4242")   # left by a pdsr that wrote only its process id
    fd = os.open(tmp_path / "scored.parquet.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(DataError, match=r"another pdsr run is writing this output \(process 4242,"):
            with output_lock(out, "pdsr score"):
                pass
    finally:
        os.close(fd)
