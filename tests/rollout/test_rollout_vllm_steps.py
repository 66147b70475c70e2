"""Partial rollout across steps on real vLLM engines: carried samples, mid-step updates, ``--steps`` output and
resume, dynamic sampling (the session's shared engines, tests/conftest.py)."""

from __future__ import annotations

import asyncio

import pyarrow.parquet as pq
import pytest

from real_rollout import Bars, by_key, rollout
from support import WAIT_S, requires_vllm, run_on
from pdsr_sdk.rollout.config import RolloutConfig
from workloads import LENGTHS

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s


# ----------------------------------------------------------------------- partial rollout across steps
#: per group, forced lengths of its 4 samples: a few long samples make most groups finish late
STREAM_LENGTHS = [[8, 8, 8, 8], [8, 8, 8, 120], [8, 16, 8, 8], [120, 8, 8, 8], [16, 16, 16, 16], [8, 8, 120, 8],
                  [8, 8, 8, 16], [16, 8, 8, 8], [8, 120, 8, 8], [8, 8, 16, 8]]


def stream_records(session):
    from pdsr_sdk.rollout.data import PromptRecord

    tok = session.tokenizer
    return [PromptRecord(prompt_id=f"g{i}", text=f"Question {i}: what is {i} + {i}?",
                         token_ids=tok.encode(f"Question {i}: what is {i} + {i}?"), target_lengths=lengths)
            for i, lengths in enumerate(STREAM_LENGTHS)]


@pytest.mark.parametrize("policy,staleness,kv", [("v3", 1, "recompute"), ("baseline", 0, "recompute"),
                                                 ("v2.5", 1, "recompute"), ("v3", 1, "keep")])
def test_partial_rollout_carries_every_sample_with_its_tokens(engine_loop, engines, tiny_model_dir, policy,
                                                              staleness, kv):
    """Steps of 2 groups with 2 more in flight: a step ends when 2 groups are complete; the samples still
    running are carried into the next step with their tokens and log-probs and continue under the next
    policy version (greedy, fp32 engines: the joined tokens equal an uninterrupted run's, whether the version
    change resets the prefix caches (kv_on_update recompute) or the carried samples go on from their cached KV
    (keep)). No group is lost or returned twice; with max_staleness S no consumed token is older than S
    versions (S=0: every carried sample starts over, its thrown-away tokens counted); the last step drains."""
    from pdsr_sdk.rollout.session import RolloutSession

    base = dict(model=str(tiny_model_dir), policy=policy, segments={"min_tokens": 16, "max_tokens": 32},
                sampling={"n": 4, "max_tokens": 128, "temperature": 0.0, "ignore_eos": True})

    async def scenario():
        async with RolloutSession(RolloutConfig(**base), engines=engines) as session:
            reference = await session.astep(stream_records(session))
        cfg = RolloutConfig(**base, over_provision=1.0, step_groups=2, max_staleness=staleness, kv_on_update=kv)
        steps, carried = [], {}
        async with RolloutSession(cfg, engines=engines) as session:
            records = iter(stream_records(session))
            for k in range(5):   # 10 groups, 2 a step; 4 in flight until the data runs out
                out = await session.astep(records if k == 0 else (), last=k == 4)
                steps.append(out)
                for s in session.scheduler.held():   # what the next step resumes from
                    carried.setdefault(s.key, []).append((out.step, list(s.token_ids), list(s.logprobs)))
                await session.anext_version()        # the trainer's update
            assert not session.carried() and not session.scheduler.held()
        return reference, steps, carried

    reference, steps, carried = run_on(engine_loop, scenario(), timeout=300)
    ref = {s.key: s for s in reference.samples}
    got = [s for out in steps for s in out.samples]
    assert sorted(s.key for s in got) == sorted(ref)                    # every sample once
    assert [len(out.groups) for out in steps] == [2] * 5
    assert sum(len(out.groups) for out in steps) == len(STREAM_LENGTHS)
    assert carried, "some samples must cross a step end"
    for s in got:
        assert s.token_ids == ref[s.key].token_ids and s.num_generated == len(s.logprobs) == ref[s.key].num_generated
    by_key = {s.key: s for s in got}
    for key, snaps in carried.items():
        final = by_key[key]
        for _, tokens, logprobs in snaps:
            if staleness:   # kept exactly across the step end
                assert final.token_ids[:len(tokens)] == tokens and final.logprobs[:len(logprobs)] == logprobs
    for out in steps:
        assert out.summary["max_token_age"] <= staleness
        assert out.record.off_policy_tokens == round(out.summary["off_policy_share"] * out.record.tokens)
        for s in out.samples:
            kept = [seg for seg in s.segments[max(i for i, seg in enumerate(s.segments) if seg.start_token == 0):]]
            assert sum(seg.num_tokens for seg in kept) == s.num_generated
            assert all(out.policy_version - seg.policy_version <= staleness for seg in kept if seg.num_tokens)
    crossed = [by_key[k] for k in carried]
    if staleness:
        assert any(len({seg.policy_version for seg in s.segments if seg.num_tokens}) > 1 for s in crossed)
        assert any(out.summary["off_policy_share"] > 0 for out in steps)
    else:
        assert sum(out.summary["stale_restarts"] for out in steps) >= 1
        assert sum(out.summary["wasted_tokens"] for out in steps) > 0


