"""Pausing a running step for a weight update (``session.pause`` / ``resume``) and freeing engine memory
(``session.sleep`` / ``wake``): the scheduler on fake engines (every mode, every policy), then a
session on real CPU vLLM engines (every sample and its tokens kept; greedy tokens equal an
uninterrupted run's; segments after the update carry the new version; sleep says plainly that the
CPU build cannot free memory)."""

from __future__ import annotations

import asyncio

import pytest

from conftest import requires_vllm, run_on
from fakes import FakeEngine, token_at
from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.errors import PdsrError
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.rollout.data import PromptRecord, build_groups
from workloads import LENGTHS

PAUSE_AT, RESUME_AT = 0.3, 0.8


def fake_run(policy, mode, *, pause_at=PAUSE_AT, resume_at=RESUME_AT):
    """One batch of LENGTHS on fake engines (1 fast, 1 heavy, 3 slots each); paused at ``pause_at``,
    policy version 1 and resumed at ``resume_at``. Returns what the test checks."""
    clock = VirtualClock()
    engines = [FakeEngine("fast-0", "fast", clock, max_concurrency=3), FakeEngine("heavy-0", "heavy", clock,
                                                                                  max_concurrency=3)]
    cls = POLICIES.get(policy)
    fatal = []
    dispatch = DispatchRun(engines, cls, cls.config_model(), clock, SamplingConfig(n=4, max_tokens=1000),
                           SegmentConfig(min_tokens=16, max_tokens=64), on_fatal=fatal.append)
    sched = dispatch.scheduler
    records = [PromptRecord(pid, pid, [1, 2, 3 + i], target_lengths=list(ls)) for i, (pid, ls) in
               enumerate(LENGTHS.items())]
    groups = build_groups(records, 4, 1000)
    seen = {}

    def pause():
        seen["running"] = set(sched.running())
        seen["finished"] = {s for g in groups for s in g.samples if s.finished}
        seen["submitted"] = sum(len(e.submitted) for e in engines)
        sched.pause(mode, on_drained=lambda: seen.setdefault("drained", clock.now()))

    def resume():
        seen["in_flight"] = sched.in_flight
        seen["held"] = set(sched.held())
        seen["submitted_while_paused"] = [r for e in engines for r in e.submitted[:]][seen["submitted"]:]
        sched.policy_version = 1
        sched.resume()

    clock.call_later(pause_at, pause)
    clock.call_later(resume_at, resume)
    done = []
    dispatch.start_batch(groups, lambda: done.append(clock.now()))
    clock.run(until=lambda: bool(done) or bool(fatal))
    assert not fatal and done
    return groups, sched, seen


def assert_every_sample_whole(groups):
    for g in groups:
        assert len(g.samples) == 4
        for s in g.samples:
            want = LENGTHS[g.prompt_id][s.index]
            assert s.finished and s.num_generated == want, s.key
            assert s.token_ids == [token_at(g.prompt_id, s.index, i) for i in range(want)], s.key
            assert len(s.logprobs) == want
            assert sum(seg.num_tokens for seg in s.segments) - s.wasted_tokens == want
            starts = [seg.start_token for seg in s.segments]
            assert starts == sorted(starts)


@pytest.mark.parametrize("policy", ["baseline", "v2", "v3"])
def test_abort_holds_running_samples_with_their_tokens_and_continues_them_after_resume(policy):
    groups, sched, seen = fake_run(policy, "abort")
    assert_every_sample_whole(groups)
    assert seen["in_flight"] == 0 and seen["drained"] == pytest.approx(PAUSE_AT)
    assert seen["held"] and seen["held"] <= seen["running"]
    assert not seen["submitted_while_paused"]
    for s in seen["held"]:
        cut = [i for i, seg in enumerate(s.segments) if seg.end_reason == "pause"]
        assert len(cut) == 1, s.key
        before, after = s.segments[:cut[0] + 1], s.segments[cut[0] + 1:]
        assert {seg.policy_version for seg in before} == {0} and {seg.policy_version for seg in after} == {1}
        assert after[0].engine == before[-1].engine and after[0].start_token == before[-1].start_token + before[-1].num_tokens
    # nothing was generated while paused
    for g in groups:
        for s in g.samples:
            for seg in s.segments:
                if seg.num_tokens and seg.first_token_time_s is not None:
                    assert not (PAUSE_AT + 1e-9 < seg.first_token_time_s < RESUME_AT - 1e-9), s.key
    assert sched.idle and sched.paused is None


