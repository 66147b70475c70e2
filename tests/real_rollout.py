"""Shared by the real-engine rollout tests: a ``run_rollout`` on the session's engines with forced lengths."""

from __future__ import annotations

import pyarrow.parquet as pq

from support import run_on
from pdsr_sdk.config import load_config
from pdsr_sdk.rollout.config import RolloutConfig


def rollout(engine_loop, engines, tiny_model_dir, tmp_path, data, policy, settings=None, **over):
    from pdsr_sdk.rollout.run import run_rollout_async

    overrides = {
        "model": str(tiny_model_dir), "data.path": str(data), "data.target_lengths_column": "lengths",
        "sampling.ignore_eos": True, "sampling.n": 4, "sampling.max_tokens": 256, "batch_size": 5,
        "policy": policy, "output.path": str(tmp_path / f"{policy}.parquet"),
        "segments.min_tokens": 16, "segments.max_tokens": 64,
        **over,
    }
    cfg = load_config(RolloutConfig, None, overrides, base={"policy_settings": {policy: settings or {}}})
    summary = run_on(engine_loop, run_rollout_async(cfg, engines=engines))
    return summary, pq.read_table(cfg.output.path).to_pylist()


def by_key(rows):
    return {(r["prompt_id"], r["sample_index"]): r for r in rows}