def test_a_step_whose_groups_completed_before_it_began_returns_with_the_engines_stopped(engine_loop, engines,
                                                                                      tiny_model_dir):
    """One engine, 4 groups of 2 equal forced-length samples in flight for steps of 2: all 8 run in
    lockstep and end in one engine step, so the 2 groups a step does not take are complete by its end
    (they finish while it stops the engine) and the next step's B groups are complete at its refill: it
    ends at once. It must still hand back a stopped session (nothing running while the trainer trains,
    so update_weights is allowed) with its new groups queued for the next step. It used to restart the
    engine after such a step had ended: update_weights then refused ("a step is running"), or the next
    step waited forever for a drain that never came."""
    from pdsr_sdk.rollout.data import PromptRecord
    from pdsr_sdk.rollout.session import RolloutSession

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", over_provision=1.0, step_groups=2,
                        sampling={"n": 2, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True})

    async def scenario():
        returned, between = [], []
        async with RolloutSession(cfg, engines=engines[:1]) as session:
            tok = session.tokenizer
            records = iter([PromptRecord(prompt_id=f"g{i}", text=f"Say {i}.", token_ids=tok.encode(f"Say {i}."))
                            for i in range(10)])
            for k in range(5):
                out = await asyncio.wait_for(session.astep(records if k == 0 else (), last=k == 4), 60)
                returned.append(sorted(g.prompt_id for g in out.groups))
                await asyncio.sleep(0.3)   # the trainer's work: nothing may run meanwhile
                between.append((session.scheduler.paused, session.scheduler.in_flight))
                session.policy_version += 1
        return returned, between

    returned, between = run_on(engine_loop, scenario(), timeout=300)
    assert [len(r) for r in returned] == [2] * 5
    assert sorted(p for r in returned for p in r) == sorted(f"g{i}" for i in range(10))
    assert all(paused is not None and running == 0 for paused, running in between[:-1]), between


