"""``pdsr simulate --steps``'s per-step token accounting recounted from the consumed samples alone: each response's
token versions rebuilt by tests/partial_audit.py's own walk of its segments (not ``kept_segments`` or
``consumed_tokens``), against what each step's record and the run's shares say (docs/partial-rollout.md: off-policy
tokens are those older than their step's version; partial ones the older tokens of responses that crossed an update;
none older than S)."""

from __future__ import annotations

from collections import Counter

import pytest

from partial_audit import token_walk
from pdsr_sdk.sim.steps import run_steps
from pdsr_sdk.sim.steps_report import StepsReport
from sim_cases import recorded, small_cfg, small_trace


def rows_of(sample) -> dict:
    return {"prompt_id": sample.group.prompt_id, "segments": [
        {"start_token": s.start_token, "num_tokens": s.num_tokens, "policy_version": s.policy_version}
        for s in sample.segments]}


@pytest.mark.parametrize("kv,staleness,trainer", [("recompute", 2, {}), ("keep", 2, {}), ("recompute", 1, {}),
                                                  ("keep", 2, {"trainer_s": 3.0, "pipeline": True})])
def test_each_steps_tokens_ages_and_partial_tokens_recounted(kv, staleness, trainer):
    trace = small_trace()
    want = recorded(trace)
    cap = max(n for lengths in want.values() for n in lengths)
    cfg = small_cfg(policy="v3", max_staleness=staleness, kv_on_update=kv, **trainer)
    run = run_steps(trace, cfg, "v3", 0.5, keep_groups=True)
    by_step: dict[int, list] = {}
    for g in run.groups:
        by_step.setdefault(run.consumed_at[g.prompt_id], []).append(g)
    assert sorted(by_step) == list(range(6))
    all_ages: Counter[int] = Counter()
    partial_all = 0
    for k, rec in enumerate(run.steps):
        assert rec.version == k and rec.groups == len(by_step[k]) == 6   # B, each step's end one update
        ages: Counter[int] = Counter()
        partial = carried = carried_tokens = 0
        for g in by_step[k]:
            assert len(g.samples) == len(want[g.prompt_id])
            for s in g.samples:
                versions, _ = token_walk(rows_of(s))
                assert s.finished and len(versions) == s.num_generated
                # its recorded length, or after a restart a fresh draw: the cap or one of its group's lengths
                if s.restarts:
                    assert s.num_generated in set(want[g.prompt_id]) | {cap}, s.key
                else:
                    assert s.num_generated == want[g.prompt_id][s.index], s.key
                ages.update(k - v for v in versions)
                if len(set(versions)) > 1:
                    carried += 1
                    carried_tokens += len(versions)
                    partial += sum(v < k for v in versions)
        assert min(ages) >= 0 and max(ages) <= staleness, (k, ages)
        assert rec.tokens == sum(ages.values()) and rec.off_policy_tokens == rec.tokens - ages[0], k
        assert {a: n for a, n in rec.ages.items() if n} == dict(ages), k
        assert (rec.partial_tokens, rec.carried, rec.carried_tokens) == (partial, carried, carried_tokens), k
        all_ages.update(ages)
        partial_all += partial
    tokens = sum(all_ages.values())
    assert run.off_policy_share == pytest.approx((tokens - all_ages[0]) / tokens, rel=1e-12)
    assert run.partial_share == pytest.approx(partial_all / tokens, rel=1e-12) and partial_all > 0
    assert all_ages[staleness] > 0   # the bound is reached
    # some consumed sample holds a fresh draw after a staleness restart (the pipelined trainer's run restarts none)
    assert any(s.restarts for g in run.groups for s in g.samples) != bool(trainer)
    # the steady step: steps 3 to K-1 (1-based) from one step's end to the next, over the baseline's same steps
    ends = [s.end_s for s in run.steps]
    times = [ends[0] - run.steps[0].start_s] + [b - a for a, b in zip(ends, ends[1:])]
    report = StepsReport(cfg, [10.0, 11.0, 12.0, 13.0, 14.0, 100.0], [run])
    assert report.summary(run)["steady_step_s"] == pytest.approx(sum(times[2:5]) / 3, rel=1e-12)
    assert report.ratio(run) == pytest.approx(sum(times[2:5]) / 3 / 13.0, rel=1e-12)