@pytest.mark.parametrize("policy", ["baseline", "v3"])
def test_wait_lets_running_samples_finish_and_starts_nothing_new(policy):
    groups, sched, seen = fake_run(policy, "wait", resume_at=5.0)
    assert_every_sample_whole(groups)
    assert PAUSE_AT < seen["drained"] < 5.0 and seen["in_flight"] == 0 and not seen["held"]
    # only continuations of samples that were running when the pause came
    assert {r.sample for r in seen["submitted_while_paused"]} <= seen["running"]
    running = seen["running"]
    assert all(s.finished and s.finish_time_s <= seen["drained"] for s in running)
    for g in groups:
        for s in g.samples:
            if s not in running and s not in seen["finished"]:
                assert {seg.policy_version for seg in s.segments} == {1}, s.key


def test_keep_leaves_requests_running_and_splits_their_segments_at_the_version_change():
    groups, sched, seen = fake_run("baseline", "keep", resume_at=PAUSE_AT + 0.05)
    assert_every_sample_whole(groups)
    assert seen["in_flight"] == len(seen["running"]) > 0 and "drained" not in seen
    # the fake engine reports a segment's tokens at its end: a segment running at the resume has none
    # reported yet and is stamped with the new version as a whole (real engines: tests below)
    for s in seen["running"]:
        versions = [seg.policy_version for seg in s.segments]
        assert versions == sorted(versions) and versions[-1] == 1, s.key
        assert not [seg for seg in s.segments if seg.end_reason == "pause"]


def test_pause_misuse_is_named():
    clock = VirtualClock()
    engines = [FakeEngine("fast-0", "fast", clock), FakeEngine("heavy-0", "heavy", clock)]
    cls = POLICIES.get("baseline")
    sched = DispatchRun(engines, cls, cls.config_model(), clock, SamplingConfig(n=2, max_tokens=10),
                        SegmentConfig()).scheduler
    with pytest.raises(PdsrError, match="pause mode must be one of abort, wait, keep; got 'stop'"):
        sched.pause("stop")
    called = []
    sched.pause("wait", on_drained=lambda: called.append(1))
    assert called == [1]      # nothing ran
    with pytest.raises(PdsrError, match="already paused"):
        sched.pause("abort")
    sched.resume()
    sched.resume()            # not paused: nothing
    assert sched.paused is None


# ------------------------------------------------------------------ real vLLM engines (CPU build)
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def engines(engine_loop, tiny_model_dir):
    from pdsr_sdk.engines.vllm_engine import VllmEngine
    from pdsr_sdk.rollout.config import EngineSpec

    # float32: a greedy continuation re-prefilled from its tokens equals step-by-step decoding bit for bit;
    # two slots per engine, so a step of 6 samples has some waiting in queues
    specs = [EngineSpec(name="fast-0", pool="fast", devices=[0], max_num_seqs=2, max_model_len=512, dtype="float32"),
             EngineSpec(name="heavy-0", pool="heavy", devices=[1], max_num_seqs=2, max_model_len=512, dtype="float32")]
    built = [VllmEngine.from_spec(s, model=str(tiny_model_dir)) for s in specs]

    async def start_all():
        await asyncio.gather(*(e.start() for e in built))

    run_on(engine_loop, start_all())
    yield built
    for e in built:
        run_on(engine_loop, e.close())


def session_config(tiny_model_dir):
    from pdsr_sdk.rollout.config import RolloutConfig

    # greedy, EOS ignored: every sample has exactly MAX_TOKENS tokens, the same in every run
    return RolloutConfig(model=str(tiny_model_dir), policy="baseline",
                         sampling={"n": 2, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True},
                         segments={"min_tokens": 16, "max_tokens": 32})


PROMPTS = [{"id": "a", "prompt": "What is 2 + 3?"}, {"id": "b", "prompt": "Name a color."},
           {"id": "c", "prompt": "Count to five."}]


def tokens_of(result):
    return {s.key: list(s.token_ids) for s in result.samples}


async def until(pred, timeout=60.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.005)


def assert_whole(result, reference):
    assert sorted(s.key for s in result.samples) == sorted(reference)
    for s in result.samples:
        assert s.finish_reason == "length" and s.num_generated == MAX_TOKENS == len(s.token_ids) == len(s.logprobs)
        assert s.token_ids == reference[s.key], s.key
        assert sum(seg.num_tokens for seg in s.segments) == MAX_TOKENS
    assert result.table.num_rows == 6


