"""`pdsr simulate --steps --update staggered`: at a step's end, responses whose tokens are all of the ending version
finish under it on the fewest engines (which take nothing else, then load), instead of crossing the update."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.dispatch.steps.stagger import plan_stagger
from pdsr_sdk.dispatch.types import SegmentRecord, kept_segments
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.steps import run_steps
from pdsr_sdk.traces import write_trace_jsonl
from sim_cases import recorded, small_cfg, small_trace
from version_checks import assert_one_version_at_a_time


@dataclass(eq=False)
class FakeSample:
    key: str
    num_generated: int
    versions: list[int]               # one segment of 10 tokens per version (the last one may be running)
    finished: bool = False
    turns: list | None = None
    segments: list[SegmentRecord] = field(default_factory=list)

    def __post_init__(self):
        self.segments = [SegmentRecord(pool="fast", engine="e", start_token=10 * i, num_tokens=10, policy_version=v,
                                       end_time_s=1.0) for i, v in enumerate(self.versions)]


def engine(name, slots):
    return SimpleNamespace(name=name, max_concurrency=slots)


def test_plan_keeps_only_unfinished_single_turn_samples_all_of_the_ending_version():
    e = engine("e0", 8)
    one = FakeSample("one", 20, [3, 3])
    held = [(one, e), (FakeSample("crossed", 20, [2, 3]), e), (FakeSample("old", 10, [2]), e),
            (FakeSample("done", 10, [3], finished=True), e), (FakeSample("turns", 10, [3], turns=[]), e),
            (FakeSample("empty", 0, []), e)]
    assert plan_stagger(held, 3) == {one: e}
    assert plan_stagger(held, 4) == {}
    assert plan_stagger([], 3) == {}


def test_plan_gathers_the_samples_on_the_fewest_engines_that_hold_most_of_them():
    """Seven samples over four engines of 4 slots: two engines hold them (the two holding most: a with 3, b
    with 2); those stay, and the two on c and d move to the chosen engine with the most room left."""
    a, b, c, d = (engine(n, 4) for n in "abcd")
    on = [a, b, a, c, b, a, d]
    samples = [FakeSample(f"s{i}", 10, [5]) for i in range(len(on))]
    plan = plan_stagger(list(zip(samples, on)), 5)
    assert set(plan) == set(samples)
    assert {e.name for e in plan.values()} == {"a", "b"}
    for s, e in zip(samples, on):
        if e.name in "ab":
            assert plan[s] is e   # stays where its KV is
    assert sum(e is a for e in plan.values()) == 4 and sum(e is b for e in plan.values()) == 3
    # one engine with room for all of them takes them all
    big = engine("big", 64)
    plan = plan_stagger([(s, big if i == 0 else e) for i, (s, e) in enumerate(zip(samples, on))], 5)
    assert {e.name for e in plan.values()} == {"big"}


@pytest.mark.parametrize("policy", ["baseline", "v3"])
def test_an_engine_never_runs_two_versions_at_once_and_staggered_responses_stay_whole(policy):
    """Against the same stream with every engine loading at the step's end (all): with staggered, every
    consumed sample still has exactly its recorded length and no token older than S, and no engine ever runs
    segments of two versions at the same time (an engine holds one set of weights), in either mode. Segments
    started after an update under the version before it exist only with staggered, and they make fewer
    consumed responses cross an update: the partial share falls."""
    trace = small_trace(groups=120)
    want = recorded(trace)
    runs = {}
    for update in ("all", "staggered"):
        cfg = small_cfg(policy=policy, max_staleness=2, restart_lengths="replay", kv_on_update="keep",
                        update=update)
        run = runs[update] = run_steps(trace, cfg, policy, 0.5, keep_groups=True)
        ends = [(st.end_s, st.version) for st in run.steps]
        lagged = 0
        by_step = {st.index: st for st in run.steps}
        for g in run.groups:
            end = by_step[run.consumed_at[g.prompt_id]].version
            for s in g.samples:
                assert s.finished and s.num_generated == want[g.prompt_id][s.index], s.key
                assert max(end - seg.policy_version for seg in kept_segments(s) if seg.num_tokens) <= 2
                for seg in s.segments:
                    # the version current when it started: one more for each step that had ended by then
                    current = max([v + 1 for t, v in ends if t <= seg.submit_time_s], default=0)
                    assert seg.policy_version <= current
                    lagged += seg.policy_version < current
        assert_one_version_at_a_time(s for g in run.groups for s in g.samples)
        if update == "all":
            assert lagged == 0
        else:
            assert lagged > 0
    assert runs["staggered"].partial_share < runs["all"].partial_share


def test_update_key_is_checked():
    from pdsr_sdk.rollout.config import RolloutConfig

    with pytest.raises(ValueError, match="update applies to multi-step runs only"):
        SimulateConfig(update="staggered")
    with pytest.raises(ValueError, match="update applies to multi-step runs only; set steps too, or over_provision"):
        RolloutConfig(update="staggered")
    assert RolloutConfig(update="staggered", steps=3, max_staleness=1).update == "staggered"
    for bad in ({"pipeline": True}, {"max_staleness": 0}):
        with pytest.raises(ValueError, match="update: staggered"):
            small_cfg(update="staggered", **bad)
    with pytest.raises(ValueError, match="update: staggered .* needs max_staleness unset or at least 1"):
        RolloutConfig(update="staggered", steps=3, max_staleness=0)
    with pytest.raises(ValueError, match="update"):
        small_cfg(update="later")


def test_cli_takes_update(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace_jsonl(small_trace(groups=80), trace)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, [
        "simulate", "--trace", str(trace), "--policy", "v3", "--fast", "2", "--heavy", "1", "--batch-size", "6",
        "--steps", "6", "--over-provision", "0.5", "--max-staleness", "2", "--update", "staggered",
        "--out-dir", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "staggered update" in res.output
    assert json.loads((out / "steps.json").read_text())["update"] == "staggered"