async def _until(cond, what: str, timeout: float = WAIT_S) -> None:
    """Poll ``cond`` on the event loop (the engines' callbacks run meanwhile)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("wait_for_update", [False, True])
def test_partial_rollout_takes_weight_updates_in_the_middle_of_steps(engine_loop, engines, tiny_model_dir,
                                                                      wait_for_update):
    """A pipelined trainer: it starts step k + 1 as soon as step k returns and, while it generates, trains on
    step k and calls update_weights without pausing. The session stops the engines keeping every token,
    loads the weights, and goes on: samples running at the update continue under the new version, and a
    step's token ages count from the version at its end. Greedy fp32 engines reloaded with the same weights:
    every sample is returned once with the tokens of an uninterrupted run, each step's result names the
    version at its end (one more than at its start when the update came in its middle), and no token is
    older than max_staleness there. ``wait_for_update``: no step ends before the trainer's update, so every
    later step ends one version above its start (the trainer's weights)."""
    from pdsr_sdk.rollout.session import RolloutSession

    base = dict(model=str(tiny_model_dir), policy="v3", segments={"min_tokens": 16, "max_tokens": 32},
                sampling={"n": 4, "max_tokens": 128, "temperature": 0.0, "ignore_eos": True})

    async def scenario():
        async with RolloutSession(RolloutConfig(**base), engines=engines) as session:
            reference = await session.astep(stream_records(session))
        cfg = RolloutConfig(**base, over_provision=1.0, step_groups=2, max_staleness=1)
        steps, starts = [], []
        async with RolloutSession(cfg, engines=engines) as session:
            records = iter(stream_records(session))
            steps.append(await session.astep(records))
            for k in range(1, 5):
                starts.append(session.policy_version)
                step = asyncio.ensure_future(session.astep((), last=k == 4, wait_for_update=wait_for_update))
                # the update lands while tokens are generated, or at once when nothing is left to generate
                # (on a loaded machine every sample may have ended before this step began)
                await _until(lambda: step.done() or session.scheduler.idle
                             or any(s.num_generated for s in session.scheduler.running()), "tokens")
                await session.aupdate_weights(str(tiny_model_dir))   # trained on the previous step
                steps.append(await asyncio.wait_for(step, 120))
            assert not session.carried() and not session.scheduler.held()
        return reference, steps, starts

    reference, steps, starts = run_on(engine_loop, scenario(), timeout=300)
    ref = {s.key: s for s in reference.samples}
    got = [s for out in steps for s in out.samples]
    assert sorted(s.key for s in got) == sorted(ref)
    for s in got:
        assert s.token_ids == ref[s.key].token_ids and len(s.logprobs) == s.num_generated
    # an update lands in the middle of its step unless that step ended first (e.g. at once, its groups
    # complete when it began): then it lands between steps
    assert steps[0].policy_version == 0
    mid = [out.policy_version == start + 1 for out, start in zip(steps[1:], starts)]
    assert all(out.policy_version in (start, start + 1) for out, start in zip(steps[1:], starts))
    assert starts == sorted(starts) and sum(mid) >= (4 if wait_for_update else 2), (starts, mid)
    for out in steps:
        assert out.summary["max_token_age"] <= 1 and out.summary["policy_version"] == out.policy_version
        for s in out.samples:
            kept = s.segments[max(i for i, seg in enumerate(s.segments) if seg.start_token == 0):]
            assert all(0 <= out.policy_version - seg.policy_version <= 1 for seg in kept if seg.num_tokens)
    # samples that ran across an update in the middle of the step that returned them
    assert any(len({seg.policy_version for seg in s.segments if seg.num_tokens}) > 1 and
               min(seg.policy_version for seg in s.segments if seg.num_tokens) == out.policy_version - 1
               for out, m in zip(steps[1:], mid) if m for s in out.samples)


def test_a_mid_step_update_that_would_restart_a_sample_twice_waits_for_the_steps_end(engine_loop, engines,
                                                                                     tiny_model_dir):
    """max_staleness 0: a weight update in the middle of a step restarts every sample holding tokens (each
    at most once); a second update in the same step would make those restarted samples stale again. Paused
    by the caller, it is refused with a RunError naming them; unpaused, it waits for the step's end, which
    consumes their groups (they are due), and then loads."""
    from pdsr_sdk.errors import RunError
    from pdsr_sdk.rollout.data import PromptRecord
    from pdsr_sdk.rollout.session import RolloutSession

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", over_provision=1.0, step_groups=2, max_staleness=0,
                        sampling={"n": 4, "max_tokens": 400, "temperature": 0.0, "ignore_eos": True})

    async def scenario():
        async with RolloutSession(cfg, engines=engines) as session:
            tok = session.tokenizer
            records = [PromptRecord(prompt_id=f"g{i}", text=f"Count to {i}.", token_ids=tok.encode(f"Count to {i}."),
                                    target_lengths=[24, 24, 24, 300 if i % 2 else 24]) for i in range(4)]
            step = asyncio.ensure_future(session.astep(records))
            running = lambda: [s for s in session.scheduler.running() if s.num_generated]   # noqa: E731
            await _until(lambda: len(running()) >= 2, "tokens")
            assert await session.aupdate_weights(str(tiny_model_dir)) == 1   # restarts what has tokens
            restarted = lambda: [s for g, _ in session.carried() for s in g.samples   # noqa: E731
                                 if s.restarts and s.num_generated > 8]
            await _until(lambda: restarted() or step.done(), "a restarted sample's new tokens")
            assert not step.done()
            await session.apause("abort")
            blocked = {s.key for s in session._stream.blocked_by(2)}
            with pytest.raises(RunError, match="restarted for staleness once and would be too stale again"):
                await session.aupdate_weights(str(tiny_model_dir))
            assert session.policy_version == 1 and not step.done()
            await session.aresume()
            assert await session.aupdate_weights(str(tiny_model_dir)) == 2
            assert step.done()   # it waited for the step's end
            out = step.result()
            assert out.policy_version == 1 and out.summary["max_token_age"] == 0
            keys = {s.key for s in out.samples}
            assert blocked and blocked <= keys   # consumed at the step's end they waited for
            rest = []   # the step took every due group: perhaps all four
            if session.carried():
                last = await asyncio.wait_for(session.astep((), last=True), 120)
                assert keys.isdisjoint(s.key for s in last.samples) and last.summary["max_token_age"] == 0
                rest = last.groups
            assert len(out.groups) + len(rest) == 4
            return out

    out = run_on(engine_loop, scenario(), timeout=300)
    assert out.summary["stale_restarts"] >= 1


