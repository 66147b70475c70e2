"""``pdsr score`` holds its output's lock (``<out>.lock``) for the whole run, a resume included: a second run on
the same ``--out`` is refused naming the path and the running one, before it touches ``<out>.parts/``; the lock
goes when the run ends, finished or failed."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_checks import failed, invoke
from support import interrupt_at_call
from tiny_scoring import random_samples

from pdsr_sdk.errors import DataError, Interrupted
from pdsr_sdk.io.output_lock import output_lock
from pdsr_sdk.scoring import file_run
from pdsr_sdk.scoring.config import ScoreConfig

pytest.importorskip("torch")


@pytest.fixture()
def config(tmp_path, tiny_model_dir):
    """A run of 12 rows in blocks of about 100 tokens (several blocks)."""
    prompts, responses = random_samples(5, 12, max_prompt=20, max_completion=40)
    data = tmp_path / "traj.parquet"
    pq.write_table(pa.table({"prompt_token_ids": prompts, "response_token_ids": responses}), data)
    return ScoreConfig(model=tiny_model_dir, data=data, out=tmp_path / "scored.parquet", device="cpu",
                       dtype="float32", block_tokens=100)


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def lock_is_free(out) -> bool:
    """No lock file left, and a new run takes the lock."""
    if (out.parent / f"{out.name}.lock").exists():
        return False
    with output_lock(out, "pdsr score"):
        return True


def test_a_second_run_on_a_held_output_is_refused_and_a_resume_waits_for_it(config, monkeypatch):
    out = config.out
    # Ctrl-C as the second block starts: block 0 on disk
    score = interrupt_at_call(monkeypatch, file_run, "score_checked", 2)
    with pytest.raises(Interrupted):
        file_run.score_file(config)
    monkeypatch.setattr(file_run, "score_checked", score)
    assert lock_is_free(out)                       # released after an error
    parts = out.parent / "scored.parquet.parts"
    before = snapshot(parts)
    assert list(before) == ["block-00000.parquet"]

    resume = config.model_copy(update={"resume": True})
    with output_lock(out, "pdsr score"):         # the first run, still going
        with pytest.raises(DataError) as caught:
            file_run.score_file(resume)
        assert str(caught.value).startswith(f"{out}: another pdsr score is writing this output (process "
                                            f"{os.getpid()}, holding scored.parquet.lock)")
        message = failed(invoke("score", "--model", config.model, "--data", config.data, "--out", out, "--device",
                                "cpu", "--dtype", "float32", "--block-tokens", 100, "--resume"))
        assert f"{out}: another pdsr score is writing this output" in " ".join(message.split())
        assert snapshot(parts) == before and not out.exists()

    path, stats = file_run.score_file(resume)    # the first run gone: the resume goes on
    assert path == out and stats.resumed_samples > 0 and pq.read_table(out).num_rows == 12
    assert lock_is_free(out)                       # released after success


def test_a_failed_run_leaves_no_lock_nor_the_folder_it_made_for_it(config, tmp_path):
    pq.write_table(pa.table({"prompt_token_ids": [[1, 2]], "response_token_ids": [[10**6]]}), config.data)
    out = tmp_path / "new" / "scored.parquet"
    with pytest.raises(DataError, match="vocabulary"):
        file_run.score_file(config.model_copy(update={"out": out}))
    assert not (tmp_path / "new").exists()
