"""A deterministic fake engine on a virtual clock, for scheduler and policy tests.

Each running request produces one token every ``token_time`` seconds (no
batching effects). Token ``i`` of sample ``k`` of prompt ``p`` is a fixed
function of (p, k, i), so a sample that is moved or aborted and continued
elsewhere must end with exactly the ids of an uninterrupted run. A sample's
natural length (where it emits EOS) comes from ``lengths[(prompt_id, k)]``,
or its ``max_tokens`` when forced.
"""

from __future__ import annotations

import zlib

from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.dispatch.types import ABORT, LENGTH, STOP, EngineLoad
from pdsr_sdk.errors import EngineError
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.rollout.data import PromptRecord, build_groups
from workloads import LENGTHS


def token_at(prompt_id: str, sample_index: int, i: int) -> int:
    return zlib.crc32(f"{prompt_id}/{sample_index}/{i}".encode()) % 1000 + 3


class FakeEngine:
    counts_only = False

    def __init__(self, name: str, pool: str, clock, *, max_concurrency: int = 8, token_time: float = 0.01,
                 lengths: dict | None = None, segment_capacity_tokens: int = 8192):
        self.name, self.pool, self.clock = name, pool, clock
        self.max_concurrency = max_concurrency
        self.segment_capacity_tokens = segment_capacity_tokens
        self.kv_cache_tokens = None        # (the Engine protocol's: a fake reports no KV cache)
        self.token_time = token_time
        self.lengths = lengths or {}
        self.running: dict[str, dict] = {}
        self.submitted: list = []          # every SegmentRequest seen, in order
        self.max_running_seen = 0
        self.dead = False
        self.listener = None

    async def start(self) -> None:
        pass

    def bind(self, listener) -> "FakeEngine":
        self.listener = listener
        return self

    def natural_length(self, sample) -> int:
        if sample.forced:
            return sample.max_tokens
        return self.lengths.get((sample.group.prompt_id, sample.index), sample.max_tokens)

    def submit(self, req) -> None:
        assert not self.dead, f"submit to dead engine {self.name}"
        assert len(self.running) < self.max_concurrency, f"{self.name} over its concurrency"
        sample = req.sample
        start_pos = req.context_len - sample.prompt_len
        assert start_pos == sample.num_generated
        if req.context_ids is not None:
            assert req.context_ids[: sample.prompt_len] == sample.group.prompt_token_ids
            # the context must be exactly what an uninterrupted run would have produced
            expected = [token_at(sample.group.prompt_id, sample.index, i) for i in range(start_pos)]
            assert req.context_ids[sample.prompt_len:] == expected, "context is not the sample's own tokens"
        to_eos = self.natural_length(sample) - start_pos
        eos = not req.ignore_eos and to_eos <= req.max_tokens
        n = min(req.max_tokens, to_eos) if not req.ignore_eos else req.max_tokens
        entry = {"req": req, "start": self.clock.now(), "start_pos": start_pos, "n": n,
                 "reason": STOP if eos else LENGTH}
        entry["timer"] = self.clock.call_later(n * self.token_time, lambda rid=req.request_id: self._finish(rid))
        self.running[req.request_id] = entry
        self.submitted.append(req)
        self.max_running_seen = max(self.max_running_seen, len(self.running))

    def _emit(self, entry, n: int) -> None:
        req = entry["req"]
        s = req.sample
        ids = [token_at(s.group.prompt_id, s.index, entry["start_pos"] + i) for i in range(n)]
        if n:
            self.listener.on_tokens(self, req.request_id, n, ids, [-0.5] * n)

    def _finish(self, rid: str) -> None:
        entry = self.running.pop(rid, None)
        if entry is None:
            return
        self._emit(entry, entry["n"])
        self.listener.on_segment_end(self, rid, entry["reason"])

    def abort(self, rid: str) -> None:
        entry = self.running.get(rid)
        if entry is None:
            return
        # the abort lands a moment later, as with a real engine
        self.clock.call_later(0.0, lambda: self._abort(rid))

    def _abort(self, rid: str) -> None:
        entry = self.running.pop(rid, None)
        if entry is None:
            return
        entry["timer"].cancel()
        done = min(entry["n"], int((self.clock.now() - entry["start"]) / self.token_time + 1e-9))
        self._emit(entry, done)
        self.listener.on_segment_end(self, rid, ABORT)

    def kill(self) -> None:
        self.dead = True
        for entry in self.running.values():
            entry["timer"].cancel()
        self.running.clear()
        self.listener.on_engine_dead(self, EngineError(self.name, "killed by the test", exit_status=-9,
                                                       remote_traceback="Traceback: boom"))

    def load(self) -> EngineLoad:
        return EngineLoad(running=len(self.running))

    async def close(self) -> None:
        pass