def test_rollout_steps_writes_every_group_once_in_the_step_that_consumed_it(engine_loop, engines, tiny_model_dir,
                                                                           tmp_path, replay_data):
    """``pdsr rollout --steps 3 --step-groups 2 --over-provision 0.5``: 3 groups in flight, 2 consumed a
    step, the last step drains: 5 groups in 2 + 2 + 1, each sample whole, each step summarised with its
    off-policy share."""
    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3",
                            steps=3, step_groups=2, over_provision=0.5)
    assert summary.samples == len(rows) == 20
    assert set(by_key(rows)) == {(p, i) for p in LENGTHS for i in range(4)}
    for r in rows:
        want = LENGTHS[r["prompt_id"]][r["sample_index"]]
        assert r["response_length"] == len(r["response_token_ids"]) == len(r["response_logprobs"]) == want
        assert sum(s["num_tokens"] for s in r["segments"]) - r["wasted_tokens"] == want
        assert set(r["policy_versions"]) <= set(range(r["batch_index"] + 1))
    per_step = [len({r["prompt_id"] for r in rows if r["batch_index"] == k}) for k in range(3)]
    assert per_step == [2, 2, 1]
    assert [b["batch_index"] for b in summary.batches] == [0, 1, 2]
    assert all({"off_policy_share", "max_token_age", "carried_groups"} <= set(b) for b in summary.batches)
    assert summary.batches[-1]["carried_groups"] == 0


def test_an_interrupted_steps_run_resumes_with_the_groups_left_and_goes_on_numbering(engine_loop, engines,
                                                                                    tiny_model_dir, tmp_path,
                                                                                    replay_data):
    """A multi-step run of 2 steps (4 of 5 groups on disk) resumed with ``--steps 3``: the groups on disk are
    skipped, the rest run in the third step, numbered after the last one, and the summary covers the whole
    run. ``--steps`` counts the run's steps in all: resuming it again runs nothing."""
    first, before = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3", steps=2,
                            step_groups=2, over_provision=0.0)
    assert first.groups == 4 and [b["batch_index"] for b in first.batches] == [0, 1]
    again, _ = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3", steps=2,
                       step_groups=2, over_provision=0.0, **{"output.resume": True})
    assert again.groups == 4 and [b["batch_index"] for b in again.batches] == [0, 1]
    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3", steps=3,
                            step_groups=2, over_provision=0.0, **{"output.resume": True})
    assert set(by_key(rows)) == {(p, i) for p in LENGTHS for i in range(4)} and len(rows) == 20
    assert summary.groups == 5 and summary.skipped_groups == 4
    assert [b["batch_index"] for b in summary.batches] == [0, 1, 2]
    done = {r["prompt_id"] for r in before}
    assert len(done) == 4 and {r["batch_index"] for r in rows if r["prompt_id"] not in done} == {2}


