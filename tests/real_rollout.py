"""Shared by the real-engine rollout tests: a ``run_rollout`` on the session's engines with forced lengths."""

from __future__ import annotations

import pyarrow.parquet as pq

from support import run_on
from pdsr_sdk.config import load_config
from pdsr_sdk.rollout.config import RolloutConfig


def rollout(engine_loop, engines, tiny_model_dir, tmp_path, data, policy, settings=None, progress=None, **over):
    """``progress``: a progress factory for the run (default silent), e.g. a :class:`Bars`."""
    from pdsr_sdk.rollout.run import run_rollout_async

    overrides = {
        "model": str(tiny_model_dir), "data.path": str(data), "data.target_lengths_column": "lengths",
        "sampling.ignore_eos": True, "sampling.n": 4, "sampling.max_tokens": 256, "batch_size": 5,
        "policy": policy, "output.path": str(tmp_path / f"{policy}.parquet"),
        "segments.min_tokens": 16, "segments.max_tokens": 64,
        **over,
    }
    cfg = load_config(RolloutConfig, None, overrides, base={"policy_settings": {policy: settings or {}}})
    bars = {"progress": progress} if progress is not None else {}
    summary = run_on(engine_loop, run_rollout_async(cfg, engines=engines, **bars))
    return summary, pq.read_table(cfg.output.path).to_pylist()


def by_key(rows):
    return {(r["prompt_id"], r["sample_index"]): r for r in rows}


class Bars:
    """A progress factory that records each bar: ``bars[desc]`` is ``[total, count]``."""

    def __init__(self):
        self.bars: dict[str, list] = {}

    def __call__(self, desc="", total=None, unit="it"):
        bars, record = self.bars, [total, 0]
        bars[desc] = record

        class Bar:
            def update(self, n=1):
                record[1] += n

            def set_postfix_str(self, s="", refresh=True):
                pass

            def close(self):
                pass

        return Bar()

