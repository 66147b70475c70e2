"""A ``pdsr rollout`` stopped at a chosen point (a kill leaves what the code had written by then; SIGTERM and
Ctrl-C stop it through its handlers) and ``--resume``d: every group on disk once, the run numbered and
summarised as a run made in one go, nothing left beside the output. Fake engines, no vLLM."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from cli_checks import fake_rollout
from pdsr_cli.main import cli


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture()
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i}+1?"}) + "\n" for i in range(5)))
    return path


@pytest.fixture()
def run(tmp_path, tiny_model_dir, prompts):
    """``pdsr rollout`` on a fake engine (no vLLM) over 5 prompts in batches of 2; flags after it complete it."""
    return [*fake_rollout(tmp_path, tiny_model_dir, flush_groups=1), "--data", prompts, "--batch-size", 2]


def keys(path):
    return [(r["prompt_id"], r["sample_index"], r["batch_index"]) for r in pq.read_table(path).to_pylist()]


def test_a_run_killed_after_merging_its_parts_resumes_without_reading_them_twice(tmp_path, run, monkeypatch):
    """Killed between writing the merged output and removing ``<out>.parts/`` (what ``finalize`` does last): the
    parts left hold the same groups as the output. A resume reads each group once, and so does a resume that
    runs more batches (its new parts numbered after the old ones)."""
    from pdsr_sdk.rollout import writer as writer_mod

    whole = tmp_path / "whole" / "o.parquet"
    assert invoke(*run, "--out", whole).exit_code == 0
    out = tmp_path / "o.parquet"
    rmtree = shutil.rmtree

    def killed_before_removing_parts(path, *args, **kwargs):   # the process ends here: nothing is removed
        if not str(path).endswith(".parts"):
            rmtree(path, *args, **kwargs)

    monkeypatch.setattr(writer_mod.shutil, "rmtree", killed_before_removing_parts)
    assert invoke(*run, "--out", out, "--num-batches", 2).exit_code == 0
    monkeypatch.setattr(writer_mod.shutil, "rmtree", rmtree)
    assert len(list((tmp_path / "o.parquet.parts").glob("part-*.parquet"))) == 4 and len(keys(out)) == 8

    again = invoke(*run, "--out", out, "--num-batches", 2, "--resume")
    assert again.exit_code == 0, again.output
    assert "nothing left to run" in again.output and "4 groups, 8 samples (4 groups from before" in again.output
    assert sorted(keys(out)) == sorted(k for k in keys(whole) if k[2] < 2)
    assert not (tmp_path / "o.parquet.parts").exists()

    # the same, and then the rest of the data: parts numbered on after those merged
    monkeypatch.setattr(writer_mod.shutil, "rmtree", killed_before_removing_parts)
    assert invoke(*run, "--out", out, "--num-batches", 2, "--resume").exit_code == 0
    monkeypatch.setattr(writer_mod.shutil, "rmtree", rmtree)
    rest = invoke(*run, "--out", out, "--resume")
    assert rest.exit_code == 0, rest.output
    assert sorted(keys(out)) == sorted(keys(whole)) and len(keys(out)) == 10
    summary = json.loads((tmp_path / "o.summary.json").read_text())
    assert summary["groups"] == 5 and summary["samples"] == 10
    assert [(b["batch_index"], b["groups"]) for b in summary["batches"]] == [(0, 2), (1, 2), (2, 1)]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("o.")) == ["o.parquet", "o.summary.json"]


def test_sigterm_at_a_steps_end_keeps_what_it_carries_and_resumes_as_one_run(tmp_path, run, monkeypatch):
    """``--steps 3 --step-groups 2 --over-provision 0.5`` terminated (SIGTERM, as a scheduler's preemption) in
    step 0's weight update: the step's groups, the groups it carries (with their tokens) and its summary are
    on disk, and the resumed run ends as the run made in one go."""
    import asyncio
    import os
    import signal

    from pdsr_sdk.rollout.session import RolloutSession
    from pdsr_sdk.rollout.writer import carry_file

    steps = [*run, "--steps", 3, "--step-groups", 2, "--over-provision", 0.5]
    whole = tmp_path / "whole" / "o.parquet"
    assert invoke(*steps, "--out", whole).exit_code == 0
    whole_summary = json.loads((tmp_path / "whole" / "o.summary.json").read_text())
    update = RolloutSession.anext_version

    async def preempted(self):   # SIGTERM arrives during the update: the run stops at its next await
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(asyncio.Event().wait(), 60)
        raise AssertionError("SIGTERM did not stop the run")

    out = tmp_path / "o.parquet"
    monkeypatch.setattr(RolloutSession, "anext_version", preempted)
    stopped = invoke(*steps, "--out", out)
    monkeypatch.setattr(RolloutSession, "anext_version", update)
    assert stopped.exit_code == 143 and "terminated (SIGTERM): 2 finished groups were written" in stopped.output
    carried = {r["prompt_id"] for r in pq.read_table(carry_file(out)).to_pylist()}
    summary = json.loads((tmp_path / "o.summary.json").read_text())
    assert [(b["batch_index"], b["carried_groups"]) for b in summary["batches"]] == [(0, len(carried))]
    assert len(carried) == whole_summary["batches"][0]["carried_groups"] == 1

    resumed = invoke(*steps, "--out", out, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert sorted(keys(out)) == sorted(keys(whole)) and len(keys(out)) == 10
    summary = json.loads((tmp_path / "o.summary.json").read_text())
    assert [(b["batch_index"], b["groups"], b["carried_groups"]) for b in summary["batches"]] == \
        [(b["batch_index"], b["groups"], b["carried_groups"]) for b in whole_summary["batches"]]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("o.")) == ["o.parquet", "o.summary.json"]


def test_run_rollout_gives_the_callers_sigterm_handler_back(tmp_path, tiny_model_dir):
    """A run handles SIGTERM itself (it stops the run, keeping what finished); afterwards a trainer's own
    handler, or the CLI's, is in place again, not the default that ends the process with nothing cleaned up."""
    import signal

    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.run import run_rollout

    def trainers_handler(signum, frame):
        raise AssertionError("no SIGTERM in this test")

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="baseline", batch_size=2, sampling={"n": 2, "max_tokens": 4},
                        data={"limit": 2}, output={"path": tmp_path / "o.parquet"},
                        engines=[{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine", "max_model_len": 256}])
    before = signal.signal(signal.SIGTERM, trainers_handler)
    try:
        assert run_rollout(cfg).groups == 2
        assert signal.getsignal(signal.SIGTERM) is trainers_handler
    finally:
        signal.signal(signal.SIGTERM, before)


def test_sigterm_after_the_run_finished_says_the_output_is_complete(tmp_path, run, monkeypatch):
    """SIGTERM while the engines shut down, every group already merged into the output: the line says the output
    is complete, not that groups wait in ``<out>.parts/`` (gone by then) for a --resume."""
    import asyncio
    import os
    import signal

    from pdsr_sdk.rollout.session import RolloutSession

    close = RolloutSession.close

    async def preempted_while_closing(self):
        os.kill(os.getpid(), signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.Event().wait(), 60)
        finally:
            await close(self)

    monkeypatch.setattr(RolloutSession, "close", preempted_while_closing)
    out = tmp_path / "o.parquet"
    r = invoke(*run, "--out", out)
    assert r.exit_code == 143
    assert f"terminated (SIGTERM) while the engines were shutting down, after the run had finished: {out} is " \
           f"complete" in r.output and "--resume" not in r.output
    assert len(keys(out)) == 10 and not (tmp_path / "o.parquet.parts").exists()


def test_a_resume_removes_the_temp_files_a_killed_write_left(tmp_path, run):
    """A run killed (kill -9) inside an atomic write of its output or summary leaves the write's temp file, half
    written, beside it (no clean-up runs). The next run on that output removes them; other files stay."""
    out = tmp_path / "o.parquet"
    assert invoke(*run, "--out", out, "--num-batches", 1).exit_code == 0
    for name in (".o.parquet.k9x2f7qa.tmp", ".o.summary.json.0hc1_3zz.tmp"):   # an atomic write's temp files
        (tmp_path / name).write_bytes(b"half a file")
    others = [tmp_path / ".o.parquet.notes.txt", tmp_path / ".other.parquet.abcdefgh.tmp"]
    for other in others:
        other.write_text("not pdsr's")
    r = invoke(*run, "--out", out, "--resume")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == sorted(o.name for o in others)