class StartupEngine(FakeEngine):
    """A FakeEngine built from an EngineSpec whose start takes a while, or fails when
    ``engine_args['fail']`` is set; ``LOG`` records (event, name) for start/close."""

    LOG: list[tuple[str, str]] = []

    @classmethod
    def from_spec(cls, spec, **_):
        engine = cls(spec.name, spec.pool, None, max_concurrency=spec.max_num_seqs)
        engine.fail = bool(spec.engine_args.get("fail"))
        return engine

    async def start(self) -> None:
        import asyncio

        self.LOG.append(("begin", self.name))
        await asyncio.sleep(0.05)
        if self.fail:
            raise EngineError(self.name, "failed to start: the test says so")
        self.LOG.append(("ready", self.name))

    async def close(self) -> None:
        self.LOG.append(("close", self.name))


class LoopEngine(FakeEngine):
    """A FakeEngine on the running event loop's clock, built from an EngineSpec (backend
    ``fakes:LoopEngine``): a whole ``pdsr rollout`` without vLLM. Responses run to max_tokens."""

    @classmethod
    def from_spec(cls, spec, **_):
        import asyncio

        from pdsr_sdk.dispatch.clock import LoopClock

        engine = cls(spec.name, spec.pool, LoopClock(asyncio.get_running_loop()), max_concurrency=spec.max_num_seqs,
                     token_time=0.0002)
        engine.spec = spec
        return engine


# One batch of a controlled workload through a policy on fake engines: the scheduler's and the
# policies' tests share it.

def records(lengths=LENGTHS):
    return [PromptRecord(pid, f"prompt {pid}", [1, 2, 3 + i], target_lengths=list(ls))
            for i, (pid, ls) in enumerate(lengths.items())]


def run_fakes(policy, settings=None, *, fast=1, heavy=1, conc=4, token_time=0.01, lengths=LENGTHS, seg=None,
              natural=None, sampling=None, before=None, until=None):
    """Run ``lengths`` (forced, per prompt) through ``policy`` on ``fast`` + ``heavy`` fake engines in virtual
    time; ``before(clock, engines, sched)`` runs first. Returns groups, scheduler, engines, done, fatal."""
    clock = VirtualClock()
    engines = [FakeEngine(f"fast-{i}", "fast", clock, max_concurrency=conc, token_time=token_time,
                          lengths=natural) for i in range(fast)]
    engines += [FakeEngine(f"heavy-{i}", "heavy", clock, max_concurrency=conc, token_time=token_time,
                           lengths=natural) for i in range(heavy)]
    cls = POLICIES.get(policy)
    cfg = cls.config_model(**(settings or {}))
    fatal = []
    dispatch = DispatchRun(engines, cls, cfg, clock, sampling or SamplingConfig(n=4, max_tokens=1000),
                           seg or SegmentConfig(min_tokens=16, max_tokens=64), on_fatal=fatal.append)
    sched = dispatch.scheduler
    groups = build_groups(records(lengths), len(next(iter(lengths.values()))), 1000)
    done = []
    if before:
        before(clock, engines, sched)
    dispatch.start_batch(groups, lambda: done.append(clock.now()))
    clock.run(until=lambda: bool(done) or bool(fatal) or (until and until()))
    return groups, sched, engines, done, fatal


def by_key(groups):
    return {(g.prompt_id, s.index): s for g in groups for s in g.samples}


def assert_complete(groups, lengths=LENGTHS, truncated=None):
    truncated = truncated or {}
    for g in groups:
        assert len(g.samples) == len(lengths[g.prompt_id])
        for s in g.samples:
            assert s.finished, s.key
            want = truncated.get((g.prompt_id, s.index), lengths[g.prompt_id][s.index])
            assert s.num_generated == want, s.key
            assert s.token_ids == [token_at(g.prompt_id, s.index, i) for i in range(want)], s.key
            assert len(s.logprobs) == want
            assert sum(seg.num_tokens for seg in s.segments) - s.wasted_tokens == want