def test_an_interrupted_steps_run_resumes_its_carried_samples_from_their_tokens(engine_loop, engines, tiny_model_dir,
                                                                                tmp_path, replay_data, monkeypatch):
    """A multi-step run that stopped right after its first step (the summary write after it failed) left
    the groups it carried on disk with their tokens, log-probs and segments (``<out>.parts/_carry.parquet``).
    ``--resume`` continues them from those tokens under the next version: every sample once and whole, each
    carried prefix (tokens, log-probs, segments) kept exactly, and the carry file gone once the run ends."""
    from pdsr_sdk.rollout import run as run_module
    from pdsr_sdk.rollout.writer import carry_file

    write = run_module.write_text_atomic

    def stop(*args, **kwargs):
        raise RuntimeError("stopped after a step")

    monkeypatch.setattr(run_module, "write_text_atomic", stop)
    opts = dict(steps=4, step_groups=1, over_provision=2.0)   # 3 groups in flight, 1 consumed a step
    with pytest.raises(RuntimeError, match="stopped after a step"):
        rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3", **opts)
    monkeypatch.setattr(run_module, "write_text_atomic", write)
    out = tmp_path / "v3.parquet"
    before = pq.read_table(out.with_name(out.name + ".parts")).to_pylist()
    carry = pq.read_table(carry_file(out)).to_pylist()
    assert len({r["prompt_id"] for r in before}) == 1 and {r["batch_index"] for r in before} == {0}
    assert (len({r["prompt_id"] for r in carry}) == 2
            and not {r["prompt_id"] for r in carry} & {r["prompt_id"] for r in before})
    partial = [r for r in carry if r["finish_reason"] is None and r["response_length"]]
    assert partial, "some carried sample must hold tokens without being finished"
    assert all(r["launch_step"] == 0 and r["response_length"] == len(r["response_token_ids"])
               == len(r["response_logprobs"]) for r in carry)

    bars = Bars()
    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3", progress=bars, **opts,
                            **{"output.resume": True})
    assert sorted(by_key(rows)) == sorted((p, i) for p in LENGTHS for i in range(4)) and len(rows) == 20
    # the bars count what finishes in the resumed run: the carried samples finished before the stop are not due
    # (before they were left out, the bar ended short of its total: 13/16 samples with 3 carried ones done)
    done = [r for r in carry if r["finish_reason"] is not None]
    assert bars.bars["samples"] == [16 - len(done)] * 2 and done
    assert bars.bars["probes"] == [4 - sum(r["is_probe"] for r in done)] * 2
    assert summary.groups == 5 and summary.skipped_groups == 1
    got = by_key(rows)
    for r in rows:
        assert r["response_length"] == len(r["response_token_ids"]) == LENGTHS[r["prompt_id"]][r["sample_index"]]
    for c in carry:
        r = got[(c["prompt_id"], c["sample_index"])]
        n = c["response_length"]
        assert r["response_token_ids"][:n] == c["response_token_ids"]
        assert r["response_logprobs"][:n] == c["response_logprobs"]
        assert r["segments"][:len(c["segments"])] == c["segments"]
        assert r["restarts"] == 0 and r["batch_index"] >= 1
    for c in partial:   # continued under the version after the first step's update
        r = got[(c["prompt_id"], c["sample_index"])]
        assert 0 in r["policy_versions"] and max(r["policy_versions"]) >= 1
    assert not carry_file(out).exists() and not out.with_name(out.name + ".parts").exists()


# ------------------------------------------------------------------------- dynamic sampling (DAPO)

def _signal_for_odd_prompts(text, ground_truth, *, prompt_id, sample_index, **info):
    """p1 and p3 get rewards that differ within the group; the others all 1.0 (no GRPO signal)."""
    return float(sample_index % 2) if prompt_id in ("p1", "p3") else 1.0


def test_rollout_steps_with_filter_groups_writes_only_groups_with_signal(engine_loop, engines, tiny_model_dir,
                                                                         tmp_path, replay_data):
    """``pdsr rollout --steps 2 --step-groups 1 --filter-groups zero-variance --write-filtered`` on real engines:
    the trajectories hold the groups whose rewards differ (each sample whole), the filtered file the others,
    and the summary counts them."""
    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3", steps=2,
                            step_groups=1, max_staleness=0,
                            reward="test_rollout_vllm_steps:_signal_for_odd_prompts",
                            **{"filter_groups.kind": "zero-variance", "filter_groups.write_filtered": True})
    kept = {r["prompt_id"] for r in rows}
    filtered = pq.read_table(tmp_path / "v3.filtered.parquet").to_pylist()
    assert kept and kept <= {"p1", "p3"} and {r["prompt_id"] for r in filtered} <= {"p0", "p2", "p4"}
    for r in rows + filtered:
        assert r["response_length"] == len(r["response_token_ids"]) == LENGTHS[r["prompt_id"]][r["sample_index"]]
        assert r["reward"] == _signal_for_odd_prompts("", None, prompt_id=r["prompt_id"],
                                                      sample_index=r["sample_index"])
    assert summary.filtered_groups == len({r["prompt_id"] for r in filtered}) > 0
    assert sum(b["filtered_groups"] for b in summary.batches) == summary.filtered_groups
