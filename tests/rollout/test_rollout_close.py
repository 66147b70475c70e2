"""A run's end (finished, failed or interrupted) writes no group the engines' shutdown completes: such a write asked
the closed session for its rewards, and the run ended logging 'Task exception was never retrieved ... RunError'."""

from __future__ import annotations

import asyncio
import json

from pdsr_sdk.config import load_config
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession


def test_a_group_completed_while_the_session_closes_is_not_written(tmp_path, tiny_model_dir, monkeypatch):
    from pdsr_sdk.rollout.run import run_rollout_async

    groups, asked_closed = [], []
    real_start, real_close, real_scores = RolloutSession.start, RolloutSession.close, RolloutSession.scores

    async def start(self, *args, **kwargs):
        await real_start(self, *args, **kwargs)
        self.hooks.on_group_done.append(groups.append)

    async def close(self):
        for hook in list(self.hooks.on_group_done):   # the shutdown completes a group (as aborted samples return)
            hook(groups[0])
        await real_close(self)
        for _ in range(5):   # let any write task created above run
            await asyncio.sleep(0)

    async def scores(self, samples):
        if self.rewards is None:
            asked_closed.append(True)
        return await real_scores(self, samples)

    monkeypatch.setattr(RolloutSession, "start", start)
    monkeypatch.setattr(RolloutSession, "close", close)
    monkeypatch.setattr(RolloutSession, "scores", scores)
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(json.dumps({
        "model": str(tiny_model_dir), "policy": "baseline", "sampling": {"n": 2, "max_tokens": 8}, "batch_size": 2,
        "output": {"path": str(tmp_path / "o.parquet")}, "data": {"limit": 2},
        "engines": [{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine", "max_model_len": 256}]}))
    summary = asyncio.run(run_rollout_async(load_config(RolloutConfig, cfg_file, {})))
    assert groups and summary.groups == 2
    assert not asked_closed
