"""A session over many steps on fake engines from the config (tests/fakes.py's LoopEngine): what it keeps between
steps stays the size of the work in flight, however many steps a trainer's run of days has had."""

from __future__ import annotations

import itertools

from support import requires_torch

pytestmark = requires_torch


def partial_config(tiny_model_dir, **kw):
    """Partial rollout (over_provision 0.25, max_staleness 2): B = 4 groups of 2, responses of 8 tokens."""
    from pdsr_sdk import RolloutConfig

    return RolloutConfig(model=str(tiny_model_dir), batch_size=4, policy="v3", sampling={"n": 2, "max_tokens": 8},
                         over_provision=0.25, max_staleness=2,
                         engines=[{"name": "fast-0", "pool": "fast", "backend": "fakes:LoopEngine"},
                                  {"name": "heavy-0", "pool": "heavy", "backend": "fakes:LoopEngine"}], **kw)


def prompts():
    """Prompts without end, as a trainer's data loader over epochs gives them."""
    from pdsr_sdk.rollout.data import PromptRecord

    return (PromptRecord(f"q{i}", f"p{i}", [1, 2, 3 + i % 50]) for i in itertools.count())


def kept(session) -> dict[str, int]:
    stream = session._stream
    return {"records": len(stream.records), "consumed_at": len(stream.consumed_at),
            "launched_at": len(stream.launched_at), "sources": len(session._sources)}


def test_a_partial_rollout_session_keeps_the_same_between_step_10_and_step_40(tiny_model_dir):
    """The prompt iterator is given once and ``()`` afterwards (docs/sdk-partial.md): the session's step stream kept
    every step's record and each prompt's launch and consumption step, and the session each step's ``()`` behind the
    iterator, for good. It now holds the same after 40 steps as after 10, and each step's result still has its own
    record."""
    from pdsr_sdk import RolloutSession

    with RolloutSession(partial_config(tiny_model_dir)) as session:
        source = prompts()
        for step in range(40):
            out = session.step(source if step == 0 else ())
            assert out.record is not None and out.record.index == step
            if step == 9:
                at_10 = kept(session)
        at_40 = kept(session)
    assert at_40 == at_10 == {"records": 1, "consumed_at": 0, "launched_at": 0, "sources": 1}


def test_pdsr_rollout_lets_each_batchs_groups_go_once_they_are_written(tmp_path, tiny_model_dir):
    """``pdsr rollout`` kept every batch's result for its summary, groups and all: every sample's tokens and log-probs
    stayed in memory until the run ended, though each batch is on disk when the next starts. It keeps each batch's
    tally now: when the 40th batch starts, as many earlier groups are alive as when the 10th did (those of the batch
    before, at most); the summary counts them all."""
    import json

    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.run import run_rollout
    from watched_fakes import WatchedLoopEngine

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i}?"}) + "\n" for i in range(80)))
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", batch_size=2, sampling={"n": 2, "max_tokens": 4},
                        data={"path": str(data)}, output={"path": tmp_path / "o.parquet"},
                        engines=[{"name": "f0", "pool": "fast", "backend": "watched_fakes:WatchedLoopEngine",
                                  "max_model_len": 256}])
    WatchedLoopEngine.reset()
    summary = run_rollout(cfg)
    alive = WatchedLoopEngine.ALIVE
    assert len(alive) == 40 and summary.groups == 80 and summary.samples == 160 and len(summary.batches) == 40
    # (the batch before may be in hand still: 2 groups; all 78 earlier ones were alive)
    assert alive[39] == alive[9] <= 2, alive