@requires_vllm
@pytest.mark.vllm
def test_every_pause_mode_keeps_every_sample_and_its_tokens(engine_loop, engines, tiny_model_dir):
    """A step runs as a task; mid-step the trainer pauses, loads weights (the model folder again: the
    greedy tokens must then equal an uninterrupted run's, token for token) and resumes. abort: the running
    samples come back held with their tokens and continue after the update in new segments of version 1;
    wait: the running samples finish, nothing else starts while paused; keep: the requests stay in the
    engines, frozen (no token while paused), and go on; their segment is split at the version change."""
    from pdsr_sdk.rollout.session import RolloutSession

    async def scenario():
        out = {}
        async with RolloutSession(session_config(tiny_model_dir), engines=engines) as session:
            reference = await session.astep(PROMPTS)
            sched = session.scheduler
            ref = tokens_of(reference)
            for mode in ("abort", "wait", "keep"):
                task = asyncio.ensure_future(session.astep(PROMPTS))
                await until(lambda: sched.in_flight == 4 and all(s.num_generated >= 4 for s in sched.running()))
                running = set(sched.running())
                await session.apause(mode)
                assert session.paused == mode
                await asyncio.sleep(0.1)          # let what the engines sent before the pause arrive
                info = {"running": running, "held": set(sched.held()), "in_flight": sched.in_flight,
                        "generated": {s: s.num_generated for s in running}}
                await asyncio.sleep(0.3)          # nothing may move while paused
                info["generated_later"] = {s: s.num_generated for s in running}
                info["launched_while_paused"] = sched.in_flight
                version = await session.aupdate_weights(tiny_model_dir)
                await session.aresume()
                info["result"] = result = await asyncio.wait_for(task, 120)
                info["version"] = version
                assert_whole(result, ref)
                out[mode] = info
        return out

    out = run_on(engine_loop, scenario(), timeout=300)

    abort = out["abort"]
    assert abort["in_flight"] == 0 and abort["held"] == abort["running"] and len(abort["held"]) == 4
    assert abort["generated_later"] == abort["generated"]
    for s in abort["held"]:
        cut = [i for i, seg in enumerate(s.segments) if seg.end_reason == "pause"]
        assert len(cut) == 1 and s.segments[cut[0]].num_tokens > 0
        assert {seg.policy_version for seg in s.segments[:cut[0] + 1]} == {abort["version"] - 1}
        assert {seg.policy_version for seg in s.segments[cut[0] + 1:]} == {abort["version"]}

    wait = out["wait"]
    assert wait["in_flight"] == 0 and not wait["held"]
    assert all(s.finished for s in wait["running"])           # they ran to their end before pause returned
    others = [s for s in wait["result"].samples if s not in wait["running"]]
    assert len(others) == 2 and all(seg.policy_version == wait["version"] for s in others for seg in s.segments)

    keep = out["keep"]
    assert keep["in_flight"] == 4 and keep["launched_while_paused"] == 4 and not keep["held"]
    assert keep["generated_later"] == keep["generated"]      # frozen inside the engines
    split = 0
    for s in keep["running"]:
        versions = [seg.policy_version for seg in s.segments]
        assert versions == sorted(versions) and versions[-1] == keep["version"]
        cut = [seg for seg in s.segments if seg.end_reason == "pause"]
        split += len(cut)
        if cut:
            assert cut[0].policy_version == keep["version"] - 1 and cut[0].num_tokens > 0
    assert split >= 1
    assert [out[m]["result"].policy_version for m in ("abort", "wait", "keep")] == [0, 1, 2]


@requires_vllm
@pytest.mark.vllm
def test_sleep_on_the_cpu_build_says_it_cannot_free_memory(engine_loop, engines, tiny_model_dir):
    from pdsr_sdk.errors import UnsupportedError
    from pdsr_sdk.rollout.session import RolloutSession

    async def scenario():
        async with RolloutSession(session_config(tiny_model_dir), engines=engines) as session:
            with pytest.raises(UnsupportedError, match=r"sleep: engine memory cannot be freed here \(fast-0: vLLM's "
                                                       r"CPU build cannot free engine memory .*heavy-0: ") as info:
                await session.asleep()
            assert isinstance(info.value, NotImplementedError)
            await session.awake()                      # never asleep: nothing
            result = await session.astep(PROMPTS[:1])  # the engines still serve
            return result

    result = run_on(engine_loop, scenario(), timeout=120)
    assert result.table.num_rows == 2
