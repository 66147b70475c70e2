"""What the tests of engines in Ray actors share (tests/engines/test_ray_engine_*.py, test_ray_killed_actors.py;
their fixtures: tests/engines/conftest.py): markers, a listener that keeps what an engine reports, a greedy
request, the replay run's config and the check of its samples against the local greedy reference."""

from __future__ import annotations

import asyncio
import time

import pytest

from support import WAIT_S, requires_ray, requires_vllm
from pdsr_sdk.config import load_config
from pdsr_sdk.rollout.config import EngineSpec, RolloutConfig
from workloads import LENGTHS


def ray_test(fn):
    """Needs Ray (the session's local cluster: tests/engines/conftest.py's ``ray_cluster``)."""
    return pytest.mark.ray(requires_ray(fn))


def engine_test(fn):
    """Needs Ray and vLLM: CPU vLLM engines in Ray actors (slow: they start in a minute or more)."""
    return pytest.mark.slow(pytest.mark.vllm(requires_vllm(ray_test(fn))))


def spec(name="e", pool="fast", **kw) -> EngineSpec:
    return EngineSpec(name=name, pool=pool, **kw)


class Collector:
    """An EngineListener that keeps what one engine reports."""

    def __init__(self):
        self.tokens: dict[str, list[int]] = {}
        self.logprobs: dict[str, list[float]] = {}
        self.ends: dict[str, str] = {}
        self.dead: list[Exception] = []
        self.changed = asyncio.Event()

    def on_tokens(self, engine, rid, n, ids, lps):
        assert n == len(ids) and (lps is None or len(lps) == n)
        self.tokens.setdefault(rid, []).extend(ids)
        self.logprobs.setdefault(rid, []).extend(lps or [])
        self.changed.set()

    def on_segment_end(self, engine, rid, reason):
        assert rid not in self.ends, f"{rid} ended twice"
        self.ends[rid] = reason
        self.changed.set()

    def on_engine_dead(self, engine, error):
        self.dead.append(error)
        self.changed.set()

    async def wait(self, cond, timeout=WAIT_S):
        end = time.monotonic() + timeout
        while not cond():
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), max(0.01, end - time.monotonic()))


def greedy_request(rid, ids, max_tokens):
    """A segment of ``max_tokens`` greedy tokens (EOS ignored) after ``ids``."""
    from pdsr_sdk.dispatch.types import SegmentRequest
    from pdsr_sdk.rollout.config import SamplingConfig

    return SegmentRequest(request_id=rid, context_ids=ids, context_len=len(ids), max_tokens=max_tokens,
                          ignore_eos=True, sampling=SamplingConfig(temperature=0.0), sample=None)


async def greedy_continuations(engines, tag: str, prompt: list[int], max_tokens: int) -> list[list[int]]:
    """Each of ``engines``' greedy continuation of ``prompt`` (``max_tokens`` tokens, EOS ignored), in their order:
    each engine is bound to a listener of its own for it (outside a session, or between a baseline session's
    steps)."""
    col = Collector()
    for e in engines:
        e.bind(col)
        e.submit(greedy_request(f"{tag}-{e.name}", prompt, max_tokens))
    await col.wait(lambda: len(col.ends) == len(engines))
    return [col.tokens[f"{tag}-{e.name}"] for e in engines]


def replay_config(tiny_model_dir, data, out, policy, **over) -> RolloutConfig:
    """A greedy run of the replay prompts (workloads.LENGTHS: 5 prompts x 4 samples of forced lengths)."""
    overrides = {
        "model": str(tiny_model_dir), "data.path": str(data), "data.target_lengths_column": "lengths",
        "sampling.ignore_eos": True, "sampling.n": 4, "sampling.max_tokens": 256, "sampling.temperature": 0.0,
        "batch_size": 5, "policy.name": policy, "output.path": str(out),
        "segments.min_tokens": 16, "segments.max_tokens": 64, **over,
    }
    return load_config(RolloutConfig, None, overrides)


def check_samples(rows, reference):
    """B x N samples, the forced lengths, and token ids equal to the local greedy reference."""
    assert sorted((r["prompt_id"], r["sample_index"]) for r in rows) == sorted(
        (p, i) for p in LENGTHS for i in range(4))
    for r in rows:
        want = LENGTHS[r["prompt_id"]][r["sample_index"]]
        assert r["response_length"] == len(r["response_token_ids"]) == len(r["response_logprobs"]) == want
        key = (r["prompt_id"], r["sample_index"])
        assert r["response_token_ids"] == reference["tokens"][r["prompt_id"]][:want], key

