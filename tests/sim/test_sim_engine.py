"""SimEngine (event-driven, closed forms) against its naive token-by-token twin, and the cost kernels."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.types import ABORT, LENGTH, Group, Sample, SegmentRequest
from pdsr_sdk.errors import EngineError
from pdsr_sdk.sim import cost
from pdsr_sdk.sim.config import EngineProfile
from pdsr_sdk.sim.engine import SimEngine
from pdsr_sdk.sim.naive import NaiveJob, naive_replay


class Harness:
    """Drives one SimEngine with a NaiveJob script on a VirtualClock (continuations resubmitted at once)."""

    def __init__(self, profile: EngineProfile, jobs: list[NaiveJob]):
        self.clock = VirtualClock()
        self.engine = SimEngine("e0", "fast", profile, self.clock).bind(self)
        self.jobs = jobs
        self.out = {job.key: [] for job in jobs}
        self.speculation: dict[str, list[tuple[int, int]]] = {}   # per job key, (drafted, accepted) per span
        self.samples = []
        for job in jobs:
            sibs = max(job.finished_siblings or [0])
            g = Group(prompt_id=job.prompt or job.key, prompt_token_ids=[], prompt_text="", n=1 + sibs,
                      prompt_length=job.prompt_len)
            s = Sample(group=g, index=0, max_tokens=sum(job.segments), forced=True)
            # siblings that finish as the script says before each segment (what speculation's joint table reads)
            g.samples = [s] + [Sample(group=g, index=i + 1, max_tokens=1) for i in range(sibs)]
            self.samples.append(s)
        self.current: dict[int, str] = {}
        self.rid_job: dict[str, tuple[int, int]] = {}
        self.seg_tokens: dict[str, int] = {}
        self.first_tokens: dict[str, list[float | None]] = {}
        for j, job in enumerate(jobs):
            self.clock.call_at(job.arrival_s, lambda j=j: self.submit(j, 0))
            if job.abort_s is not None:
                self.clock.call_at(job.abort_s, lambda j=j: self.abort(j))

    def submit(self, j: int, seg: int) -> None:
        s = self.samples[j]
        finished = self.jobs[j].finished_siblings
        for i, sib in enumerate(s.group.samples[1:]):
            sib.finish_reason = "stop" if finished and i < finished[seg] else None
        rid = f"{self.jobs[j].key}#{seg}"
        self.current[j] = rid
        self.rid_job[rid] = (j, seg)
        self.seg_tokens[rid] = 0
        self.engine.submit(SegmentRequest(rid, None, s.prompt_len + s.num_generated, self.jobs[j].segments[seg],
                                          True, None, s))

    def abort(self, j: int) -> None:
        rid = self.current.get(j)
        if rid is not None:
            self.engine.abort(rid)

    # EngineListener
    def on_tokens(self, engine, rid, n, ids, lps, *, first_token_time_s=None):
        assert ids is None and lps is None
        j, _ = self.rid_job[rid]
        self.first_tokens.setdefault(self.jobs[j].key, []).append(first_token_time_s)
        self.samples[j].num_generated += n
        self.seg_tokens[rid] += n

    def on_segment_end(self, engine, rid, reason, *, speculation=None):
        j, seg = self.rid_job[rid]
        self.out[self.jobs[j].key].append((reason, self.clock.now(), self.seg_tokens[rid]))
        if speculation is not None:
            self.speculation.setdefault(self.jobs[j].key, []).append(speculation)
        if reason == LENGTH and seg + 1 < len(self.jobs[j].segments):
            self.submit(j, seg + 1)
        else:
            self.current.pop(j, None)

    def on_engine_dead(self, engine, error):  # pragma: no cover - the simulator does not die
        raise AssertionError(error)

    def run(self):
        self.clock.run()
        return self.out


def random_case(seed: int):
    rng = random.Random(seed)
    n_jobs = rng.randint(1, 12)
    prompts = {f"p{i}": rng.randint(1, 60) for i in range(3)}   # some jobs share a prompt (a group's samples)
    jobs = []
    for j in range(n_jobs):
        segs = [rng.randint(1, 40) for _ in range(rng.randint(1, 3))]
        abort = rng.uniform(0.0, 1.5) if rng.random() < 0.3 else None
        arrival = 0.0 if rng.random() < 0.3 else rng.uniform(0.0, 0.5)
        prompt = rng.choice(list(prompts)) if rng.random() < 0.5 else None
        plen = prompts[prompt] if prompt else rng.randint(1, 60)
        jobs.append(NaiveJob(f"j{j}", arrival, plen, segs, abort, prompt))
    longest = max(j.prompt_len + sum(j.segments) for j in jobs)
    block = rng.choice([1, 4, 16])
    kv = max(longest + block, rng.randint(longest, 3 * longest))
    # speculative decoding in a third of the cases: drafting only while few run, verify costs by batch size
    spec = ({"tokens_per_step": rng.uniform(1.0, 3.0), "max_batch": rng.randint(0, 6), "draft_load": rng.random(),
             "verify_cost": [(1, rng.uniform(1.0, 1.3)), (4, rng.uniform(1.1, 1.6))],
             "num_speculative_tokens": rng.randint(1, 8)} if rng.random() < 0.33 else None)
    if spec is not None and rng.random() < 0.5:   # acceptance along the response, in bins of 4-16 tokens
        width = rng.choice([4, 8, 16])
        spec["by_position"] = [(i * width, rng.uniform(1.0, 3.0), rng.random()) for i in range(rng.randint(1, 5))]
        if rng.random() < 0.5:   # and by finished siblings, some cells missing (those take the position's row)
            spec["by_position_and_siblings"] = [(p, f, rng.uniform(1.0, 3.0), rng.random())
                                                for p, _, _ in spec["by_position"] for f in range(3)
                                                if rng.random() < 0.7]
            for job in jobs:
                job.finished_siblings = [rng.randint(0, 3) for _ in job.segments]
    profile = EngineProfile(max_num_seqs=rng.randint(1, 6), kv_cache_tokens=kv, block_size=block,
                            prompt_cache=rng.random() < 0.8, speculation=spec,
                            max_model_len=4096, c0_s=1e-3 * rng.uniform(0.5, 2), c1_s_per_seq=2e-4 * rng.random(),
                            c2_s_per_token=1e-5 * rng.random(), prefill_s_per_token=3e-5 * rng.random())
    return profile, jobs


def assert_same(event, naive):
    assert event.keys() == naive.keys()
    for key in naive:
        assert len(event[key]) == len(naive[key]), (key, event[key], naive[key])
        for (r1, t1, n1), (r2, t2, n2) in zip(event[key], naive[key]):
            assert (r1, n1) == (r2, n2), (key, event[key], naive[key])
            assert abs(t1 - t2) <= 1e-9, (key, t1, t2)


@pytest.mark.parametrize("seed", range(1000))   # a mid-step abort mismatch first showed at seed 948
def test_engine_matches_the_naive_twin(seed):
    profile, jobs = random_case(seed)
    h = Harness(profile, jobs)
    firsts: dict[str, list[float | None]] = {}
    counts: dict[str, list[tuple[int, int]]] = {}
    assert_same(h.run(), naive_replay(profile, jobs, firsts, counts))
    # with speculation, each span reports its drafted and accepted tokens, summed step by step by the twin
    assert h.speculation == (counts if profile.speculation is not None else {})
    # each span's first token: the end of the step that admitted (and prefilled) it, as a stream would show it
    assert h.first_tokens.keys() == firsts.keys()
    for key, times in firsts.items():
        assert len(h.first_tokens[key]) == len(times), key
        for got, want in zip(h.first_tokens[key], times):
            assert got is not None and abs(got - want) <= 1e-9, (key, got, want)


def test_preemption_under_a_small_kv_budget_matches_the_twin_and_recomputes():
    # 4 requests of prompt 10 + 30 tokens on a 64-token cache in blocks of 4: they cannot all grow
    profile = EngineProfile(max_num_seqs=4, kv_cache_tokens=64, block_size=4, c0_s=1e-3, c1_s_per_seq=1e-4,
                            c2_s_per_token=1e-5, prefill_s_per_token=1e-4)
    jobs = [NaiveJob(f"j{i}", 0.0, 10, [30]) for i in range(4)]
    h = Harness(profile, jobs)
    out = h.run()
    assert_same(out, naive_replay(profile, jobs))
    assert h.engine.preemptions > 0
    # every preemption re-prefills the victim's whole context: more prefill than the 4 prompts
    assert h.engine.prefill_tokens > 4 * 10
    assert all(ev == [("length", ev[0][1], 30)] for ev in out.values())
    # the oldest request is never preempted: it finishes first, after exactly 30 steps
    assert out["j0"][0][1] == min(ev[0][1] for ev in out.values())


def test_two_requests_closed_form_by_hand():
    # one engine, no prefill: R=2, contexts 5 and 7 -> step j costs c0 + 2 c1 + c2 (12 + 2j)
    profile = EngineProfile(max_num_seqs=8, c0_s=0.01, c1_s_per_seq=0.001, c2_s_per_token=0.0001,
                            prefill_s_per_token=0.0)
    jobs = [NaiveJob("a", 0.0, 5, [3]), NaiveJob("b", 0.0, 7, [5])]
    out = Harness(profile, jobs).run()
    a = sum(0.01 + 0.002 + 0.0001 * (12 + 2 * j) for j in range(3))
    # then b alone with context 10: c0 + c1 + c2 (10 + j), 2 steps
    b = a + sum(0.01 + 0.001 + 0.0001 * (10 + j) for j in range(2))
    assert out["a"] == [("length", pytest.approx(a, abs=1e-12), 3)]
    assert out["b"] == [("length", pytest.approx(b, abs=1e-12), 5)]


def test_abort_mid_segment_reports_completed_steps_then_abort_after_zero_delay():
    profile = EngineProfile(max_num_seqs=4, c0_s=0.01, c1_s_per_seq=0.0, c2_s_per_token=0.0,
                            prefill_s_per_token=0.0)
    jobs = [NaiveJob("a", 0.0, 4, [100], abort_s=0.255), NaiveJob("b", 0.0, 4, [50])]
    h = Harness(profile, jobs)
    out = h.run()
    # 10 ms steps: by 0.255 s, 25 steps are done; the abort is reported at 0.255 (0-delay timer)
    assert out["a"] == [(ABORT, 0.255, 25)]
    # a leaves at the next boundary (0.26); b goes on alone and ends at step 50
    assert out["b"] == [(LENGTH, pytest.approx(0.50, abs=1e-12), 50)]
    assert_same(out, naive_replay(profile, jobs))
    assert h.engine.tokens == 75


def test_an_abort_after_a_submit_mid_step_throws_the_step_in_flight_away():
    # b's submit at 0.102 plans the next epoch from the end of the step in flight (0.11); a's abort at 0.105
    # comes before that step ends, so a keeps the 10 tokens of the steps done by then (the twin's seed 948)
    profile = EngineProfile(max_num_seqs=4, c0_s=0.01, c1_s_per_seq=0.0, c2_s_per_token=0.0,
                            prefill_s_per_token=0.0)
    jobs = [NaiveJob("a", 0.0, 4, [100], abort_s=0.105), NaiveJob("b", 0.102, 4, [20])]
    out = Harness(profile, jobs).run()
    assert out["a"] == [(ABORT, 0.105, 10)]
    assert_same(out, naive_replay(profile, jobs))


def test_abort_is_not_reported_synchronously():
    clock = VirtualClock()
    calls = []

    class L:
        def on_tokens(self, *a, **_):
            calls.append("tokens")

        def on_segment_end(self, *a):
            calls.append("end")

    e = SimEngine("e", "fast", EngineProfile(), clock).bind(L())
    g = Group("p", [], "", 1, prompt_length=3)
    s = Sample(group=g, index=0, max_tokens=10, forced=True)
    e.submit(SegmentRequest("r", None, 3, 10, True, None, s))
    clock.step()                         # the engine starts
    e.abort("r")
    assert calls == []
    clock.run()
    assert calls == ["end"]              # no step had completed: nothing to report but the abort


def test_continuation_on_the_same_engine_prefills_only_the_uncached_tail():
    profile = EngineProfile(max_num_seqs=2, block_size=16, prefill_s_per_token=1e-3)
    jobs = [NaiveJob("a", 0.0, 100, [20, 20, 20])]
    h = Harness(profile, jobs)
    assert_same(h.run(), naive_replay(profile, jobs))
    # first segment prefills 100; continuations at contexts 120 and 140 reuse 112 and 128 cached tokens
    assert h.engine.prefill_tokens == 100 + (120 - 112) + (140 - 128)


@pytest.mark.parametrize("prompt_cache", [True, False])
def test_samples_of_one_prompt_share_its_whole_blocks_while_one_runs(prompt_cache):
    profile = EngineProfile(max_num_seqs=4, block_size=16, prefill_s_per_token=1e-3, prompt_cache=prompt_cache)
    jobs = [NaiveJob("a", 0.0, 100, [20], prompt="p"), NaiveJob("b", 0.0, 100, [30], prompt="p"),
            NaiveJob("c", 0.0, 100, [20], prompt="q"),          # another prompt of the same length
            NaiveJob("d", 0.5, 100, [20], prompt="p")]          # arrives after a and b have left
    h = Harness(profile, jobs)
    out = h.run()
    assert_same(out, naive_replay(profile, jobs))
    assert out["b"][0][1] < 0.5 < out["d"][0][1]                # d starts when no request of p runs
    # b (admitted with a, in the same step) finds p's 96 whole-block tokens cached; c and d pay in full
    assert h.engine.prefill_tokens == (100 + 4 + 100 + 100 if prompt_cache else 400)


def test_a_request_longer_than_the_cache_is_refused():
    clock = VirtualClock()
    e = SimEngine("e", "fast", EngineProfile(kv_cache_tokens=64, block_size=16, max_model_len=4096), clock)
    g = Group("p", [], "", 1, prompt_length=40)
    s = Sample(group=g, index=0, max_tokens=100, forced=True)
    with pytest.raises(EngineError, match="at most 64"):
        e.submit(SegmentRequest("r", None, 40, 100, True, None, s))


# -- cost kernels against their naive twins ---------------------------------------------

@pytest.mark.parametrize("k,a,b,extra", [(0, 1.0, 0.5, 0.0), (1, 0.01, 0.0, 0.2), (7, 0.013, 1e-5, 0.004),
                                         (1000, 5e-3, 2.56e-5, 0.0)])
def test_steps_time_matches_a_loop(k, a, b, extra):
    assert cost.steps_time(k, a, b, extra) == pytest.approx(cost.steps_time_naive(k, a, b, extra), rel=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_steps_within_is_the_inverse_of_steps_time(seed):
    rng = np.random.default_rng(seed)
    a, b, extra = rng.uniform(1e-3, 1e-2), rng.choice([0.0, rng.uniform(0, 1e-4)]), rng.uniform(0, 1e-2)
    dt = rng.uniform(0, 3.0)
    k = cost.steps_within(dt, a, b, extra)
    assert cost.steps_time(k, a, b, extra) <= dt < cost.steps_time(k + 1, a, b, extra)
    assert k == cost.steps_within_naive(dt, a, b, extra)


@pytest.mark.parametrize("seed", range(40))
def test_overflow_step_matches_a_step_by_step_count(seed):
    rng = np.random.default_rng(seed)
    block = int(rng.choice([1, 4, 16]))
    step0 = int(rng.integers(0, 100))
    offsets = [int(x) for x in rng.integers(-step0 + 1, 300, size=int(rng.integers(1, 9)))]
    counts = [0] * block
    for o in offsets:
        counts[o % block] += 1
    free = int(rng.integers(0, 40))
    assert cost.overflow_step(free, counts, step0, block) == cost.overflow_step_naive(free, offsets, step0, block)


@pytest.mark.parametrize("block", [None, 1, 4, 16])
def test_work_and_alone_time_match_loops(block):
    rng = np.random.default_rng(0)
    p, n = rng.integers(0, 300, 50), rng.integers(1, 500, 50)
    p[:4] = [0, 1, 16, 32]      # empty, one token, prompts of whole blocks (the last block is recomputed)
    first = rng.random(50) < 0.3
    q = cost.least_prefill(p, first, block)
    np.testing.assert_array_equal(q, cost.least_prefill_naive(p, first, block))
    assert (q <= p).all() and (q[first] == p[first]).all()
    kw = dict(c0=5e-3, c1=5e-5, c2=1e-7, prefill=2e-5)
    for least in (None, q):
        np.testing.assert_allclose(cost.sample_work(p, n, max_seqs=64, prefill_len=least, **kw),
                                   cost.sample_work_naive(p, n, max_seqs=64, prefill_len=least, **kw), rtol=1e-12)
        np.testing.assert_allclose(cost.alone_time(p, n, prefill_len=least, **kw),
                                   cost.alone_time_naive(p, n, prefill_len=least, **kw), rtol=1e-12)
    assert math.isclose(cost.alone_time([10], [1], **kw)[0], 2e-5 * 10 + 5e-3 + 5e-5 + 1e-7 * 10)


@pytest.mark.parametrize("abort_s,reset,prefill", [
    (0.255, False, 100 + (125 - 112)),   # 25 tokens: whole blocks of the 124 computed tokens (112) stay cached
    (0.255, True, 100 + 125),            # reset_prefix_cache (a weight update): the whole context again
    (0.005, False, 100 + 100),           # aborted before its first step ran: nothing computed, nothing cached
])
def test_an_aborted_sample_continues_from_its_cached_blocks_unless_the_cache_was_reset(abort_s, reset, prefill):
    """vLLM keeps an aborted request's computed blocks in its prefix cache: the sample's next segment on the
    same engine prefills only the uncached tail (the last sampled token has no KV yet), unless the cache was
    reset in between (kv_on_update: recompute)."""
    clock = VirtualClock()
    profile = EngineProfile(max_num_seqs=2, block_size=16, c0_s=0.01, c1_s_per_seq=0.0, c2_s_per_token=0.0,
                            prefill_s_per_token=0.0)
    g = Group("p", [], "", 1, prompt_length=100)
    s = Sample(group=g, index=0, max_tokens=100, forced=True)
    ends = []

    class L:
        def on_tokens(self, engine, rid, n, *a, **_):
            s.num_generated += n

        def on_segment_end(self, engine, rid, reason):
            ends.append(reason)

    e = SimEngine("e", "fast", profile, clock).bind(L())
    e.submit(SegmentRequest("r0", None, 100, 100, True, None, s))
    clock.call_at(abort_s, lambda: e.abort("r0"))
    clock.run()
    done = int(abort_s / 0.01)
    assert ends == [ABORT] and s.num_generated == done
    if reset:
        e.reset_prefix_cache()
    e.submit(SegmentRequest("r1", None, 100 + done, 100 - done, True, None, s))
    clock.run()
    assert ends == [ABORT, LENGTH] and s.num_generated == 100
    assert e.prefill_tokens == prefill


@pytest.mark.parametrize("running, g, table, max_batch", [
    (1, 2.0, [(1, 1.08), (8, 1.15)], 32), (4, 1.5, [(1, 1.08), (8, 1.15)], 32), (8, 3.0, [(1, 1.08), (8, 1.15)], 8),
    (9, 3.0, [(1, 1.08), (8, 1.15)], 8), (100, 2.0, [(1, 1.0), (32, 1.2), (128, 1.4)], 256),
    (300, 2.0, [(1, 1.0), (32, 1.2), (128, 1.4)], 512), (5, 1.0, [(1, 1.1)], 32), (0, 2.0, [(2, 1.1), (4, 1.3)], 8),
])
@pytest.mark.parametrize("load", [1.0, 0.3, 0.0])
def test_speculation_scale_matches_its_twin(running, g, table, max_batch, load):
    assert cost.speculation_scale(running, g, table, max_batch, load) == pytest.approx(
        cost.speculation_scale_naive(running, g, table, max_batch, load), rel=1e-12)


def test_a_light_draft_pays_a_light_share_of_the_verify_cost():
    """A step that carries a tenth of a full draft costs a tenth of the full draft's extra: 1 + 0.1 x 0.2."""
    assert cost.speculation_scale(4, 1.05, [(1, 1.2)], 32, 0.1) == pytest.approx(1.02 / 1.05)
    assert cost.speculation_scale(4, 1.05, [(1, 1.2)], 32) == pytest.approx(1.2 / 1.05)   # every step drafts k


