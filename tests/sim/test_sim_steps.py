"""`pdsr simulate --steps`: partial rollout across training steps on simulated engines."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.errors import ConfigError, DataError
from pdsr_sdk.policies.resolve import resolve_policy
from pdsr_sdk.policies.v3 import V3Policy
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import run_policy, trace_batches
from pdsr_sdk.sim.engine import SimEngine
from pdsr_sdk.dispatch.types import kept_segments
from pdsr_sdk.dispatch.types import StreamSpec
from pdsr_sdk.policies.resolve import streaming_policies
from pdsr_sdk.sim.steps import run_steps, simulate_steps
from pdsr_sdk.traces import LengthTrace, synth_trace, write_trace_jsonl
from sim_cases import hand_trace, recorded, small_cfg, small_trace, unit_cfg



def test_f0_is_the_on_policy_run_step_for_step():
    trace = small_trace()
    cfg = small_cfg(over_provision=0.0)
    run = run_steps(trace, cfg, "baseline", 0.0, keep_groups=True)
    on = run_policy(trace_batches(trace, cfg.model_copy(update={"num_batches": 6})), cfg, "baseline", record=False,
                    keep_groups=True)
    assert run.step_times == pytest.approx([b.makespan_s for b in on.batches], rel=1e-12, abs=1e-12)
    # each step consumes exactly its batch (in completion order)
    assert sorted(g.prompt_id for g in run.groups) == [g.prompt_id for g in on.groups]
    assert all(run.consumed_at[g.prompt_id] == g.batch_index for g in on.groups)
    assert run.off_policy_share == 0 and run.max_age == 0 and run.stats["restarts"] == 0
    assert run.dropped_groups == 0 and all(s.groups == 6 for s in run.steps)
    # ... and its work bound is the batch's (the batch report's own computation)
    assert run.work_bounds_s == pytest.approx([b.work_bound_s for b in on.batches], rel=1e-12)


@pytest.mark.parametrize("policy,staleness", [("baseline", None), ("baseline", 1), ("baseline", 0), ("v2", 1), ("v3", None), ("v3", 1),
                                              ("v1", 1), ("v2.5", None), ("v2.5", 1), ("lpt", 1)])
def test_no_sample_lost_or_duplicated_and_staleness_holds(policy, staleness):
    trace = small_trace()
    want = recorded(trace)
    # replayed restarts, so that every sample's length is known (fresh draws: tests/sim/test_sim_redraw.py)
    cfg = small_cfg(policy=policy, max_staleness=staleness, restart_lengths="replay")
    run = run_steps(trace, cfg, policy, 0.5, keep_groups=True)
    ids = [g.prompt_id for g in run.groups]
    assert len(ids) == len(set(ids)) == sum(s.groups for s in run.steps) >= 6 * 6
    # the stream is the trace in order: consumed + still in flight = launched
    assert len(run.launched_at) == len(ids) + run.dropped_groups == 9 + 5 * 6
    assert list(run.launched_at) == list(trace.prompt_ids[:len(run.launched_at)])
    for g in run.groups:
        t = run.consumed_at[g.prompt_id]
        assert t >= run.launched_at[g.prompt_id]
        for s in g.samples:
            # exactly its recorded length, once; restarts regenerate it fully
            assert s.finished and s.num_generated == want[g.prompt_id][s.index], s.key
            kept = kept_segments(s)
            assert sum(seg.num_tokens for seg in kept) == s.num_generated
            assert sum(seg.num_tokens for seg in s.segments) - s.wasted_tokens == s.num_generated
            ages = [t - seg.policy_version for seg in kept if seg.num_tokens]
            assert min(ages) >= 0
            if staleness is not None:
                assert max(ages) <= staleness, s.key
            if policy == "baseline":   # no policy restarts: each sample restarted for staleness at most once
                assert s.restarts <= 1
    assert sum(s.tokens for s in run.steps) == sum(x.num_generated for g in run.groups for x in g.samples)
    # every consumed token was generated after the start: the steps up to any step take at least their work
    assert len(run.work_bounds_s) == len(run.steps)
    assert (np.cumsum(run.step_times) >= np.cumsum(run.work_bounds_s) * (1 - 1e-9)).all()
    if staleness == 0:
        assert run.off_policy_share == 0 and run.stats["restarts"] > 0 and run.stats["wasted_tokens"] > 0
        # finished samples of groups still waiting were restarted too
        assert any(s.restarts and s.segments[0].end_reason == "length"
                   for g in run.groups for s in g.samples)
    elif staleness is None:
        assert run.stats["restarts"] == 0 and run.off_policy_share > 0


def test_carry_over_gain_on_a_hand_made_trace():
    # one token per second. On-policy with B=1: 25, 10, 10, ... With 2 groups in flight the 25-token
    # group runs beside the 10-token ones: steps end at 10, 20, 25, 30, 35, 40 and the long group is
    # consumed at step 3 (index 2): 10 tokens two versions old, 10 one, 5 current (each step's end
    # aborts it and it goes on under the new version). The groups launched at t = 20, 25, 30 carry 5
    # tokens across one update each.
    trace = hand_trace([25] + [10] * 8)
    cfg = unit_cfg(over_provision=1.0)
    run = run_steps(trace, cfg, "baseline", 1.0)
    assert [(s.start_s, s.end_s) for s in run.steps] == [(0, 10), (10, 20), (20, 25), (25, 30), (30, 35), (35, 40)]
    assert run.consumed_at == {"g1": 0, "g2": 1, "g0": 2, "g3": 3, "g4": 4, "g5": 5}
    assert run.steps[2].ages == {2: 10, 1: 10, 0: 5} and run.off_policy_share == pytest.approx(35 / 75)
    assert [s.ages for s in run.steps[3:]] == [{1: 5, 0: 5}] * 3 and run.partial_share == run.off_policy_share
    # the responses carried across an update: g0 (25 tokens, 20 of them made before its last update), then one
    # 10-token group a step with 5 made before
    assert [(s.carried, s.carried_tokens) for s in run.steps] == [(0, 0), (0, 0), (1, 25), (1, 10), (1, 10), (1, 10)]
    assert run.carried_responses == 4 and run.carried_made_before == pytest.approx(35 / 55)
    # work bound: c0 = 1 s shared by up to 64 sequences, nothing else costs: L / 64 a step
    assert run.work_bounds_s == pytest.approx([10 / 64, 10 / 64, 25 / 64, 10 / 64, 10 / 64, 10 / 64])
    assert run.work_bound_s == pytest.approx(np.mean([25, 10, 10]) / 64)   # steps 3 to 5
    rep = simulate_steps(trace, cfg)
    assert rep.baseline_steps_s == [25, 10, 10, 10, 10, 10]
    assert rep.baseline_step_s == 10 and rep.runs[0].steady_step_s == pytest.approx(5.0)

    # max staleness 1: at the end of step 2 (t=20) the long group's tokens are 2 versions old: it restarts
    # (20 tokens wasted) and regenerates from t=20 to 45; step 4 waits for it (it would be too stale
    # again), consumes it, and step 5 ends at once with the group that finished meanwhile
    run = run_steps(trace, unit_cfg(over_provision=1.0, max_staleness=1), "baseline", 1.0)
    assert [(s.start_s, s.end_s) for s in run.steps] == [(0, 10), (10, 20), (20, 30), (30, 45), (45, 45), (45, 55)]
    assert run.consumed_at["g0"] == 3 and run.steps[3].ages == {1: 10, 0: 15} and run.steps[3].held_s == 5
    assert run.stats["restarts"] == 1 and run.stats["wasted_tokens"] == 20 and run.max_age == 1


@pytest.mark.parametrize("staleness,deadline", [(0, None), (1, None), (None, 2), (1, 1)])
def test_no_starvation_of_the_longest_group(staleness, deadline):
    # one 300-token group among 20-token ones: 15 steps would pass while it runs
    trace = hand_trace([20, 300] + [20] * 40)
    cfg = unit_cfg(steps=12, batch_size=2, max_staleness=staleness, group_deadline=deadline)
    run = run_steps(trace, cfg, "baseline", 0.5, keep_groups=True)
    assert "g1" in run.consumed_at
    lags = [run.consumed_at[p] - run.launched_at[p] for p in run.consumed_at]
    if deadline is not None:
        assert max(lags) <= deadline
    if staleness is not None:
        (long,) = [s for g in run.groups if g.prompt_id == "g1" for s in g.samples]
        assert long.restarts == (1 if deadline is None else 0) and long.num_generated == 300
        # it waits at most `staleness` steps after it started again
        assert run.consumed_at["g1"] - long.segments[-1].policy_version <= staleness
    assert sum(s.held_s for s in run.steps) > 0


@pytest.mark.parametrize("refresh", [False, True])
def test_v3_refresh_regenerates_a_carried_groups_finished_samples_under_the_new_version(refresh):
    """One token per second. g0 = [5, 12] and g1 = [8, 8] start at t=0; step 0 ends at t=8 with g1 and
    carries g0 (sample 0 finished with 5 tokens under version 0, sample 1 running: the step's end stops
    it with 8 tokens of version 0, and it goes on under version 1). With refresh, v3 regenerates sample
    0 under version 1 (5 tokens wasted): g0 completes at t=13 with 8 off-policy tokens; without it, at
    t=12 with 5 + 8."""
    trace = LengthTrace.from_matrix(np.array([[5, 12], [8, 8], [20, 20], [20, 20], [20, 20]]),
                                    prompt_ids=[f"g{i}" for i in range(5)], prompt_lens=np.full(5, 4))
    cfg = unit_cfg(policy="v3", steps=2, policy_settings={"v3": {"step_end": {"refresh_ratio": 1.0 if refresh else None}}})
    run = run_steps(trace, cfg, "v3", 1.0, keep_groups=True)
    assert run.consumed_at["g1"] == 0 and run.consumed_at["g0"] == 1
    step = run.steps[1]
    (g0,) = [g for g in run.groups if g.prompt_id == "g0"]
    if refresh:
        assert (step.end_s, step.off_policy_tokens, step.refreshed) == (13, 8, 1)
        assert g0.samples[0].restarts == 1 and g0.samples[0].wasted_tokens == 5
        assert [seg.policy_version for seg in kept_segments(g0.samples[0])] == [1]
    else:
        assert (step.end_s, step.off_policy_tokens, step.refreshed) == (12, 13, 0)
        assert g0.samples[0].restarts == 0
    assert step.tokens == 17 and g0.samples[1].restarts == 0


@pytest.mark.tuning
@pytest.mark.parametrize("seed,b", [(1, 16), (2, 48)])
def test_v3_stream_is_no_slower_than_baseline_when_the_probe_predicts_nothing(seed, b):
    """Uninformative lengths (40% at the cap, probe noise): v3 places a stream's groups as baseline does until
    its probe is measured to predict, so its steady step is baseline's at the same over-provision. Dealing
    samples one by one (as within a batch) makes every group finish at the same moment: 1-3% slower."""
    trace = synth_trace(groups=400, n=8, seed=seed, prompt_sigma=0.05, noise_sigma=0.7, runaway_frac=0.35,
                        max_length=1024)
    profile = dict(max_num_seqs=64, kv_cache_tokens=65536)

    def step(policy, placement="auto"):
        cfg = SimulateConfig(policy=policy, fast=3, heavy=1, batch_size=b, steps=8, max_staleness=2, timeline=False,
                             profiles={"fast": profile, "heavy": profile},
                             policy_settings={"v3": {"placement": {"mode": placement}}})
        return float(np.mean([s.duration_s for s in run_steps(trace, cfg, policy, 0.25).steps[2:-1]]))

    base = step("baseline")
    assert step("v3") <= base * 1.001
    assert step("v3", "deal") > base * 1.001


@pytest.mark.tuning
def test_v3_stream_without_a_staleness_bound_places_as_baseline():
    """No bound, no tail lane: v3 keeps a stream's groups in baseline's chunks even with a predictive probe
    (dealing only spreads groups and pays their prompts on every engine), so it is not slower than baseline."""
    trace = synth_trace(groups=400, n=8, seed=2)
    profile = dict(max_num_seqs=64, kv_cache_tokens=65536)

    def step(policy, placement="auto", staleness=None):
        cfg = SimulateConfig(policy=policy, fast=3, heavy=1, batch_size=32, steps=8, max_staleness=staleness,
                             timeline=False, profiles={"fast": profile, "heavy": profile},
                             policy_settings={"v3": {"placement": {"mode": placement}}})
        return float(np.mean([s.duration_s for s in run_steps(trace, cfg, policy, 0.25).steps[2:-1]]))

    assert step("v3") == step("v3", "chunk") <= step("baseline") * 1.001
    # under a bound it deals once the probe is measured to predict (the ranked order and the lane need it)
    assert step("v3", staleness=2) != step("v3", "chunk", 2)


def test_v3_keeps_a_streams_groups_together_where_their_prompts_are_cached():
    """Under a bound v3 deals a predictive stream's samples; with locality an engine takes its own groups'
    siblings first, so a consumed group ran on fewer engines (each pays the group's prompt once)."""
    trace = synth_trace(groups=400, n=8, seed=2)
    profile = dict(max_num_seqs=64, kv_cache_tokens=65536)

    def engines_per_group(locality):
        cfg = SimulateConfig(policy="v3", fast=3, heavy=1, batch_size=32, steps=8, max_staleness=2, timeline=False,
                             profiles={"fast": profile, "heavy": profile},
                             policy_settings={"v3": {"disable": [] if locality else ["locality"]}})
        run = run_steps(trace, cfg, "v3", 0.25, keep_groups=True)
        return float(np.mean([len({seg.engine for s in g.samples for seg in s.segments[:1]}) for g in run.groups]))

    together, spread = engines_per_group(True), engines_per_group(False)
    assert together < 0.8 * spread, (together, spread)


def test_every_policy_streams_and_one_with_per_batch_state_is_refused():
    """Every registered policy that runs on real engines takes groups while others run (the probe-barrier
    ones probe and route each refill as its own wave); a policy that declares per-batch state is refused
    with the names of those that can."""
    from pdsr_sdk.dispatch.policy import Policy
    from pdsr_sdk.policies.resolve import check_streaming, policy_names

    assert set(policy_names("all")) <= set(streaming_policies())

    class OneBatch(Policy):
        name = "one-batch"

        def on_batch(self, groups):
            pass

    with pytest.raises(ConfigError, match=r"policy 'one-batch' cannot run --steps.*can: .*baseline.*v2.5"):
        check_streaming(OneBatch, "one-batch")
    clock = VirtualClock()
    run = DispatchRun([SimEngine("fast-0", "fast", None, clock)], OneBatch, None, clock,
                      SamplingConfig(), SegmentConfig())
    with pytest.raises(ConfigError, match="cannot take groups while others run"):
        run.add_groups([], 0)


def test_config_checks():
    with pytest.raises(ValueError, match="over_provision applies to multi-step runs only"):
        SimulateConfig(over_provision=0.5)
    with pytest.raises(DataError, match="need 39 groups; the trace has 20"):
        run_steps(small_trace(groups=20), small_cfg(), "baseline", 0.5)


def test_cli_curve_writes_json_and_png(tmp_path):
    trace_path = tmp_path / "t.jsonl"
    write_trace_jsonl(small_trace(groups=60), trace_path)
    out = tmp_path / "out"
    profile = tmp_path / "p.yaml"
    profile.write_text("fast: {max_num_seqs: 8, kv_cache_tokens: 4096}\nheavy: {max_num_seqs: 8, kv_cache_tokens: 4096}\n")
    res = CliRunner().invoke(cli, ["simulate", "--trace", str(trace_path), "--steps", "5", "--batch-size", "6",
                                   "--fast", "2", "--heavy", "1", "--profile", str(profile), "--max-staleness", "1", "--policy", "baseline",
                                   "--out-dir", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "on-policy baseline step" in res.output and "off_policy" in res.output
    data = json.loads((out / "steps.json").read_text())
    assert [r["over_provision"] for r in data["runs"]] == [0.0, 0.25, 0.5, 1.0]
    assert data["runs"][0]["ratio"] == pytest.approx(1.0) and data["runs"][0]["off_policy_share"] == 0
    # F = 0 restarts nothing: the steps consume the trace's lengths, and the ratio per token is the ratio
    assert data["runs"][0]["token_ratio"] == 1.0 and data["runs"][0]["ratio_per_token"] == data["runs"][0]["ratio"]
    assert "token_ratio" in data["definitions"] and "per_token" in res.output
    assert all(r["max_age"] <= 1 for r in data["runs"])
    assert (out / "steps.png").read_bytes()[:4] == b"\x89PNG"


def hand_stream(groups: int, over_provision: float, staleness: int | None):
    """A StepStream on simulated engines driven by hand, as a session drives it (v3, steps of 6 groups of
    4): returns the stream, its clock, the step-end times (appended by ``on_step_end``), the trace rows
    taken so far, and the trace's lengths by prompt."""
    from pdsr_sdk.dispatch.steps import StepStream, in_flight
    from pdsr_sdk.sim.batches import build_batch
    from pdsr_sdk.sim.driver import build_engines

    trace = small_trace(groups=groups)
    cfg = small_cfg(policy="v3")
    rows = [g for b in trace_batches(trace, cfg.model_copy(update={"num_batches": None})).batches for g in b]
    clock = VirtualClock()
    cls, settings = resolve_policy("v3", {})
    handlers, ended, taken = [], [], []
    run = DispatchRun(build_engines(cfg, clock, record=False), cls, settings, clock,
                      SamplingConfig(n=4, max_tokens=600, ignore_eos=True), cfg.segments,
                      busy_s=SimEngine.busy_s_at, on_group_done=lambda g: handlers[0].group_done(g))

    def new_groups(count):
        batch = rows[len(taken):len(taken) + count]
        taken.extend(batch)
        return build_batch(batch)

    stream = StepStream(run, step_groups=6, in_flight=in_flight(6, over_provision), steps=None,
                        max_staleness=staleness, group_deadline=None, new_groups=new_groups,
                        on_step_end=lambda: ended.append(clock.now()), check=True)
    handlers.append(stream)
    return stream, clock, ended, taken, recorded(trace)


@pytest.mark.parametrize("over_provision", [0.5, 1.5])
def test_stream_owned_by_hand_consumes_at_step_end_and_the_last_step_drains(over_provision):
    """The StepStream as a session drives it: at a step's end the owner takes the groups (consume), bumps
    the version later (the trainer's update), then refills; the last step tops the groups in flight up to
    B and ends when every one is complete. Every launched group is consumed exactly once, whole, and
    ``groups_launched`` (the progress bar's total of ``pdsr rollout --steps``) counts them. At F = 1.5
    more than B are in flight when the last step starts: it launches none and takes them all."""
    from pdsr_sdk.dispatch.steps import groups_launched

    stream, clock, ended, taken, want = hand_stream(40, over_provision, 1)
    run = stream.run
    stream.start()
    consumed = []
    for step in range(5):
        clock.run(until=lambda: len(ended) > step)
        consumed.append(stream.consume())
        if step < 4:
            run.scheduler.policy_version += 1
            stream.refill(last=step == 3)   # the last step tops up to B and drains
    assert stream.draining and not stream.flying
    ids = [g.prompt_id for step in consumed for g in step]
    assert len(ids) == len(set(ids)) == len(taken) == groups_launched(6, over_provision, 5)
    assert len(taken) == {0.5: 9 + 3 * 6 + 3, 1.5: 15 + 3 * 6}[over_provision]
    assert [len(step) for step in consumed] == {0.5: [6] * 5, 1.5: [6] * 4 + [9]}[over_provision]
    assert {g.prompt_id: sorted(s.num_generated for s in g.samples) for step in consumed for g in step} == \
        {pid: sorted(v) for pid, v in want.items() if pid in set(ids)}
    assert max(r.max_age for r in stream.records) <= 1


@pytest.mark.parametrize("staleness,updates,hold", [(0, 2, False), (1, 1, False), (1, 2, False), (2, 1, False),
                                                    (1, 1, True), (0, 2, True)])
def test_stream_takes_version_changes_in_the_middle_of_steps(staleness, updates, hold):
    """A pipelined trainer: it trains on step k while step k + 1 generates, so its version changes come in
    the middle of a step (one or two a step), and the owner refills at once at each step's end (no change
    there). The stream restarts what a change makes too stale, counts token ages from the version at each
    step's end, and names (``blocked_by``) a change that would make a sample restarted once too stale
    again: that change waits for the step's end, which consumes its group (with more changes a step than
    S, a later one finds an earlier one's restarts). Every launched group is consumed once, whole, with its
    kept tokens (``check``), and no consumed token is older than S versions at its step's end. ``hold``
    (``hold_until``, a session's ``wait_for_update``): no step ends before the change that follows its
    predecessor's end, so each ends one version above its start, unless a change had to wait for the
    step's end (``release_hold``)."""
    stream, clock, ended, taken, want = hand_stream(48, 0.5, staleness)
    sched = stream.sched
    changes = {"mid_step": 0, "waited": 0}
    released = set()   # steps whose hold was released
    waiting = []

    def update():   # the trainer finished an update
        if waiting:               # it waits for the step's end; no further update until then
            return
        if stream.closing:        # the step ended first: the change goes in between steps
            waiting.append(True)
        elif stream.blocked_by(sched.policy_version + 1):
            changes["waited"] += 1
            waiting.append(True)
            if stream.hold_until is not None:   # else the step would wait for this change forever
                released.add(stream.t)
                stream.release_hold()
        else:
            sched.policy_version += 1
            stream.version_changed()
            changes["mid_step"] += 1

    stream.start()
    consumed, versions = [], []
    for step in range(6):
        clock.run(until=lambda: len(ended) > step)
        versions.append((stream.step_version, stream.end_version))
        consumed.append(stream.consume())
        if waiting:
            waiting.clear()
            sched.policy_version += 1
        if step < 5:
            stream.hold_until = stream.end_version + 1 if hold else None
            stream.refill(last=step == 4)
            for u in range(updates):   # a step takes 1-4 s; held, the trainer is often slower than that
                clock.call_later((2.0 if hold else 0.4) * (u + 1), update)
    assert stream.draining and not stream.flying
    ids = [g.prompt_id for step in consumed for g in step]
    assert len(ids) == len(set(ids)) == len(taken)
    assert {g.prompt_id: sorted(s.num_generated for s in g.samples) for step in consumed for g in step} == \
        {pid: sorted(v) for pid, v in want.items() if pid in set(ids)}
    # more changes a step than S: a sample restarted at one is too stale by a later one, which waits
    assert changes["mid_step"] >= 2 and (changes["waited"] > 0) == (updates > staleness), changes
    for record, (start, end) in zip(stream.records, versions):
        assert max(record.ages, default=0) <= staleness and record.max_age <= staleness
    assert any(end == start + 1 for start, end in versions)
    if hold:
        assert all(end > versions[t - 1][1] for t, (_, end) in enumerate(versions) if t and t not in released), \
            versions
    for step in consumed:
        for g in step:
            for s in g.samples:
                assert all(seg.policy_version <= sched.policy_version for seg in kept_segments(s))
    if staleness == 0:
        assert sum(r.stale_restarts for r in stream.records) > 0
    else:
        assert sum(r.partial_tokens for r in stream.records) > 0


@pytest.mark.parametrize("over_provision,told", [(0.0, None), (0.5, 1)])
def test_the_policy_hears_of_the_staleness_bound_only_where_groups_carry_over(over_provision, told):
    """With B groups in flight (F = 0) every step consumes all of them, so nothing is carried and no bound can
    bind: the policy is not told of it (v3 would otherwise keep a tail lane, whose capacity at B = 512 on the
    seed-002-like trace cost 35% of a step: 1.348x baseline's on-policy step, 0.974x without). The stream
    itself still restarts by the bound (an update in the middle of a step can age tokens at F = 0 too)."""
    stream, *_ = hand_stream(20, over_provision, 1)
    assert stream.sched.max_staleness is None and stream.sched.stream is None   # told with the groups
    stream.start()
    assert stream.sched.max_staleness == told and stream.s == 1
    # told through the dispatch API, with the groups: a description of the stream, not an attribute set from outside
    assert stream.sched.stream == StreamSpec(step_groups=6, in_flight=6 if told is None else 9, max_staleness=told)
    with pytest.raises(AttributeError):
        stream.sched.max_staleness = 2


class StreamRecording(V3Policy):
    """v3 noting, at each on_batch, what its context says of the stream."""

    seen: list = []

    def on_batch(self, groups):
        StreamRecording.seen.append((self.ctx.streaming, self.ctx.stream, self.ctx.max_staleness))
        super().on_batch(groups)


def test_a_policy_is_told_the_stream_with_its_first_groups():
    """The policy's first on_batch of a stream already sees the stream's description (DispatchContext.stream),
    and a batch run (start_batch) has none."""
    name = f"{__name__}:StreamRecording"
    StreamRecording.seen = []
    run_steps(small_trace(groups=40), small_cfg(policy=name, steps=3, over_provision=0.5, max_staleness=2), name, 0.5)
    first = StreamRecording.seen[0]
    assert first[0] and first[1] == StreamSpec(step_groups=6, in_flight=9, max_staleness=2) and first[2] == 2
    assert len(StreamRecording.seen) > 1 and all(s == first for s in StreamRecording.seen)
    StreamRecording.seen = []
    run_policy(trace_batches(small_trace(groups=12), small_cfg(policy=name, steps=None)),
               small_cfg(policy=name, steps=None), name)
    assert StreamRecording.seen and all(s == (False, None, None) for s in StreamRecording.seen)


class TrueLengthFirst(V3Policy):
    """A simulator-only reference that streams: v3 ranking its pool by each sample's recorded length."""

    simulation_only = True

    def rank_key(self, s):
        return 1, -float(s.max_tokens)


def test_a_simulator_only_policy_that_streams_runs_steps_and_only_there():
    name = f"{__name__}:TrueLengthFirst"
    trace = small_trace()
    want = recorded(trace)
    run = run_steps(trace, small_cfg(policy=name, max_staleness=1, restart_lengths="replay"), name, 0.5,
                    keep_groups=True)
    ids = [g.prompt_id for g in run.groups]
    assert len(ids) == len(set(ids)) == sum(s.groups for s in run.steps) >= 6 * 6
    assert all(s.num_generated == want[g.prompt_id][s.index] for g in run.groups for s in g.samples)
    assert run.max_age <= 1
    with pytest.raises(ConfigError, match="simulator-only reference schedule"):
        resolve_policy(name)
