"""Policies in `pdsr simulate --steps`: v3's placement and refresh of a stream, which policies stream, what a
policy is told of the stream, and a simulator-only reference that streams."""

from __future__ import annotations

import numpy as np
import pytest

from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.policies.resolve import resolve_policy
from pdsr_sdk.policies.v3 import V3Policy
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import run_policy, trace_batches
from pdsr_sdk.sim.engine import SimEngine
from pdsr_sdk.dispatch.types import kept_segments
from pdsr_sdk.dispatch.types import StreamSpec
from pdsr_sdk.policies.resolve import streaming_policies
from pdsr_sdk.sim.steps import run_steps
from pdsr_sdk.traces import LengthTrace, synth_trace
from sim_cases import recorded, small_cfg, small_trace, unit_cfg


@pytest.mark.parametrize("refresh", [False, True])
def test_v3_refresh_regenerates_a_carried_groups_finished_samples_under_the_new_version(refresh):
    """One token per second. g0 = [5, 12] and g1 = [8, 8] start at t=0; step 0 ends at t=8 with g1 and
    carries g0 (sample 0 finished with 5 tokens under version 0, sample 1 running: the step's end stops
    it with 8 tokens of version 0, and it goes on under version 1). With refresh, v3 regenerates sample
    0 under version 1 (5 tokens wasted): g0 completes at t=13 with 8 off-policy tokens; without it, at
    t=12 with 5 + 8."""
    trace = LengthTrace.from_matrix(np.array([[5, 12], [8, 8], [20, 20], [20, 20], [20, 20]]),
                                    prompt_ids=[f"g{i}" for i in range(5)], prompt_lens=np.full(5, 4))
    cfg = unit_cfg(policy="v3", steps=2,
                   policy_settings={"v3": {"step_end": {"refresh_ratio": 1.0 if refresh else None}}})
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