def test_speculation_halves_a_lone_requests_time_when_a_verify_step_costs_a_decode_step():
    """Two tokens a step for the price of one (verify factor 1): 100 tokens take 50 steps' time; with more
    requests running than max_batch, nothing changes."""
    base = dict(max_num_seqs=8, c0_s=0.01, c1_s_per_seq=0.0, c2_s_per_token=0.0, prefill_s_per_token=0.0)
    spec = {"tokens_per_step": 2.0, "verify_cost": [(1, 1.0)], "max_batch": 1}
    plain = Harness(EngineProfile(**base), [NaiveJob("a", 0.0, 4, [100])]).run()
    fast = Harness(EngineProfile(**base, speculation=spec), [NaiveJob("a", 0.0, 4, [100])]).run()
    assert plain["a"][0][1] == pytest.approx(1.0) and fast["a"][0][1] == pytest.approx(0.5)
    two = Harness(EngineProfile(**base, speculation=spec), [NaiveJob(k, 0.0, 4, [100]) for k in "ab"])
    assert two.run()["a"][0][1] == pytest.approx(1.0) and two.engine.drafted_tokens == 0
    one = Harness(EngineProfile(**base, speculation=spec), [NaiveJob("a", 0.0, 4, [100])])
    one.run()
    assert one.engine.drafted_tokens == 100
